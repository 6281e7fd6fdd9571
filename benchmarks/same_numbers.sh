#!/usr/bin/env bash
# Same seed, same numbers: runs a committed job (default jobs/derm_prr: 4 sites, 5 rounds x 2 epochs,
# 64 px synthetic federation) in the FLARE simulator with the code of a git revision and with the working
# tree, on this machine, and compares every site's history (per-round valid/test and per-epoch test
# metrics; wall-clock timings left out) value by value; a record field that only the working tree writes is
# named, not compared. Use it to show a refactor changed no number.
#
#   bash benchmarks/same_numbers.sh <revision> [job] [sites]
#   e.g. bash benchmarks/same_numbers.sh HEAD~1
#
# Prints each run's wall time and, per site, "identical" or "DIFFERENT"; exits 1 when any site differs.
set -euo pipefail
rev=${1:?usage: same_numbers.sh <revision> [job] [sites]}
job=${2:-derm_prr}
sites=${3:-4}
repo=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d)
trap 'git -C "$repo" worktree remove --force "$work/src" >/dev/null 2>&1 || true; rm -rf "$work"' EXIT
git -C "$repo" worktree add --detach -q "$work/src" "$rev"
export PRRFL_CACHE=${PRRFL_CACHE:-$work/cache}   # one synthetic federation for both runs
for side in before after; do
  src=$([ "$side" = before ] && echo "$work/src" || echo "$repo")
  start=$(date +%s)
  (cd "$work" && PYTHONPATH="$src/custom" python -m nvflare.cli simulator "$src/jobs/$job" -w "$work/ws_$side" \
      -n "$sites" -t "$sites" > "$work/$side.log" 2>&1) || { tail -40 "$work/$side.log"; exit 1; }
  label=$([ "$side" = before ] && echo "$rev" || echo "working tree")
  echo "$side ($label): $(( $(date +%s) - start )) s wall"
done
python - "$work" "$job" "$sites" <<'PY'
import json, sys
work, job, sites = sys.argv[1], sys.argv[2], int(sys.argv[3])
def history(side, site):
    results = json.load(open(f"{work}/ws_{side}/{site}/prrfl/{job}/results.json"))
    return [{k: v for k, v in h.items() if k != "timing"} for h in results["history"]], results["best"]
def numbers(value):
    """Every number in a record, in a fixed order."""
    if isinstance(value, dict):
        return [n for k in sorted(value) for n in numbers(value[k])]
    if isinstance(value, list):
        return [n for v in value for n in numbers(v)]
    return [float(value)] if isinstance(value, (int, float)) and not isinstance(value, bool) else []
differ = 0
for site in (f"site-{i}" for i in range(1, sites + 1)):
    (a, _), (b, best) = history("before", site), history("after", site)
    # every value the revision recorded must be the same; a field only the working tree records is named
    same = len(a) == len(b) and all(x.keys() <= y.keys() and all(x[k] == y[k] for k in x) for x, y in zip(a, b))
    new = sorted({k for x, y in zip(a, b) for k in y.keys() - x.keys()})
    differ += not same
    extra = f"; fields new in the working tree: {', '.join(new)}" if new else ""
    if not same and len(a) == len(b):  # how far apart: the first record that differs and the largest gap of a metric
        first = next(i for i, (x, y) in enumerate(zip(a, b)) if any(x[k] != y.get(k) for k in x))
        gaps = [abs(u - v) for x, y in zip(a, b) for u, v in zip(numbers(x), numbers({k: y.get(k) for k in x}))]
        extra += f"; first difference in history entry {first} of {len(a)}, largest gap {max(gaps):.3g} points"
    print(f"{site}: {'identical' if same else 'DIFFERENT'} ({len(a)} history entries; best round {best['round']}, test {best['test']}{extra})")
sys.exit(1 if differ else 0)
PY
