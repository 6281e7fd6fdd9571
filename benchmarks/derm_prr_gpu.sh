#!/usr/bin/env bash
# Throughput and wall time of derm_prr_paper on CUDA: full Table I sizes, 128 px, E = 5,
# ROUNDS rounds (default 2), 4 sites sharing GPU 0. Needs prrfl installed (pip install -e .).
#   bash benchmarks/derm_prr_gpu.sh [workdir]
set -euo pipefail
ROUNDS=${ROUNDS:-2}
WORK=${1:-/tmp/prrfl_bench}
export PRRFL_CACHE=${PRRFL_CACHE:-$WORK/cache} PYTHONUNBUFFERED=1
mkdir -p "$WORK"
t0=$(date +%s)
python3 -m prrfl.cli data build derm_prr_paper --workers "$(nproc)"
t1=$(date +%s); echo "federation built in $((t1 - t0)) s"
python3 -m prrfl.cli jobs export derm_prr_paper --out "$WORK/jobs" --set num_rounds="$ROUNDS"
rm -rf "$WORK/ws"
python3 -m nvflare.cli simulator "$WORK/jobs/derm_prr_paper" -w "$WORK/ws" -n 4 -t 4 -gpu 0,0,0,0 > "$WORK/sim.log" 2>&1
echo "simulator: $(( $(date +%s) - t1 )) s (log: $WORK/sim.log)"
python3 - "$WORK/ws" <<'PY'
import json, pathlib, sys
print("| site | cohort | round | train images | train img/s (P+D) | round s | test F1 | test AUC |")
print("|---|---|---|---|---|---|---|---|")
for f in sorted(pathlib.Path(sys.argv[1]).glob("site-*/prrfl/derm_prr_paper/results.json")):
    r = json.loads(f.read_text())
    for h in (h for h in r["history"] if h["kind"] == "round"):
        t = h["timing"]
        print(f"| {r['site']} | {r['cohort']} | {h['round']} | {r['num_train']} | {t['train_images_per_second']:.0f} "
              f"| {t['round_seconds']:.1f} | {h['test']['f1']:.1f} | {h['test']['auc']:.1f} |")
PY
grep -E "round .* done" "$WORK/sim.log" || true
