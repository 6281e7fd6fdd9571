#!/usr/bin/env bash
# The numerics options of the run config (precision, channels_last, torch_compile; docs/running.md, "Faster
# numerics on a GPU") on one GPU, each beside float32. Needs prrfl installed (pip install -e .) and a CUDA device.
#
#   bash benchmarks/gpu_throughput.sh speed [workdir] [rounds]
#   bash benchmarks/gpu_throughput.sh seeds [workdir] [profile] [KEY=VALUE ...]
#   bash benchmarks/gpu_throughput.sh quick [workdir]
#
# speed: training images/s. First one site's bare PyTorch loop beside the site loop (FedAvg, PRR) under each
#   numerics (benchmarks/site_throughput.py, its last lines a table with the speed-up over float32); then the
#   paper profile's dermoscopy job, derm_prr_paper (PRR, 4 sites, full Table I sizes, 128 px, E = 5), for `rounds`
#   rounds (default 3: a compiled run's first round also compiles, and the per-site median is then a later
#   round's), the 4 sites on GPU 0, once per numerics: float32, bf16, channels_last, compile, and all three. Each
#   run's per-site, per-round table (benchmarks/round_timing.py); its last line gives the training images/s over
#   the 4 sites.
# seeds: the effect on the metrics: `prrfl sweep` of PRR (METHODS to change, e.g. METHODS=prr,fedavg) at seeds
#   0, 1, 2 under `profile` (default bench: 12 rounds x 5 epochs; paper: the papers' 50 rounds, about 30 min a run
#   on one GPU) in float32 and with the settings given (default precision=bf16), then one report of both
#   (<workdir>/seeds/report/report.md: the runs with other numerics are labelled apart, e.g. prr[precision="bf16"],
#   and Table II's paired tests compare them with float32 PRR).
# quick: what fits in about 9 minutes of a GPU: the GPU tests (tests/test_gpu.py: no training batch waits for the
#   device), one site's bare loop beside the site loop in float32 and bf16 + channels_last, the 4-site paper job
#   for 2 rounds in each of the two, then compile's figures for one site in the time left (QUICK_SECONDS, default 570).
set -euo pipefail
MODE=${1:?usage: gpu_throughput.sh speed [workdir] [rounds] | seeds [workdir] [profile] [KEY=VALUE ...] | quick [workdir]}
WORK=${2:-/tmp/prrfl_gpu_throughput}
HERE=$(dirname "$0")
export PRRFL_CACHE=${PRRFL_CACHE:-$WORK/cache} PYTHONUNBUFFERED=1
mkdir -p "$WORK"
python3 -c "import torch; assert torch.cuda.is_available(), 'no CUDA device'; print(torch.cuda.get_device_name(0))"
case "$MODE" in
speed)
  ROUNDS=${3:-3}
  python3 -m prrfl.cli data build derm_prr_paper --workers "$(nproc)"
  python3 "$HERE/site_throughput.py" derm_prr_paper --device cuda --epochs 3 \
    --numerics float32,bf16,channels_last,compile,bf16+channels_last+compile | tee "$WORK/site_throughput.md"
  for numerics in "" precision=bf16 channels_last=true torch_compile=true "precision=bf16 channels_last=true torch_compile=true"; do
    name=$(echo "${numerics:-float32}" | tr ' =' '__')
    echo "== derm_prr_paper, 4 sites on GPU 0, ${numerics:-float32}"
    # shellcheck disable=SC2086 # the settings are words
    bash "$HERE/throughput.sh" derm_prr_paper 4 gpu "$ROUNDS" "$WORK/$name" $numerics | tee "$WORK/$name.md"
  done
  ;;
quick)
  start=$(date +%s)
  left() { echo $((${QUICK_SECONDS:-570} - ($(date +%s) - start))); }
  timeout 120 python3 -m pytest -q -p no:cacheprovider tests/test_gpu.py || true
  t0=$(date +%s)
  # the synthetic JPEGs drawn at 200 x 150 instead of 600 x 450: the same 128 px inputs to train on, built in a
  # tenth of the time (the paper profile's build, about 2,300 CPU-seconds, outlasts a short GPU lease)
  raw=data.synthetic_raw_size=[200,150]
  python3 -m prrfl.cli data build derm_prr_paper --workers "$(nproc)" --set "$raw"
  echo "data built in $(($(date +%s) - t0)) s"
  timeout 150 python3 "$HERE/site_throughput.py" derm_prr_paper --device cuda --epochs 2 --set "$raw" --numerics float32,bf16+channels_last || true
  for numerics in "" "precision=bf16 channels_last=true"; do
    name=$(echo "${numerics:-float32}" | tr ' =' '__')
    echo "== derm_prr_paper, 4 sites on GPU 0, 2 rounds, ${numerics:-float32}"
    # shellcheck disable=SC2086 # the settings are words
    timeout 160 bash "$HERE/throughput.sh" derm_prr_paper 4 gpu 2 "$WORK/$name" "$raw" $numerics || true
    pkill -f "nvflare.cli simulator" || true  # a run stopped by the timeout leaves its workers: they would share the GPU
    pkill -f simulator_worker || true
  done
  [ "$(left)" -gt 30 ] && timeout "$(left)" python3 "$HERE/site_throughput.py" derm_prr_paper --device cuda --epochs 2 \
    --methods fedavg --set "$raw" --numerics compile,bf16+channels_last+compile || true
  ;;
seeds)
  PROFILE=${3:-bench}
  SETTINGS=("${@:4}")
  [ ${#SETTINGS[@]} -gt 0 ] || SETTINGS=(precision=bf16)
  name=$(echo "${SETTINGS[*]}" | tr ' =' '__')
  SETS=()
  for setting in "${SETTINGS[@]}"; do SETS+=(--set "$setting"); done
  python3 -m prrfl.cli data build derm_prr --profile "$PROFILE" --workers "$(nproc)"
  for variant in float32 "$name"; do
    extra=()
    [ "$variant" = float32 ] || extra=("${SETS[@]}")
    python3 -m prrfl.cli sweep --task derm --profile "$PROFILE" --methods "${METHODS:-prr}" --seeds 0,1,2 --sites 4 \
      --workspace "$WORK/seeds/$variant" "${extra[@]}"
  done
  python3 -m prrfl.cli report "$WORK/seeds/float32" "$WORK/seeds/$name" --out "$WORK/seeds/report" --task derm
  ;;
*)
  echo "usage: gpu_throughput.sh speed [workdir] [rounds] | seeds [workdir] [profile] [KEY=VALUE ...] | quick [workdir]" >&2
  exit 2
  ;;
esac
