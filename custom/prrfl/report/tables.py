"""The Markdown tables of a report: the paper's per-site table (Table II / III), the ablations, Table X, the
minority class's recall, retrogress and the runs, each naming the model it scores."""

from __future__ import annotations

import logging
import math
from collections import defaultdict
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from prrfl.metrics import label
from prrfl.naming import cohort_labels, site_label
from prrfl.report.runs import SiteResult
from prrfl.report.stats import (
    MISSING,
    WILCOXON_MIN_PAIRS,
    PairedTest,
    _cohort_values,
    _seed_averages,
    mean_std,
    paired_test,
    sample_std,
    values_by_method,
)

log = logging.getLogger(__name__)


# ----- Markdown tables ---------------------------------------------------------------------
def _markdown(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def ordered(cohorts: Iterable[str], known: Sequence[str] = ()) -> list[str]:
    """Cohorts in the task's site order (`known`, e.g. clients A-E), any others after, by name."""
    present = set(cohorts)
    return [c for c in known if c in present] + sorted(present - set(known))


def row_labels(rows: Iterable[dict[str, Any]]) -> dict[str, str]:
    """cohort -> the site label (`site-1_A`, prrfl.naming) that names it in a table of these tidy rows."""
    return cohort_labels((row["site"], row["cohort"]) for row in rows)


def table_ii(
    rows: Sequence[dict[str, Any]], methods: Sequence[str], reference: str, metrics: Sequence[str], site_order: Sequence[str] = ()
) -> str:
    """Rows = methods; columns = each site's metrics at the best validation round (the site named by its label,
    `site-1_A`; runs matched by cohort), their average over the sites, and the paired test of the first metric
    against the reference."""
    values = {m: values_by_method(rows, "best_test", m) for m in metrics}
    cohorts = ordered((row["cohort"] for row in rows if row["split"] == "best_test"), site_order)
    names = row_labels(rows)
    first = metrics[0]
    header = ["method", "seeds"] + [f"{names[c]} {label(m)}" for c in cohorts for m in metrics]
    header += [f"Avg {label(m)}" for m in metrics] + [f"Avg {label(first)}, last round", f"p ({label(first)} vs {reference})"]
    last = values_by_method(rows, "last_test", first)
    body = []
    for method in methods:
        seeds = len({seed for (_, seed) in values[first].get(method, {})})
        cells = [method, str(seeds)]
        cells += [mean_std(_cohort_values(values[m].get(method, {}), c)) for c in cohorts for m in metrics]
        cells += [mean_std(_seed_averages(values[m].get(method, {}))) for m in metrics]
        cells += [mean_std(_seed_averages(last.get(method, {})))]
        test = PairedTest(math.nan, "", 0)
        if method != reference and reference in values[first]:
            test = paired_test(values[first].get(method, {}), values[first][reference])
        body.append(cells + [str(test)])
    note = (
        f"Test {', '.join(label(m) for m in metrics)} (%) of each site's model at its best validation round; "
        "Avg = mean over the sites of one run; 'last round': the same average of the models after the run's last "
        "round, no selection. With several seeds: mean ± sample std (ddof=1) over seeds. "
        f"p: two-sided paired test of the per-(site, seed) test {label(first)} against {reference} "
        f"(Wilcoxon signed-rank when n ≥ {WILCOXON_MIN_PAIRS} pairs, else paired t-test 't'); "
        f"{MISSING} for the reference itself, fewer than 2 pairs, or an undefined test."
    )
    return _markdown(header, body) + "\n\n" + note


def ablation_table(rows: Sequence[dict[str, Any]], methods: Sequence[str], reference: str, metrics: Sequence[str]) -> str | None:
    """The paper's Table IV layout: the reference method and its variants (runs that set its options,
    `prr[det_enabled=false]`), best first by the first metric's average over the sites, each with its change
    against the reference over the seeds both ran and the paired test of Table II. None without variants."""
    variants = [m for m in methods if m.startswith(f"{reference}[")]
    if not variants:
        return None
    values = {m: values_by_method(rows, "best_test", m) for m in metrics}
    first = metrics[0]
    averages = {
        m: dict(zip(sorted({s for _, s in values[first].get(m, {})}), _seed_averages(values[first].get(m, {}))))
        for m in [reference, *variants]
    }
    ranked = sorted(averages, key=lambda m: -np.mean(list(averages[m].values())) if averages[m] else math.inf)
    body = []
    for method in ranked:
        seeds = sorted(averages[method].keys() & averages[reference].keys())
        change = [averages[method][s] - averages[reference][s] for s in seeds]
        cells = [method, str(len(averages[method]))] + [mean_std(_seed_averages(values[m].get(method, {}))) for m in metrics]
        if method == reference:
            cells += [MISSING, MISSING]
        else:
            cells += [
                mean_std(change) if change else MISSING,
                str(paired_test(values[first].get(method, {}), values[first].get(reference, {}))),
            ]
        body.append(cells)
    header = ["run", "seeds", *(f"Avg {label(m)}" for m in metrics), f"change of Avg {label(first)} vs {reference}", "p (Table II's test)"]
    note = (
        f"{reference} and its variants (the options in brackets differ from {reference}'s defaults), best first by Avg "
        f"{label(first)} (mean over the sites of one run; mean ± sample std over seeds). Change: the variant's Avg "
        f"{label(first)} minus {reference}'s, per seed both ran, mean ± sample std; negative = the component the "
        "variant turns off helped."
    )
    return _markdown(header, body) + "\n\n" + note


def table_x(rows: Sequence[dict[str, Any]], methods: Sequence[str], cohort: str, metrics: Sequence[str]) -> str:
    """The out-of-distribution cohort, scored by the best model of the site of `cohort`."""
    ood = [row for row in rows if row["split"] == "ood" and row["cohort"] == cohort]
    site = row_labels(rows).get(cohort, cohort)
    if not ood:
        return f"No out-of-distribution evaluation of {site}'s model in these results."
    values = {m: values_by_method(ood, "ood", m) for m in metrics}
    body = []
    for method in methods:
        seeds = len(values[metrics[0]].get(method, {}))
        body.append([method, str(seeds)] + [mean_std(list(values[m].get(method, {}).values())) for m in metrics])
    header = ["method", "seeds"] + [f"OOD {label(m)}" for m in metrics]
    note = f"Best-on-validation model of {site} on the out-of-distribution cohort; mean ± sample std over seeds."
    return _markdown(header, body) + "\n\n" + note


def minority_recall_table(
    results: Sequence[SiteResult], methods: Sequence[str], class_names: Sequence[str], reference: str | None = None
) -> str | None:
    """Each site's rarest training class (fewest images, at least one) and its test recall at the site's best
    validation round: at the most imbalanced site (the largest ratio of its commonest to its rarest class),
    and averaged over the sites; with a reference, the paired test of each (site, seed)'s recall against the
    reference's. None when the results hold no per-class recall."""
    counts = {r.cohort: r.class_counts for r in results if r.class_counts and len(r.class_counts) == len(class_names)}
    rarest = {c: min((n, k) for k, n in enumerate(cc) if n > 0)[1] for c, cc in counts.items() if any(cc)}
    tests = [(r, (r.best or {}).get("test") or {}) for r in results if r.cohort in rarest]
    if not rarest or not any(f"recall_{class_names[0]}" in t for _, t in tests):
        return None
    worst = max(rarest, key=lambda c: (max(counts[c]) / counts[c][rarest[c]], c))
    name = class_names[rarest[worst]]

    def recall(r: SiteResult, test: dict[str, float]) -> float:
        return test.get(f"recall_{class_names[rarest[r.cohort]]}", math.nan)

    by_key = {m: {(r.cohort, r.seed): recall(r, t) for r, t in tests if r.method == m} for m in methods}
    body = []
    for method in methods:
        own = by_key[method]
        at_worst = _cohort_values(own, worst)
        row = [method, str(len(at_worst)), mean_std(at_worst), mean_std(_seed_averages(own))]
        if reference is not None:
            row.append(MISSING if method == reference else str(paired_test(own, by_key.get(reference, {}))))
        body.append(row)
    site = cohort_labels((r.site, r.cohort) for r in results)[worst]
    header = ["method", "seeds", f"{site}: recall of {name}", "mean over sites of the rarest class's recall"]
    header += [f"p (vs {reference})"] if reference is not None else []
    cc = ", ".join(f"{n} {k}" for n, k in zip(counts[worst], class_names))
    note = (
        f"{site} is the most imbalanced ({cc} training images); its rarest class is {name}. Test recall (%) of "
        "each site's model at its best validation round, mean ± sample std over seeds; the last column averages each "
        "site's recall of its own rarest training class first. A class imbalance method (CPA, FCA's prior) should raise it."
        + (
            " p: two-sided paired test of each (site, seed)'s rarest-class recall against the reference's (Table II's test)."
            if reference
            else ""
        )
    )
    return _markdown(header, body) + "\n\n" + note


def retrogress_summary(drops: Sequence[dict[str, Any]], methods: Sequence[str]) -> dict[str, tuple[float, float, int]]:
    """method -> (mean drop, sample std, number of (site, round, seed) drops)."""
    summary = {}
    for method in methods:
        values = [row["drop"] for row in drops if row["method"] == method]
        if values:
            summary[method] = (float(np.mean(values)), sample_std(values), len(values))
    return summary


def shared_drop_tests(shared_drops: Sequence[dict[str, Any]], methods: Sequence[str], reference: str) -> dict[str, PairedTest]:
    """method -> paired test of its shared model's drops against the reference's, pairing the drops of one
    (site, seed, round): did the download hurt the uploaded model more or less than the reference's?"""
    by_method: dict[str, dict[tuple[str, int, int], float]] = defaultdict(dict)
    for row in shared_drops:
        by_method[row["method"]][(row["cohort"], row["seed"], row["round"])] = row["drop"]
    ref = by_method.get(reference, {})
    return {m: paired_test(by_method[m], ref) for m in methods if m != reference and m in by_method}


def retrogress_table(
    summary: dict[str, tuple[float, float, int]],
    metric: str,
    shared: dict[str, tuple[float, float, int]] | None = None,
    shared_p: dict[str, PairedTest] | None = None,
    reference: str = "prr",
    models: dict[str, str] | None = None,
) -> str:
    """The reported models' drops (`summary`) and, beside them, the shared models' (`shared`, when any run
    recorded them) with their paired test against the reference's (`shared_p`): the drop that PFA is meant
    to soften is the shared model's."""
    if not summary:
        return "No per-epoch test records (eval_test_every_epoch) in these results: no retrogress measure."
    shared, shared_p = shared or {}, shared_p or {}

    def cells(stats: tuple[float, float, int] | None) -> list[str]:
        return [f"{stats[0]:.2f}", f"{stats[1]:.2f}", str(stats[2])] if stats else [MISSING] * 3

    def shared_cells(m: str) -> list[str]:
        return [*cells(shared.get(m)), str(shared_p[m]) if m in shared_p else MISSING]

    models = models or {}
    body = [[m, models.get(m, "the method's"), *cells(summary[m])] + (shared_cells(m) if shared else []) for m in summary]
    header = ["method", "model scored", f"mean {label(metric)} drop", "std", "n"]
    note = (
        f"Drop = test {label(metric)} after the last local epoch of round r-1 minus test {label(metric)} right "
        "after the download of round r (r ≥ 1), per site; mean and sample std over sites, rounds and seeds. "
        "Positive = the download made the evaluated model worse."
    )
    if shared:
        header += ["shared model's drop", "std", "n", f"p (vs {reference})"]
        note += (
            " The first columns are the model each site reports (PRR: the personalized model, which DET keeps); "
            "the shared model is the one a site uploads and the download overwrites (PRR: the deputy, which "
            "receives PFA's output, or with pfa_enabled=false the plain average; the reported model itself "
            f"for most methods), its test {label(metric)} as uploaded at the end of round r-1 minus right after the "
            f"download of round r. {MISSING}: runs that did not record it. p: two-sided paired test of the shared "
            f"model's drops against {reference}'s, one pair per (site, seed, round) both recorded (Table II's test)."
        )
    return _markdown(header, body) + "\n\n" + note


def runs_table(results: Sequence[SiteResult], methods: Sequence[str]) -> str:
    """Which runs the report is built from: provenance, and a check that every run finished."""
    runs: dict[tuple[str, int, str], list[SiteResult]] = defaultdict(list)
    for r in results:
        runs[(r.method, r.seed, r.run_id)].append(r)
    body = []
    for (method, seed, run_id), sites in sorted(runs.items(), key=lambda kv: (methods.index(kv[0][0]), kv[0][1])):
        rounds = sorted({s.rounds_completed for s in sites})
        sites_cell = ", ".join(site_label(s.site, s.cohort) for s in sites)
        body.append([method, _model_name(sites[0]), str(seed), run_id, sites_cell, "/".join(map(str, rounds))])
    return _markdown(["method", "model scored", "seed", "run id", "sites", "rounds completed"], body)


def _model_name(result: SiteResult) -> str:
    """The role a result scores, as the tables name it ("personal" for PRR's P); "the method's" when the run
    did not record it (runs written before results named their model); ", as received" for a global model
    scored when its download arrived."""
    name = result.reported_model or "the method's"
    return f"{name}, as received" if result.reported_at == "download" else name


def _models_note(results: Sequence[SiteResult], methods: Sequence[str]) -> str:
    """A line naming the model behind each row of a method with several models (PRR: P and D)."""
    roles = {r.method: _model_name(r) for r in results}
    derived = [m for m in methods if "/" in m]
    if not derived:
        return ""
    parents = sorted({m.rsplit("/", 1)[0] for m in derived})
    rows = "; ".join(f"{p}: its reported model ({roles.get(p, '?')})" for p in parents)
    return (
        f"\nRows name the model they score: {rows}; <method>/<role>: the other model the same run trained and evaluated "
        "every round (PRR's deputy D); <method>/trained: for a method that reports its global model as each site "
        "receives it, the site's model after its local epochs; each selected on validation by the same rule.\n"
    )
