#!/usr/bin/env bash
# The papers' jobs on one GPU: PRR, FedAvg and FedBN, one seed, dermoscopy (4 sites, 128 px, full
# Table I sizes, 50 rounds x 5 epochs) and prostate (5 sites, 256 px, DeepLab-v2 width 64, 12 rounds x
# 5 epochs, lr halved every 25 epochs), with per-site, per-round timing. Needs prrfl installed
# (pip install -e .) and a CUDA device (every site of the simulator uses cuda:0 when there is one).
#
#   bash benchmarks/gpu_paper.sh [workdir] [rounds]
#
# `rounds` shortens every job (e.g. 2 for a timing-only check); left out, the papers' schedules run.
# Each task's synthetic federation is built first with all cores and timed apart from training.
# Output: <workdir>/<task>/report/report.md (Table II / III, curves, retrogress) and, per run, the
# round timing table of benchmarks/round_timing.py.
set -euo pipefail
WORK=${1:-/tmp/prrfl_gpu_paper}
ROUNDS=${2:-}
export PRRFL_CACHE=${PRRFL_CACHE:-$WORK/cache} PYTHONUNBUFFERED=1
mkdir -p "$WORK"
python3 -c "import torch; assert torch.cuda.is_available(), 'no CUDA device'; print(torch.cuda.get_device_name(0))"
for spec in derm:4 prostate:5; do
  task=${spec%%:*} sites=${spec##*:}
  t0=$(date +%s)
  python3 -m prrfl.cli data build "${task}_prr" --profile paper --workers "$(nproc)"
  t1=$(date +%s); echo "$task: data built in $((t1 - t0)) s"
  python3 -m prrfl.cli sweep --task "$task" --profile paper --methods prr,fedavg,fedbn --seeds 0 --sites "$sites" \
    --workspace "$WORK/$task" ${ROUNDS:+--set num_rounds="$ROUNDS"}
  echo "$task: 3 runs in $(( $(date +%s) - t1 )) s wall"
  python3 "$(dirname "$0")/round_timing.py" "$WORK/$task" | tee "$WORK/$task/round_timing.md"
done
