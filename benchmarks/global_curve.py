"""How far a global-model method's aggregate has come at each round: for each kept run, the validation metric of the
global model as each site receives it (FedAvg's, FedBN's, ... `report_global_model`), mean over the sites, per
aggregate, and the round each site selected. With `--rounds-rule`, the number of rounds a schedule needs by the rule
docs/calibration.md fixes before reading any long run: smooth the curve over 3 aggregates (a centred moving mean, 2 at
the ends) and take the first aggregate whose smoothed value is within `--within` points of the curve's smoothed
maximum; the schedule needs that aggregate's index + 1 rounds.

    python benchmarks/global_curve.py docs/results/calibration/global_every_round/cpu/derm_shift1/*_s[0-9].kept.json.gz
    python benchmarks/global_curve.py <sweep>/fedavg_s0 --rounds-rule --within 2

Reads every site's results.json of each run: a kept run (benchmarks/keep_results.py) or a run's folder.
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

from prrfl.registry import task_class
from prrfl.report.runs import RESULTS_GLOB, SiteResult
from prrfl.storage import find_json


def metric(task: str) -> str:
    """The metric of the curve: the first of the papers' table (F1; Dice per slice), which a kept run keeps of the
    global model's validation scores (prrfl.report.keep)."""
    return task_class(task).table_metrics[0]


def site_curves(run: Path) -> tuple[str, dict[str, list[float]], dict[str, int]]:
    """(task, site -> validation metric of each aggregate in round order, site -> selected round) of one run, read
    with the report's loader (prrfl.report.runs.SiteResult)."""
    sites = [r for r in map(SiteResult.load, find_json(run, RESULTS_GLOB)) if r is not None]
    if not sites:
        raise SystemExit(f"{run}: no site's results.json with the global model scored per round (report_global_model)")
    curves, best = {}, {}
    for r in sites:
        scored = sorted((h for h in r.history if "global_round" in h), key=lambda h: h["global_round"])
        curves[r.site] = [h["valid"][metric(r.task)] for h in scored]
        best[r.site] = r.best["round"] if r.best else -1
    return sites[0].task, curves, best


def mean_curve(curves: dict[str, list[float]]) -> list[float]:
    """The mean over the sites of each aggregate's score, as far as every site has one."""
    n = min(len(c) for c in curves.values())
    return [statistics.mean(c[t] for c in curves.values()) for t in range(n)]


def smoothed(values: list[float]) -> list[float]:
    """Centred moving mean over 3 aggregates (2 at either end)."""
    return [statistics.mean(values[max(t - 1, 0) : t + 2]) for t in range(len(values))]


def rounds_needed(values: list[float], within: float) -> int:
    """The rule: index + 1 of the first aggregate whose smoothed score is within `within` of the smoothed maximum."""
    s = smoothed(values)
    top = max(s)
    return next(t for t, v in enumerate(s) if v >= top - within) + 1


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", nargs="+", type=Path, help="kept runs (<method>_s<seed>.kept.json.gz) or run folders")
    ap.add_argument("--rounds-rule", action="store_true", help="print the rounds the rule asks for")
    ap.add_argument("--within", type=float, default=2.0, help="points below the smoothed maximum (default 2)")
    args = ap.parse_args(argv)
    for run in args.runs:
        task, curves, best = site_curves(run)
        values = mean_curve(curves)
        line = f"{run}: {task} {metric(task)} of the global model, mean over {len(curves)} sites, per aggregate: "
        line += " ".join(f"{v:.1f}" for v in values) + f"; selected rounds {[best[s] for s in sorted(best)]}"
        if args.rounds_rule:
            line += f"; rounds needed (within {args.within:g} of the smoothed maximum {max(smoothed(values)):.1f}): "
            line += str(rounds_needed(values, args.within))
        print(line)


if __name__ == "__main__":
    main()
