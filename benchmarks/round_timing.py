"""Per-site, per-round training throughput and wall time of finished runs, from the `timing` every site
records in its results.json (train samples/s counts every model of the method: P and D for PRR).

    python benchmarks/round_timing.py <folder> [<folder> ...]

A folder is a simulator workspace, a `prrfl sweep` folder or anything holding sites' results files
(<site>/prrfl/<run>/results.json); each run is printed as one table, then its summary lines. Kept runs
(benchmarks/keep_results.py, docs/results) leave the timings out.
"""

from __future__ import annotations

import json
import statistics
import sys
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

from prrfl.registry import task_class


def site_results(folders: list[Path]) -> dict[str, list[dict]]:
    """The site results files under `folders`, grouped by run name (the server's own file has no "site")."""
    runs: dict[str, list[dict]] = defaultdict(list)
    for folder in folders:
        for path in sorted(folder.rglob("prrfl/*/results.json")):
            data = json.loads(path.read_text())
            if "site" in data and "history" in data:
                runs[f"{data['run_name']} (run {data.get('run_id', '?')})"].append(data)
    return runs


def print_run(name: str, results: list[dict]) -> None:
    metrics = task_class(results[0]["task"]).metric_names[:2]
    print(f"\n## {name}\n")
    print(
        "| site | cohort | round | train samples | train samples/s (all models) | round s | "
        + " | ".join(f"test {m}" for m in metrics)
        + " |"
    )
    print("|---|---|---|---|---|---|" + "---|" * len(metrics))
    for r in sorted(results, key=lambda r: r["cohort"]):
        for h in (h for h in r["history"] if h["kind"] == "round"):
            t = h["timing"]
            cells = " | ".join(f"{h['test'][m]:.1f}" for m in metrics)
            print(
                f"| {r['site']} | {r['cohort']} | {h['round']} | {r['num_train']} | {t['train_images_per_second']:.1f} | {t['round_seconds']:.1f} | {cells} |"
            )
    best = [r["best"]["test"] for r in results if r.get("best")]
    if best:
        print(
            "\nmean test at each site's best validation round: "
            + ", ".join(f"{m} {statistics.mean(b[m] for b in best):.2f}" for m in metrics)
        )
    per_site = [[h["timing"] for h in r["history"] if h["kind"] == "round"] for r in results]
    speeds = [t["train_images_per_second"] for site in per_site for t in site]
    rounds = [max(t["round_seconds"] for t in ts) for ts in zip(*per_site)]  # a round lasts as long as its slowest site
    print(
        f"train samples/s per site (all models counted): median {statistics.median(speeds):.1f}, over the {len(results)} sites "
        f"{sum(statistics.median(t['train_images_per_second'] for t in site) for site in per_site):.1f}; "
        f"slowest site's round: median {statistics.median(rounds):.1f} s, {len(rounds)} rounds {sum(rounds):.0f} s"
    )


def each_run(argv: list[str], usage: str, show: Callable[[str, list[dict]], None]) -> int:
    """The command line of the benchmark scripts: `show` each run found under the folders in argv."""
    if not argv:
        print(usage, file=sys.stderr)
        return 2
    runs = site_results([Path(a) for a in argv])
    if not runs:
        print(f"no site results.json under {', '.join(argv)}", file=sys.stderr)
        return 1
    for name, results in sorted(runs.items()):
        show(name, results)
    return 0


def main(argv: list[str]) -> int:
    return each_run(argv, __doc__, print_run)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
