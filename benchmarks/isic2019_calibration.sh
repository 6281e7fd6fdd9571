#!/usr/bin/env bash
# The Fed-ISIC2019 federation's calibration on FCA's Table 4 baselines alone (docs/calibration.md, "Fed-ISIC2019"):
# Local Learning, FedAvg and FedProx trained with balanced softmax as FCA trains every framework, and FedAvg with
# cross entropy (Table 4's loss comparison), at the bench profile, one run at a time (two cores), each kept as soon as
# it ends (benchmarks/keep_results.py) in
#   <results>/isic2019_calibration/<loss>/isic2019_shift<s>/<method>_s<seed>.kept.json.gz     (<loss>: bsm or ce)
# A run kept there already is skipped, so the plan can be stopped and started again. No method a bench judges (FCA,
# PRR, MOON, FedRS, FedLC, FedRep, FedBABU, BalanceFL, CReFF, FML, FedProto, HarmoFL, FedBN...) ever runs here:
# benchmarks/shift_grid.sh refuses them.
#
#   SHIFTS="1 2 0.5" SEEDS=0 bash benchmarks/isic2019_calibration.sh            # the screen, seed 0
#   SHIFTS=1 SEEDS="1 2" bash benchmarks/isic2019_calibration.sh                # the chosen shift's other seeds
#   RESULTS=/path/to/checkout/docs/results SWEEPS=/scratch/cal bash benchmarks/isic2019_calibration.sh
#
# `python benchmarks/fca_calibration_table.py` prints every kept run and the gaps against Table 4's.
set -uo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
cd "$repo"
shifts=${SHIFTS:-1 2 0.5}
seeds=${SEEDS:-0}
results=${RESULTS:-$repo/docs/results}
sweeps=${SWEEPS:-$repo/sweeps/isic2019_calibration}
export PRRFL_CACHE=${PRRFL_CACHE:-$sweeps/cache}
out=$results/isic2019_calibration
mkdir -p "$sweeps"
for seed in $seeds; do
  for s in $shifts; do
    for run in ce:fedavg bsm:fedavg bsm:local bsm:fedprox; do
      loss=${run%%:*} method=${run#*:}
      dst=$out/$loss/isic2019_shift$s
      if [ -f "$dst/${method}_s$seed.kept.json.gz" ]; then echo "$loss $method shift $s seed $seed: kept already"; continue; fi
      extra=""
      [ "$loss" = bsm ] && extra="--set class_loss=balanced_softmax"
      work=$sweeps/$loss.$method.shift$s.s$seed
      rm -rf "$work"
      echo "$(date -u +%T) $loss $method shift $s seed $seed"
      if SHIFTS=$s TASKS=isic2019 SEEDS=$seed PROFILE=bench METHODS=$method EXTRA="$extra" WORKERS=1 \
        bash benchmarks/shift_grid.sh "$work" > "$work.log" 2>&1; then
        mkdir -p "$dst"
        python benchmarks/keep_results.py "$work/isic2019_shift$s" "$dst" && rm -rf "$work"
        echo "$(date -u +%T) kept in $dst"
      else
        echo "$(date -u +%T) FAILED: $work.log"
      fi
    done
  done
done
