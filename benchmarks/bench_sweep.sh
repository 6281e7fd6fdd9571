#!/usr/bin/env bash
# The bench, one (method, seed) run at a time, so that it can be spread over days and machines: each run is a
# `prrfl sweep --profile bench` of its own (5 local epochs a round, 12 rounds on dermoscopy and 6 on prostate, every
# method alike; the BENCH profiles of prrfl.tasks.derm.task and prrfl.tasks.prostate.task); after it finishes, its slim results
# (benchmarks/keep_results.py: one <run>.kept.json.gz with its results.json, crosseval.json and done marker; no models)
# are kept in docs/results/<plan folder>/<task>, and a run kept there already is skipped.
#
# PLAN=heldout (default; docs/results/heldout): the held-out bench on the calibrated federations (docs/calibration.md),
# at each task's default data: every method of TMI Tables II and III (FedAvg, FedProx, SiloBN, IDA, FedBN, FedProto,
# FML, PRR) plus FCA (dermoscopy) and HarmoFL, and the three PRR ablations of Table IV on dermoscopy
# (heldout/derm_ablation); and on Fed-ISIC2019 (TASKS=isic2019, heldout/isic2019) FCA's Table 4: every framework
# trained with balanced softmax as FCA trains them (heldout/isic2019/bsm: Local, FedAvg, FedProx, MOON, CReFF,
# FedRep, FedBABU, and PRR, FML, FedProto, FedBN, HarmoFL), and with its own loss where that loss is its rule
# (heldout/isic2019/own: FCA, FedLC, FedRS, BalanceFL's class-balanced batches, PRR with its CPA as the paper
# specifies it, FedAvg with cross entropy). The five baselines' runs of the calibration are this bench's runs of them: a baseline run
# kept in docs/results/calibration/bench/cpu/<task>_shift<default>/ is read from there, not run again (CALIBRATION
# names another folder of that layout, e.g. a GPU's); on isic2019 the runs of Table 4's baselines kept by
# benchmarks/isic2019_calibration.sh (docs/results/isic2019_calibration/<loss>/isic2019_shift<default>/). A kept run counts only when it ran with the config the run
# would have now (benchmarks/kept_run_matches.py: the schedule, the data, the method's options); otherwise it runs.
# PLAN=core / PLAN=full (docs/results/bench): the bench made on the federations before the calibration (prostate
# shift 1, its FedAvg and FedBN scored after their local epochs). Its runs record the commit they ran with
# (`code_commit`); these plans only rebuild its reports now (REPORTS_ONLY=1): to re-make a run, check out its commit.
# Seeds in order, so a partial plan is a complete comparison for its first seeds.
#
#   bash benchmarks/bench_sweep.sh                       # the held-out bench, seeds 0, 1, 2
#   SEEDS="0" bash benchmarks/bench_sweep.sh
#   TASKS=derm bash benchmarks/bench_sweep.sh            # one task of the plan (default: prostate and derm)
#   SWEEPS=/scratch/sweeps NICE=19 bash benchmarks/bench_sweep.sh
#   RESULTS=/path/to/checkout/docs/results bash benchmarks/bench_sweep.sh   # run from a fixed worktree, keep elsewhere
#   ONLY="prr fml" bash benchmarks/bench_sweep.sh        # only these methods' runs of the plan
#   ONLY=prr ABLATIONS=0 bash benchmarks/bench_sweep.sh  # PRR's own runs, not Table IV's ablations
#   REPORTS_ONLY=1 bash benchmarks/bench_sweep.sh        # rebuild the reports from the runs kept, run nothing
#   PARALLEL=12 bash benchmarks/bench_sweep.sh           # 12 runs side by side (a GPU machine); reports at the end
#   PLAN=core REPORTS_ONLY=1 bash benchmarks/bench_sweep.sh
#
# After each run the reports of the plan's folders are rebuilt from every run kept so far (an ablation report: PRR's
# own runs beside its variants).
# A failed run is tried once more (a FLARE simulator worker can fail to start on a heavily loaded machine);
# a second failure is printed and the plan goes on, unless the run before failed too (a full disk fails
# every run in seconds): then the plan stops.
set -uo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
cd "$repo"
sweeps=${SWEEPS:-$repo/sweeps}
seeds=${SEEDS:-0 1 2}
nice=${NICE:-0}
parallel=${PARALLEL:-1}  # runs side by side (a GPU machine): each in a workspace of its own, the reports at the end
plan=${PLAN:-heldout}
results=${RESULTS:-$repo/docs/results}
calibration=${CALIBRATION:-$results/calibration/bench/cpu}  # the calibration's runs at the bench's schedule
tasks=${TASKS:-prostate derm}  # calibrated (docs/calibration.md); isic2019 too, when named
ablations=${ABLATIONS:-1}  # 0: leave out Table IV's PRR ablations (dermoscopy)
case "$plan" in
  heldout) plan_folder=heldout ;;
  core | full) plan_folder=bench ;;
  *) echo "PLAN must be heldout, core or full, got '$plan'" >&2; exit 2 ;;
esac
if [ "$plan_folder" = bench ] && [ "${REPORTS_ONLY:-0}" != 1 ]; then
  echo "PLAN=$plan is the bench made before the calibration: it only rebuilds its reports (REPORTS_ONLY=1)" >&2
  exit 2
fi

kept=.kept.json.gz  # a kept run: <run>.kept.json.gz (benchmarks/keep_results.py), finished runs only
reports() {  # each report of the plan's folders from every run kept so far: benchmarks/results_reports.py's list
  local names=() task
  if [ "$plan_folder" = heldout ]; then
    for task in $tasks; do
      names+=("heldout/$task/report")
      [ "$task" = derm ] && names+=(heldout/derm_ablation/report)
    done
  else
    names=(bench)
  fi
  python "$repo/benchmarks/results_reports.py" --results "$results" "${names[@]}" > /dev/null
}

fca_calibration() {  # the isic2019 calibration's folder of a loss (bsm, ce)
  echo "$results/isic2019_calibration/$1/isic2019_shift$(default_shift isic2019)"
}

declare -A shifts=()
default_shift() {  # a task's default data.synthetic_shift, as its calibration folder names it (read once per task)
  [ -n "${shifts[$1]:-}" ] ||
    shifts[$1]=$(python -c "from prrfl.tasks.${1}.task import DEFAULT_DATA; print(f\"{DEFAULT_DATA['synthetic_shift']:g}\")")
  echo "${shifts[$1]}"
}

attempts() {  # task sites seed method folder workspace destination [--set KEY=VALUE ...]: the run, tried twice
  local task=$1 sites=$2 seed=$3 method=$4 folder=$5 ws=$6 dst=$7 attempt
  shift 7
  for attempt in 1 2; do
    echo "$(date +%T) $folder ${method}_s$seed: attempt $attempt"
    if nice -n "$nice" prrfl sweep --task "$task" --sites "$sites" --profile bench --methods "$method" --seeds "$seed" --workspace "$ws" "$@"; then
      python benchmarks/keep_results.py "$ws" "$dst"  # finished runs only: a failed run's partial results stay behind
      echo "$(date +%T) $folder ${method}_s$seed: kept in $dst"
      return 0
    fi
  done
  echo "$(date +%T) $folder ${method}_s$seed: FAILED twice; see $ws/${method}_s$seed.log"
  return 1
}

run() {  # task seed method folder [--set KEY=VALUE ...]
  local task=$1 seed=$2 method=$3 folder=$4
  shift 4
  local sites=4 ws=$sweeps/$folder dst=$results/$folder
  [ "$task" = prostate ] && sites=5
  [ "$task" = isic2019 ] && sites=6
  local name=${method}_s$seed
  if [ -n "${ONLY:-}" ] && [[ " $ONLY " != *" $method "* ]]; then return 0; fi
  local settings=() arg
  for arg in "$@"; do [ "$arg" != --set ] && settings+=("$arg"); done
  if [ -f "$dst/$name$kept" ] && python benchmarks/kept_run_matches.py "$dst/$name$kept" "$task" "$method" "$seed" "${settings[@]}"; then
    echo "$folder $name: kept already, skipped"
    return 0
  fi
  local cal=""  # a baseline's calibration run at the task's default shift counts as its bench run
  [[ " $baselines " == *" $method "* ]] && cal=$calibration/${task}_shift$(default_shift "$task")
  if [ "$task" = isic2019 ]; then  # Table 4's baselines: the calibration's runs with the same loss
    cal=""
    case "$folder:$method" in
      */bsm:local | */bsm:fedavg | */bsm:fedprox) cal=$(fca_calibration bsm) ;;
      */own:fedavg) cal=$(fca_calibration ce) ;;
    esac
  fi
  if [ -n "$cal" ] && [ -f "$cal/$name$kept" ] &&
    python benchmarks/kept_run_matches.py "$cal/$name$kept" "$task" "$method" "$seed" "${settings[@]}"; then
    echo "$folder $name: kept by the calibration, skipped"
    return 0
  fi
  if [ "$parallel" -gt 1 ]; then  # a workspace of its own, so that a keep copies this run alone; reports at the end
    while [ "$(jobs -rp | wc -l)" -ge "$parallel" ]; do wait -n; done
    mkdir -p "$dst" "$ws/$name"
    attempts "$task" "$sites" "$seed" "$method" "$folder" "$ws/$name" "$dst" "$@" > "$ws/$name.plan.log" 2>&1 &
    return 0
  fi
  mkdir -p "$dst" "$ws"
  python benchmarks/keep_results.py --unpack "$dst" "$ws" > /dev/null  # the finished runs, so the report covers them
  if attempts "$task" "$sites" "$seed" "$method" "$folder" "$ws" "$dst" "$@"; then
    reports
    failed_in_a_row=0
    return 0
  fi
  failed_in_a_row=$((failed_in_a_row + 1))
  if [ "$failed_in_a_row" -ge 2 ]; then  # two runs in a row: the machine (disk, memory), not one run
    echo "$(date +%T) two runs in a row failed twice: the plan stops here (check the machine, then start it again)"
    exit 1
  fi
}
failed_in_a_row=0
if [ "${REPORTS_ONLY:-0}" = 1 ]; then reports; echo "reports rebuilt under $results/$plan_folder"; exit 0; fi

baselines="fedavg fedprox silobn ida fedbn"  # calibrated on (docs/calibration.md): their calibration runs count
for task in $tasks; do default_shift "$task" > /dev/null; done  # read here: a command substitution's subshell would forget it
for seed in $seeds; do
  for task in $tasks; do
    if [ "$task" = isic2019 ]; then  # FCA's Table 4: the methods FCA compares, PRR, and TMI's methods
      for method in fca prr fedrs fedlc balancefl fedavg; do run isic2019 "$seed" "$method" heldout/isic2019/own; done
      for method in prr moon creff fedrep fedbabu fml fedproto fedbn harmofl local fedavg fedprox; do
        run isic2019 "$seed" "$method" heldout/isic2019/bsm --set class_loss=balanced_softmax
      done
      continue
    fi
    methods="$baselines fedproto fml prr harmofl"
    [ "$task" = derm ] && methods="$methods fca"
    for method in $methods; do run "$task" "$seed" "$method" heldout/$task; done
  done
  [[ " $tasks " == *" derm "* ]] && [ "$ablations" = 1 ] || continue
  run derm "$seed" prr heldout/derm_ablation/no_pfa --set method_args.pfa_enabled=false
  run derm "$seed" prr heldout/derm_ablation/no_det --set method_args.det_enabled=false
  run derm "$seed" prr heldout/derm_ablation/no_cpa --set method_args.cpa_global=false --set method_args.cpa_local=false
done
if [ "$parallel" -gt 1 ]; then
  wait
  reports
fi
echo "$(date +%T) bench plan done"
