#!/usr/bin/env bash
# The calibration grid on a GPU machine with a time limit: benchmarks/shift_grid.sh with one sweep per (task, shift,
# method) side by side (EACH_METHOD=1), stopped after LIMIT seconds, and what it has finished kept under <out> in the
# form of benchmarks/keep_results.py every 30 s and at the end, so that a run cut short still leaves its finished runs.
# The variables of shift_grid.sh apply (SHIFTS, TASKS, SEEDS, PROFILE, METHODS, EXTRA, WORKERS). EACH_SEED=1 runs
# one grid per seed side by side as well (in <work>/s<seed>; they share the federations' cache), so that every
# (task, shift, method, seed) runs at once.
#
#   SHIFTS="1 2 3" TASKS=derm METHODS=fedavg,fedbn,silobn WORKERS=5 LIMIT=480 bash benchmarks/gpu_shift_grid.sh <work> <out>
#   SEEDS="0 1 2" EACH_SEED=1 SHIFTS=1 TASKS=derm EXTRA="--set num_rounds=12" bash benchmarks/gpu_shift_grid.sh <work> <out>
#
# <out>/<task>_shift<s>/<method>_s<seed>.kept.json.gz then reads as docs/results/calibration/<device>/... does
# (benchmarks/calibration_table.py); only finished runs are kept.
set -u
WORK=${1:?usage: gpu_shift_grid.sh <workdir> <out>}
OUT=${2:?usage: gpu_shift_grid.sh <workdir> <out>}
LIMIT=${LIMIT:-480}
HERE=$(cd "$(dirname "$0")" && pwd)
PY=${PYTHON:-python3}
mkdir -p "$WORK" "$OUT"
keep() {
  for part in "$WORK"/*_shift*/ "$WORK"/s[0-9]*/*_shift*/; do
    [ -d "$part" ] || continue
    name=$(basename "$part")
    case $name in *.[a-z]*) name=${name%.*} ;; esac  # <task>_shift<s>.<method>: kept with its (task, shift)
    "$PY" "$HERE/keep_results.py" "$part" "$OUT/$name" > /dev/null 2>&1 || true
  done
  cp "$WORK"/*.log "$OUT"/ 2> /dev/null || true
  for grid in "$WORK"/s[0-9]*/; do  # EACH_SEED: each grid's logs beside the others'
    [ -d "$grid" ] && mkdir -p "$OUT/logs_$(basename "$grid")" && cp "$grid"*.log "$OUT/logs_$(basename "$grid")"/ 2> /dev/null
  done
  return 0
}
"$PY" -c "import torch; print('device:', torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'cpu')"
export PRRFL_CACHE=${PRRFL_CACHE:-$WORK/cache}  # one cache for every grid
if [ "${EACH_SEED:-0}" = 1 ]; then
  grids=()
  for seed in ${SEEDS:-0}; do
    SEEDS=$seed EACH_METHOD=1 PYTHON="$PY" timeout "$LIMIT" bash "$HERE/shift_grid.sh" "$WORK/s$seed" > "$WORK/grid_s$seed.log" 2>&1 &
    grids+=($!)
  done
else
  EACH_METHOD=1 PYTHON="$PY" timeout "$LIMIT" bash "$HERE/shift_grid.sh" "$WORK" &
  grids=($!)
fi
running() {
  local g
  for g in "${grids[@]}"; do kill -0 "$g" 2> /dev/null && return 0; done
  return 1
}
while running; do sleep 30; keep; done
status=0
for g in "${grids[@]}"; do
  wait "$g"
  s=$?
  [ "$s" != 0 ] && status=$s
done
keep
echo "grid ended with status $status ($([ $status = 124 ] && echo "stopped after $LIMIT s" || echo finished)) at $(date -u +%T)"
