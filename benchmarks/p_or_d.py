"""Report whichever of PRR's two models validates better, read from kept runs without a new run.

The rule (docs/methods.md, "Reporting whichever of P and D validates better"): at each site, P and D each take their
best round by the site's own selection rule (the task's primary validation metric, `prrfl.metrics.improves`); the
site reports the one of the two whose best validation score is higher (P on a tie, the paper's model). Prints each
(seed, site)'s choice and the test score of P, D and the chosen one, and their means over the sites of each seed and
over the seeds, and the paired test of the chosen model's scores against P's over the (site, seed) pairs (the
report's test).

    python benchmarks/p_or_d.py docs/results/heldout/prostate/prr_s[0-9].kept.json.gz
"""

from __future__ import annotations

import argparse
import statistics
from collections import defaultdict
from collections.abc import Sequence

from prrfl.registry import task_class
from prrfl.report.runs import SiteResult, find_results
from prrfl.report.stats import mean_std, paired_test

MODELS = ("P", "D", "chosen")


def choose(p: SiteResult, d: SiteResult, primary: str) -> SiteResult:
    """D when its best validation score beats P's, else P."""
    return d if d.best["valid"][primary] > p.best["valid"][primary] else p


def readings(results: Sequence[SiteResult], metric: str | None = None) -> tuple[str, list[dict]]:
    """(the test metric, one row per (seed, site)): its cohort, which model the rule chose, each model's test score."""
    pairs: dict[tuple[int, str], dict[str, SiteResult]] = defaultdict(dict)
    for r in results:
        if r.method in ("prr", "prr/deputy") and r.best:
            pairs[(r.seed, r.site)][r.method] = r
    if not pairs:
        raise SystemExit("no PRR run with its deputy's records under the folders given")
    task = task_class(next(iter(pairs.values()))["prr"].task)
    primary = task.metric_names[0]
    metric = metric or ("slice_dice" if "slice_dice" in task.metric_names else primary)
    rows = []
    for (seed, site), two in sorted(pairs.items()):
        if set(two) != {"prr", "prr/deputy"}:
            raise SystemExit(f"seed {seed}, {site}: P and D are not both recorded")
        p, d = two["prr"], two["prr/deputy"]
        chosen = choose(p, d, primary)
        scores = {name: r.best["test"][metric] for name, r in zip(MODELS, (p, d, chosen), strict=True)}
        rows.append({"seed": seed, "cohort": p.cohort, "choice": "D" if chosen is d else "P", **scores})
    return metric, rows


def summary(rows: Sequence[dict]) -> dict[str, list[float]]:
    """Each model's mean over the sites, one value per seed (in seed order)."""
    seeds = sorted({r["seed"] for r in rows})
    return {m: [statistics.fmean(r[m] for r in rows if r["seed"] == s) for s in seeds] for m in MODELS}


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", help="kept PRR runs (<run>.kept.json.gz) or run folders")
    parser.add_argument("--metric", help="the test metric to compare (default: Dice per slice, else the task's primary)")
    args = parser.parse_args(argv)
    metric, rows = readings(find_results(args.runs), args.metric)
    print(f"| seed | site | chosen | P | D | chosen's | ({metric}, test, at each model's best validation round)")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['seed']} | {r['cohort']} | {r['choice']} | {r['P']:.2f} | {r['D']:.2f} | {r['chosen']:.2f} |")
    for model, values in summary(rows).items():
        print(f"{model}: mean over sites per seed {', '.join(f'{v:.2f}' for v in values)}; over seeds {mean_std(values)}")
    pairs = {m: {(r["cohort"], r["seed"]): r[m] for r in rows} for m in ("chosen", "P")}
    print(f"chosen against P: p {paired_test(pairs['chosen'], pairs['P'])}")


if __name__ == "__main__":
    main()
