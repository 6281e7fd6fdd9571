#!/usr/bin/env bash
# The bench plan of docs/results, one (method, seed) run at a time, so that it can be spread over days
# and machines: each run is a `prrfl sweep --profile bench` of its own; after it finishes, its slim results
# (benchmarks/keep_results.py: results.json, crosseval.json, the .done.json marker; no models) are copied
# into docs/results/<folder>, and a run whose marker is there already is skipped. Order: for each seed, the
# six dermoscopy methods, the three PRR ablations (Table IV), then the five prostate methods, so that a
# partial plan is a complete comparison for its first seeds. Seed 0 also runs PRR and FedAvg on both tasks
# with the same 20 epochs in 4 rounds of 5 (folders *_bench_e5): with the profile's 2 epochs per round
# DET never reaches its Sublimate phase.
#
#   bash benchmarks/bench_sweep.sh                 # everything (42 bench runs, 8.4 h of simulator time on a 2-core machine, and the 4 rounds-of-5 runs)
#   SEEDS="0" bash benchmarks/bench_sweep.sh       # one seed
#   SWEEPS=/scratch/sweeps NICE=19 bash benchmarks/bench_sweep.sh
#
# After each run the reports of docs/results/{derm_bench,prostate_bench,derm_ablation}/report are rebuilt
# from every run kept so far (the ablation report: PRR's own runs beside its variants).
# A failed run is tried once more (a FLARE simulator worker can fail to start on a heavily loaded machine);
# a second failure is printed and the plan goes on, unless the run before failed too (a full disk fails
# every run in seconds): then the plan stops.
set -uo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
cd "$repo"
sweeps=${SWEEPS:-$repo/sweeps}
seeds=${SEEDS:-0 1 2}
nice=${NICE:-0}

reports() {  # each folder's report from every run kept so far (a sweep's own report covers its own runs)
  local d
  for d in derm_bench prostate_bench derm_bench_e5 prostate_bench_e5; do
    ls -d docs/results/$d/*_s[0-9] > /dev/null 2>&1 && prrfl report docs/results/$d/*_s[0-9] --out docs/results/$d/report > /dev/null
  done
  ls -d docs/results/derm_ablation/*/prr_s[0-9] > /dev/null 2>&1 &&
    prrfl report docs/results/derm_bench/prr_s[0-9] docs/results/derm_ablation/*/prr_s[0-9] --out docs/results/derm_ablation/report > /dev/null
}

run() {  # task seed method folder [--set KEY=VALUE ...]
  local task=$1 seed=$2 method=$3 folder=$4
  shift 4
  local sites=4 ws=$sweeps/$folder dst=docs/results/$folder
  [ "$task" = prostate ] && sites=5
  if [ -f "$dst/${method}_s${seed}.done.json" ]; then echo "$folder ${method}_s$seed: kept already, skipped"; return 0; fi
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

for seed in $seeds; do
  for method in prr fedavg fedbn fml fca harmofl; do run derm "$seed" "$method" derm_bench; done
  if [ "$seed" = 0 ]; then  # the same 20 epochs in rounds of 5, where DET can reach Sublimate (a round's 3rd epoch on)
    for method in prr fedavg; do
      run derm 0 "$method" derm_bench_e5 --set local_epochs=5 --set num_rounds=4
      run prostate 0 "$method" prostate_bench_e5 --set local_epochs=5 --set num_rounds=4
    done
  fi
  run derm "$seed" prr derm_ablation/no_pfa --set method_args.pfa_enabled=false
  run derm "$seed" prr derm_ablation/no_det --set method_args.det_enabled=false
  run derm "$seed" prr derm_ablation/no_cpa --set method_args.cpa_global=false --set method_args.cpa_local=false
  for method in prr fedavg fedbn fml harmofl; do run prostate "$seed" "$method" prostate_bench; done
done
echo "$(date +%T) bench plan done"
