#!/usr/bin/env bash
# The bench plan of docs/results/bench, one (method, seed) run at a time, so that it can be spread over days
# and machines: each run is a `prrfl sweep --profile bench` of its own (4 rounds x 5 local epochs, every
# method alike; prrfl.flare.jobs.DERM_BENCH / PROSTATE_BENCH); after it finishes, its slim results
# (benchmarks/keep_results.py: results.json, crosseval.json, the .done.json marker; no models) are copied
# into docs/results/bench/<task>, and a run whose marker is there already is skipped.
#
# PLAN=core (default): for each seed, prostate PRR, FedAvg, FedBN, PRR with det_rescue=0.9 and PRR without
# each of PFA, DET and CPA (docs/results/bench/prostate_ablation), then dermoscopy PRR, FedAvg and FedBN.
# PLAN=full adds FML, FCA (dermoscopy only) and HarmoFL, and the three PRR ablations of Table IV on
# dermoscopy (docs/results/bench/derm_ablation). Seeds in order, so a partial plan is a complete comparison
# for its first seeds.
#
#   bash benchmarks/bench_sweep.sh                 # the core plan, seeds 0, 1, 2
#   SEEDS="0" PLAN=full bash benchmarks/bench_sweep.sh
#   SWEEPS=/scratch/sweeps NICE=19 bash benchmarks/bench_sweep.sh
#   RESULTS=/path/to/checkout/docs/results bash benchmarks/bench_sweep.sh   # run from a fixed worktree, keep elsewhere
#   ONLY="fedavg fedbn" bash benchmarks/bench_sweep.sh   # only these methods' runs of the plan
#   REPORTS_ONLY=1 bash benchmarks/bench_sweep.sh        # rebuild the reports from the runs kept, run nothing
#
# After each run the reports of docs/results/bench/{derm,prostate,derm_ablation}/report are rebuilt from every
# run kept so far (the ablation report: PRR's own runs beside its variants).
# A failed run is tried once more (a FLARE simulator worker can fail to start on a heavily loaded machine);
# a second failure is printed and the plan goes on, unless the run before failed too (a full disk fails
# every run in seconds): then the plan stops.
set -uo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
cd "$repo"
sweeps=${SWEEPS:-$repo/sweeps}
seeds=${SEEDS:-0 1 2}
nice=${NICE:-0}
plan=${PLAN:-core}
results=${RESULTS:-$repo/docs/results}
case "$plan" in core|full) ;; *) echo "PLAN must be core or full, got '$plan'" >&2; exit 2 ;; esac

reports() {  # each folder's report from every run kept so far (a sweep's own report covers its own runs)
  local d
  local r=$results/bench
  ls -d "$r"/derm/*_s[0-9] > /dev/null 2>&1 && prrfl report "$r"/derm/*_s[0-9] --out "$r"/derm/report > /dev/null
  ls -d "$r"/prostate/*_s[0-9] > /dev/null 2>&1 &&
    prrfl report "$r"/prostate/*_s[0-9] $(ls -d "$r"/prostate_rescue/*_s[0-9] 2> /dev/null) --out "$r"/prostate/report > /dev/null
  ls -d "$r"/prostate_ablation/*/prr_s[0-9] > /dev/null 2>&1 &&
    prrfl report "$r"/prostate/prr_s[0-9] "$r"/prostate_ablation/*/prr_s[0-9] --out "$r"/prostate_ablation/report > /dev/null
  ls -d "$r"/derm_ablation/*/prr_s[0-9] > /dev/null 2>&1 &&
    prrfl report "$r"/derm/prr_s[0-9] "$r"/derm_ablation/*/prr_s[0-9] --out "$r"/derm_ablation/report > /dev/null
}

run() {  # task seed method folder [--set KEY=VALUE ...]
  local task=$1 seed=$2 method=$3 folder=$4
  shift 4
  local sites=4 ws=$sweeps/$folder dst=$results/$folder
  [ "$task" = prostate ] && sites=5
  local name=${method}_s$seed
  if [ -n "${ONLY:-}" ] && [[ " $ONLY " != *" $method "* ]]; then return 0; fi
  if [ -f "$dst/$name.done.json" ]; then echo "$folder $name: kept already, skipped"; return 0; fi
  mkdir -p "$dst" "$ws"
  python benchmarks/keep_results.py "$dst" "$ws" > /dev/null  # the finished runs, so the report covers them
  for attempt in 1 2; do
    echo "$(date +%T) $folder ${method}_s$seed: attempt $attempt"
    if nice -n "$nice" prrfl sweep --task "$task" --sites "$sites" --profile bench --methods "$method" --seeds "$seed" --workspace "$ws" "$@"; then
      python benchmarks/keep_results.py "$ws" "$dst"
      reports
      echo "$(date +%T) $folder ${method}_s$seed: kept in $dst"
      failed_in_a_row=0
      return 0
    fi
  done
  echo "$(date +%T) $folder ${method}_s$seed: FAILED twice; see $ws/${method}_s$seed.log"
  failed_in_a_row=$((failed_in_a_row + 1))
  if [ "$failed_in_a_row" -ge 2 ]; then  # two runs in a row: the machine (disk, memory), not one run
    echo "$(date +%T) two runs in a row failed twice: the plan stops here (check the machine, then start it again)"
    exit 1
  fi
}
failed_in_a_row=0
if [ "${REPORTS_ONLY:-0}" = 1 ]; then reports; echo "reports rebuilt under $results/bench"; exit 0; fi

for seed in $seeds; do
  for method in prr fedavg fedbn; do run prostate "$seed" "$method" bench/prostate; done
  run prostate "$seed" prr bench/prostate_rescue --set method_args.det_rescue=0.9
  # which of PRR's parts costs the small sites: PRR without PFA, without DET, without CPA (Table IV's switches)
  run prostate "$seed" prr bench/prostate_ablation/no_pfa --set method_args.pfa_enabled=false
  run prostate "$seed" prr bench/prostate_ablation/no_det --set method_args.det_enabled=false
  run prostate "$seed" prr bench/prostate_ablation/no_cpa --set method_args.cpa_global=false --set method_args.cpa_local=false
  for method in prr fedavg fedbn; do run derm "$seed" "$method" bench/derm; done
  if [ "$plan" = full ]; then
    for method in fml harmofl; do run prostate "$seed" "$method" bench/prostate; done
    for method in fml fca harmofl; do run derm "$seed" "$method" bench/derm; done
    run derm "$seed" prr bench/derm_ablation/no_pfa --set method_args.pfa_enabled=false
    run derm "$seed" prr bench/derm_ablation/no_det --set method_args.det_enabled=false
    run derm "$seed" prr bench/derm_ablation/no_cpa --set method_args.cpa_global=false --set method_args.cpa_local=false
  fi
done
echo "$(date +%T) bench plan done"
