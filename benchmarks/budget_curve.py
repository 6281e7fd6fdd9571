"""What a run would have reported had it stopped after k rounds, for k = 1..R: each site's test metrics
at its best validation round among the first k (the rule the sites apply), averaged over the sites.
When these numbers stop changing, more rounds would not change the comparison: the check behind the
bench profile's round count (the BENCH profiles of prrfl.tasks.derm.task and prrfl.tasks.prostate.task).

    python benchmarks/budget_curve.py <workspace> [<workspace> ...]

A workspace is a finished simulator run (or a sweep folder); one table per run.
"""

from __future__ import annotations

import statistics
import sys

from round_timing import each_run

from prrfl.registry import task_class


def reported_after(history: list[dict], k: int, metric: str) -> dict[str, float]:
    """The test metrics of the first round, among the first k, with the highest validation `metric`."""
    rounds = [h for h in history if h["kind"] == "round"][:k]
    best = max(rounds, key=lambda h: (h["valid"][metric], -h["round"]))
    return best["test"]


def print_budget(name: str, results: list[dict]) -> None:
    results = sorted(results, key=lambda r: r["cohort"])
    facts = task_class(results[0]["task"])
    primary, metrics = facts.metric_names[0], facts.table_metrics[:2]
    total = min(sum(h["kind"] == "round" for h in r["history"]) for r in results)
    print(f"\n## {name}: reported test metrics after k rounds (best validation {primary} among the first k)\n")
    print("| rounds | " + " | ".join(f"mean {m}" for m in metrics) + " | " + " | ".join(f"{r['cohort']} {primary}" for r in results) + " |")
    print("|---|" + "---|" * (len(metrics) + len(results)))
    for k in range(1, total + 1):
        tests = [reported_after(r["history"], k, primary) for r in results]
        means = " | ".join(f"{statistics.mean(t[m] for t in tests):.1f}" for m in metrics)
        print(f"| {k} | {means} | " + " | ".join(f"{t[primary]:.1f}" for t in tests) + " |")


def main(argv: list[str]) -> int:
    return each_run(argv, __doc__, print_budget)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
