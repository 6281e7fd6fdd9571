#!/usr/bin/env bash
# Calibration runs of the synthetic federations' site shift (`data.synthetic_shift`): the papers' baselines only
# (derm and prostate: FedAvg, FedBN, SiloBN, FedProx, IDA, TMI's; isic2019: Local, FedAvg, FedProx, FCA's Table 4
# baselines; never PRR or another method a bench judges), one `prrfl sweep` per
# (task, shift), all of them side by side, each running its methods one after the other. Each federation is built
# first (all of them at once, WORKERS processes each). Every run keeps its results.json with the settings it ran under.
#
#   SHIFTS="1 2 3" TASKS="derm prostate" SEEDS=0 PROFILE=bench bash benchmarks/shift_grid.sh <workdir>
#
# METHODS (default: every baseline of the task; a method outside them is refused) and EXTRA (more `--set KEY=VALUE` for every run, e.g.
# "--set num_rounds=1"; "--set class_loss=balanced_softmax", FCA's loss) may be set too. EACH_METHOD=1 runs one sweep per (task, shift, method), all side by side
# (a machine with many cores and a GPU), each in <workdir>/<task>_shift<s>.<method> until it ends, then moved in
# beside the others. WORKERS (default 2): processes per federation build. `prrfl report <workdir>/<task>_shift<s>/*_s[0-9]` tables each (task, shift).
set -euo pipefail
WORK=${1:?usage: shift_grid.sh <workdir>}
SHIFTS=${SHIFTS:-1 2 3}
TASKS=${TASKS:-derm prostate}
SEEDS=${SEEDS:-0}
PROFILE=${PROFILE:-bench}
METHODS=${METHODS:-}
EXTRA=${EXTRA:-}
PY=${PYTHON:-python3}
mkdir -p "$WORK"
export PYTHONUNBUFFERED=1 PRRFL_CACHE=${PRRFL_CACHE:-$WORK/cache}
baselines() {  # the baselines a task's calibration may run: the methods its paper's table compares against
  case "$1" in
    isic2019) echo "local,fedavg,fedprox" ;;
    *) echo "fedavg,fedbn,silobn,fedprox,ida" ;;
  esac
}
for task in $TASKS; do
  for m in ${METHODS//,/ }; do
    case ",$(baselines "$task")," in *",$m,"*) ;; *) echo "shift_grid.sh calibrates $task on its baselines only ($(baselines "$task")), not $m" >&2; exit 2 ;; esac
  done
done
pids=()
for task in $TASKS; do
  for s in $SHIFTS; do
    $PY -m prrfl.cli data build "${task}_fedavg" --profile "$PROFILE" --set data.synthetic_shift="$s" $EXTRA --workers "${WORKERS:-2}" \
      > "$WORK/build_${task}_shift$s.log" 2>&1 &
    pids+=($!)
  done
done
for p in "${pids[@]}"; do wait "$p"; done
echo "federations built: $(date -u +%T)"
pids=()
for task in $TASKS; do
  sites=$($PY -c "from prrfl.registry import task_class; print(len(task_class('$task').site_names))")
  methods=${METHODS:-$(baselines "$task")}
  for s in $SHIFTS; do
    if [ "${EACH_METHOD:-0}" = 1 ]; then groups=${methods//,/ }; else groups=$methods; fi
    for m in $groups; do
      tag=$([ "$m" = "$methods" ] && echo "" || echo ".$m")
      $PY -m prrfl.cli sweep --task "$task" --profile "$PROFILE" --methods "$m" --seeds "$SEEDS" --sites "$sites" \
        --workspace "$WORK/${task}_shift$s$tag" --set data.synthetic_shift="$s" $EXTRA > "$WORK/sweep_${task}_shift$s$tag.log" 2>&1 &
      pids+=($!)
    done
  done
done
status=0
for p in "${pids[@]}"; do wait "$p" || status=1; done
for part in "$WORK"/*_shift*.[a-z]*/; do  # EACH_METHOD: every method's runs beside the others of its (task, shift)
  [ -d "$part" ] || continue
  whole=${part%/}; whole=${whole%.*}
  mkdir -p "$whole" && find "$part" -mindepth 1 -maxdepth 1 -name '*_s[0-9]*' -exec mv -t "$whole" {} + && rm -rf "$part"
done
echo "sweeps done: $(date -u +%T) (status $status)"
exit $status
