#!/usr/bin/env bash
# Training throughput and wall time of one job in the FLARE simulator, per site and round, from the
# `timing` every site records in its results.json (train samples/s counts every model of the method:
# P and D for PRR). Needs prrfl installed (pip install -e .).
#
#   bash benchmarks/throughput.sh <job> <sites> [cpu|gpu] [rounds] [workdir]
#
#   bash benchmarks/throughput.sh prostate_prr 5 cpu              # the prostate default on this CPU
#   bash benchmarks/throughput.sh prostate_prr_paper 5 gpu 2      # the paper's prostate setting, 5 sites on GPU 0
#   bash benchmarks/throughput.sh derm_prr_paper 4 gpu 2          # the paper's dermoscopy setting, 4 sites on GPU 0
#
# The data set is built (cached) first, with all cores, and timed apart from training.
set -euo pipefail
JOB=${1:?usage: throughput.sh <job> <sites> [cpu|gpu] [rounds] [workdir]}
SITES=${2:?usage: throughput.sh <job> <sites> [cpu|gpu] [rounds] [workdir]}
DEVICE=${3:-cpu}
ROUNDS=${4:-}
WORK=${5:-/tmp/prrfl_bench_$JOB}
export PRRFL_CACHE=${PRRFL_CACHE:-$WORK/cache} PYTHONUNBUFFERED=1
mkdir -p "$WORK"
t0=$(date +%s)
python3 -m prrfl.cli data build "$JOB" --workers "$(nproc)"
t1=$(date +%s); echo "data built in $((t1 - t0)) s"
python3 -m prrfl.cli jobs export "$JOB" --out "$WORK/jobs" ${ROUNDS:+--set num_rounds="$ROUNDS"}
GPU=()
if [ "$DEVICE" = gpu ]; then GPU=(-gpu "$(python3 -c "print(','.join(['0'] * $SITES))")"); fi
rm -rf "$WORK/ws" "$WORK/ws.state"
python3 -m nvflare.cli simulator "$WORK/jobs/$JOB" -w "$WORK/ws" -n "$SITES" -t "$SITES" "${GPU[@]}" > "$WORK/sim.log" 2>&1
echo "simulator: $(( $(date +%s) - t1 )) s wall (log: $WORK/sim.log)"
python3 - "$WORK/ws" "$JOB" <<'PY'
import json, pathlib, statistics, sys
from prrfl.registry import task_class
ws, job = pathlib.Path(sys.argv[1]), sys.argv[2]
files = sorted(ws.glob(f"site-*/prrfl/{job}/results.json"))
results = [json.loads(f.read_text()) for f in files]
metrics = task_class(results[0]["task"]).metric_names[:2]
print(f"| site | cohort | round | train samples | train samples/s (all models) | round s | " + " | ".join(f"test {m}" for m in metrics) + " |")
print("|---|---|---|---|---|---|" + "---|" * len(metrics))
for r in results:
    for h in (h for h in r["history"] if h["kind"] == "round"):
        t = h["timing"]
        print(f"| {r['site']} | {r['cohort']} | {h['round']} | {r['num_train']} | {t['train_images_per_second']:.1f} "
              f"| {t['round_seconds']:.1f} | " + " | ".join(f"{h['test'][m]:.1f}" for m in metrics) + " |")
best = [r["best"]["test"] for r in results if r["best"]]
print("mean test at each site's best validation round: " + ", ".join(f"{m} {statistics.mean(b[m] for b in best):.2f}" for m in metrics))
speeds = [h["timing"]["train_images_per_second"] for r in results for h in r["history"] if h["kind"] == "round"]
print(f"train samples/s per site (all models counted): median {statistics.median(speeds):.1f}, over the {len(results)} sites "
      f"{sum(statistics.median([h['timing']['train_images_per_second'] for h in r['history'] if h['kind'] == 'round']) for r in results):.1f}")
PY
grep -E "round [0-9]+ done" "$WORK/sim.log" || true
