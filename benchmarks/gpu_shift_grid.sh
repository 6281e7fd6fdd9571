#!/usr/bin/env bash
# The calibration grid on a GPU machine with a time limit: benchmarks/shift_grid.sh with one sweep per (task, shift,
# method) side by side (EACH_METHOD=1), stopped after LIMIT seconds, and what it has finished kept under <out> in the
# form of benchmarks/keep_results.py every 30 s and at the end, so that a run cut short still leaves its finished runs.
# The variables of shift_grid.sh apply (SHIFTS, TASKS, SEEDS, PROFILE, METHODS, EXTRA, WORKERS).
#
#   SHIFTS="1 2 3" TASKS=derm METHODS=fedavg,fedbn,silobn WORKERS=5 LIMIT=480 bash benchmarks/gpu_shift_grid.sh <work> <out>
#
# <out>/<task>_shift<s>/<method>_s<seed> then reads as docs/results/calibration/<device>/... does
# (benchmarks/calibration_table.py); a run without its .done.json did not finish.
set -u
WORK=${1:?usage: gpu_shift_grid.sh <workdir> <out>}
OUT=${2:?usage: gpu_shift_grid.sh <workdir> <out>}
LIMIT=${LIMIT:-480}
HERE=$(cd "$(dirname "$0")" && pwd)
PY=${PYTHON:-python3}
mkdir -p "$WORK" "$OUT"
keep() {
  for part in "$WORK"/*_shift*/; do
    [ -d "$part" ] || continue
    name=$(basename "$part")
    case $name in *.[a-z]*) name=${name%.*} ;; esac  # <task>_shift<s>.<method>: kept with its (task, shift)
    "$PY" "$HERE/keep_results.py" "$part" "$OUT/$name" > /dev/null 2>&1 || true
  done
  cp "$WORK"/*.log "$OUT"/ 2> /dev/null || true
}
"$PY" -c "import torch; print('device:', torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'cpu')"
EACH_METHOD=1 PYTHON="$PY" timeout "$LIMIT" bash "$HERE/shift_grid.sh" "$WORK" &
grid=$!
while kill -0 "$grid" 2> /dev/null; do sleep 30; keep; done
wait "$grid"
status=$?
keep
echo "grid ended with status $status ($([ $status = 124 ] && echo "stopped after $LIMIT s" || echo finished)) at $(date -u +%T)"
