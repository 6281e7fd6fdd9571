#!/usr/bin/env bash
# Training throughput and wall time of one job in the FLARE simulator, per site and round, from the
# `timing` every site records in its results.json (train samples/s counts every model of the method:
# P and D for PRR). Needs prrfl installed (pip install -e .).
#
#   bash benchmarks/throughput.sh <job> <sites> [cpu|gpu] [rounds] [workdir] [KEY=VALUE ...]
#
#   bash benchmarks/throughput.sh prostate_prr 5 cpu              # the prostate default on this CPU
#   bash benchmarks/throughput.sh prostate_prr_paper 5 gpu 2      # the paper's prostate setting, 5 sites on GPU 0
#   bash benchmarks/throughput.sh derm_prr_paper 4 gpu 2          # the paper's dermoscopy setting, 4 sites on GPU 0
#   bash benchmarks/throughput.sh derm_prr_paper 4 gpu 3 /tmp/w precision=bf16   # ... with a config field set
#
# KEY=VALUE: config fields set on the job (`prrfl jobs export --set`), e.g. the numerics of docs/running.md.
# The data set is built (cached) first, with all cores, and timed apart from training.
set -euo pipefail
JOB=${1:?usage: throughput.sh <job> <sites> [cpu|gpu] [rounds] [workdir]}
SITES=${2:?usage: throughput.sh <job> <sites> [cpu|gpu] [rounds] [workdir]}
DEVICE=${3:-cpu}
ROUNDS=${4:-}
WORK=${5:-/tmp/prrfl_bench_$JOB}
export PRRFL_CACHE=${PRRFL_CACHE:-$WORK/cache} PYTHONUNBUFFERED=1
mkdir -p "$WORK"
SETS=()
for setting in "${@:6}"; do SETS+=(--set "$setting"); done
t0=$(date +%s)
python3 -m prrfl.cli data build "$JOB" --workers "$(nproc)" "${SETS[@]}"
t1=$(date +%s); echo "data built in $((t1 - t0)) s"
python3 -m prrfl.cli jobs export "$JOB" --out "$WORK/jobs" ${ROUNDS:+--set num_rounds="$ROUNDS"} "${SETS[@]}"
GPU=()
if [ "$DEVICE" = gpu ]; then GPU=(-gpu "$(python3 -c "print(','.join(['0'] * $SITES))")"); fi
rm -rf "$WORK/ws" "$WORK/ws.state"
python3 -m nvflare.cli simulator "$WORK/jobs/$JOB" -w "$WORK/ws" -n "$SITES" -t "$SITES" "${GPU[@]}" > "$WORK/sim.log" 2>&1
echo "simulator: $(( $(date +%s) - t1 )) s wall (log: $WORK/sim.log)"
python3 "$(dirname "$0")/round_timing.py" "$WORK/ws"
grep -E "round [0-9]+ done" "$WORK/sim.log" || true
