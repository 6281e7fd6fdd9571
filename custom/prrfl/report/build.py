"""`build_report`: every table and figure of a comparison into one folder, from the results files alone."""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from pathlib import Path

from prrfl.metrics import label
from prrfl.registry import task_class
from prrfl.report.figures import OVERLAYS, plot_curves, plot_overlays, plot_retrogress, site_colours
from prrfl.report.protocol import cross_site_table, protocol_results, protocol_table
from prrfl.report.runs import RESULTS_GLOB, SiteResult, find_results, method_order
from prrfl.report.stats import LONG_FIELDS, RETROGRESS_FIELDS, long_rows, retrogress_rows, write_csv
from prrfl.report.tables import (
    _model_name,
    _models_note,
    ablation_table,
    minority_recall_table,
    retrogress_summary,
    retrogress_table,
    row_labels,
    runs_table,
    shared_drop_tests,
    table_ii,
    table_x,
)
from prrfl.storage import save_text
from prrfl.tasks.contract import Task

log = logging.getLogger(__name__)


# ----- the report --------------------------------------------------------------------------
def build_report(
    workspaces: Sequence[str | Path],
    out: str | Path,
    methods: Sequence[str] | None = None,
    reference: str = "prr",
    curves: Sequence[str] | None = None,
    task: str | None = None,
) -> Path:
    """Write results_long.csv, retrogress.csv, report.md, curves_<method>.png (for `curves`, default
    every method with per-epoch records) and retrogress.png into `out`; returns report.md's path.
    The results must be of one task (`task` picks one when the workspaces hold several)."""
    out = Path(out)
    results = find_results(workspaces, methods, task)
    if not results:
        what = f" of task '{task}'" if task else ""
        raise FileNotFoundError(f"no site results{what} ({RESULTS_GLOB}) under {', '.join(map(str, workspaces))}")
    tasks = sorted({r.task for r in results})
    if len(tasks) > 1:
        raise ValueError(f"the workspaces hold results of the tasks {tasks}: report one of them (--task)")
    facts = task_class(tasks[0])
    metrics = facts.table_metrics
    primary = facts.metric_names[0]  # what sites select their best round by
    order = method_order(results, methods, reference)
    rows = long_rows(results)
    drops = retrogress_rows(results, primary)
    shared_drops = retrogress_rows(results, primary, model="shared")
    write_csv(rows, LONG_FIELDS, out / "results_long.csv")
    write_csv(drops + shared_drops, RETROGRESS_FIELDS, out / "retrogress.csv")
    summary, shared_summary = retrogress_summary(drops, order), retrogress_summary(shared_drops, order)
    shared_p = shared_drop_tests(shared_drops, order, reference)
    figures = _figures(results, curves or order, summary, out, reference, primary, shared_summary)
    models = {r.method: _model_name(r) for r in results}
    overlays = plot_overlays(results, order, out / OVERLAYS, facts.site_names)  # segmentation runs write examples
    if overlays is None and (out / OVERLAYS).is_file():  # built earlier from the examples arrays kept results leave out
        overlays = out / OVERLAYS
    names = " and ".join([", ".join(label(m) for m in metrics[:-1]), label(metrics[-1])] if len(metrics) > 1 else [label(metrics[0])])
    sections = [
        f"# Results: {facts.name}\n",
        f"## Runs\n\n{runs_table(results, order)}\n",
        f"## {facts.paper_table}: per-site test {names}\n\n{table_ii(rows, order, reference, metrics, facts.site_names)}\n"
        + (f"\n{facts.table_note}\n" if facts.table_note else "")
        + _models_note(results, order),
    ]
    ablations = ablation_table(rows, order, reference, metrics)
    if ablations:
        sections.append(f"## Ablations (the paper's Table IV layout)\n\n{ablations}\n")
    if facts.ood_cohort and facts.ood_scored_by:
        table = table_x(rows, order, facts.ood_scored_by, metrics)
        scorer = row_labels(rows).get(facts.ood_scored_by, facts.ood_scored_by)
        sections.append(f"## Table X: out-of-distribution cohort, {scorer}'s model\n\n{table}\n")
    protocols = protocol_results(results)
    if protocols:
        table = protocol_table(protocols, order, facts.protocol_metrics)
        sections.append(f"## Generalization and specialization (FCA's protocol, its Table 4 layout)\n\n{table}\n")
        matrices = [
            cross_site_table(protocols, m, primary, facts.site_names)
            for m in order
            if any(p["method"] == m and p["cross_site"] for p in protocols)
        ]
        sections.append(
            f"## Cross-site matrix: test {label(primary)} of each site's best model on every site's test split\n\n"
            + "\n\n".join(matrices)
            + "\n\nMean ± sample std over seeds; the diagonal is each site's own test split (Table II).\n"
        )
    minority = minority_recall_table(results, order, facts.class_names, reference)  # None for tasks without per-class recall
    if minority:
        sections.append(f"## Class imbalance: the rarest class's recall\n\n{minority}\n")
    sections += [
        f"## Retrogress after communication\n\n{retrogress_table(summary, primary, shared_summary, shared_p, reference, models)}\n",
        f"## Figures\n\n{_figures_section(figures, overlays, primary, facts.examples is not Task.examples)}\n",
    ]
    return save_text("\n".join(sections), out / "report.md")


def _figures(
    results: Sequence[SiteResult],
    curves: Sequence[str],
    summary: dict[str, tuple[float, float, int]],
    out: Path,
    reference: str,
    metric: str,
    shared: dict[str, tuple[float, float, int]] | None = None,
) -> list[Path]:
    colours = site_colours({r.cohort for r in results})
    figures = []
    for method in curves:
        own = [r for r in results if r.method == method]
        if any(h["kind"] == "epoch" for r in own for h in r.history):
            figures.append(plot_curves(method, own, colours, out / f"curves_{re.sub(r'[^A-Za-z0-9_.-]+', '_', method)}.png", metric))
    if summary:
        figures.append(plot_retrogress(summary, out / "retrogress.png", reference, metric, shared))

    return figures


def _figures_section(drawn: Sequence[Path], overlays: Path | None, metric: str, examples: bool) -> str:
    """What the report's figures are and where they come from. The plots drawn from the results files (the retrogress
    bars, each method's curves) are linked, not embedded: `prrfl report` draws them again from the same files, so a
    copy of the report may leave them out. The overlays, drawn from the examples arrays a segmentation site writes
    (which a kept run leaves out), are embedded; `examples`: whether the task's sites write them."""
    parts = []
    if drawn:
        retrogress = [p for p in drawn if p.name == "retrogress.png"]
        curves = [p for p in drawn if p not in retrogress]
        links = [f"[{p.name}]({p.name}), the retrogress table above as bars" for p in retrogress]
        if curves:
            links.append(
                f"each method's test {label(metric)} of every site over the local epochs, the communication rounds marked: "
                + ", ".join(f"[{p.name}]({p.name})" for p in curves)
            )
        parts.append("Drawn by `prrfl report` from the results files into this report's folder: " + "; ".join(links) + ".")
    if overlays:
        parts.append(
            "A test slice of each site for each method, the truth and the prediction as contours (drawn from the examples "
            f"each segmentation site writes beside its results):\n\n![{overlays.stem}]({overlays.name})"
        )
    elif examples:
        parts.append(
            f"No {OVERLAYS}: these results hold no examples arrays (a kept run leaves them out); `prrfl report` draws it "
            "(a test slice of each site for each method) from runs that have them."
        )
    return "\n\n".join(parts) or "No figures: these results hold no per-epoch records and no examples."
