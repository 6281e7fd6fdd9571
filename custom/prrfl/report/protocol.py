"""FCA's generalization and specialization protocol and the cross-site matrices, from each run's crosseval.json."""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

from prrfl.crosseval import CROSSEVAL_FILE
from prrfl.metrics import label
from prrfl.naming import cohort_labels
from prrfl.registry import task_class
from prrfl.report.runs import SiteResult
from prrfl.report.stats import mean_std
from prrfl.report.tables import _markdown, ordered
from prrfl.storage import existing_json, find_json, load_json

log = logging.getLogger(__name__)


# ----- FCA's generalization / specialization protocol ----------------------------------------
PROTOCOL_LABELS = {"auc": "bAUC"}  # FCA's name: the mean one-vs-rest AUC over the classes present
GENERALIZATION_MODELS = {
    "global": "one global model (last round)",
    "sites": "each site's reported model (best round), mean over sites",
    "sites_last": "each site's model after the last round, mean over sites",
    None: "not evaluated (FLARE's cross-site evaluation: no pooled test split)",
}


def protocol_results(results: Sequence[SiteResult]) -> list[dict[str, Any]]:
    """Each run's crosseval.json (`prrfl.crosseval`, written by `prrfl sweep` and `prrfl crosseval`),
    computed here for a run that has none yet. A run that cannot be evaluated here (its models or data are
    not on this machine) is taken from the crosseval.json of FLARE's cross-site evaluation beside the server's
    results.json in the workspace (no generalization), else left out with a warning."""
    from prrfl.crosseval import write_crosseval

    found: dict[str, dict[str, Any] | None] = {}
    for r in results:
        if r.run_id in found:
            continue
        workspace = r.path.parents[3]  # <workspace>/<site>/prrfl/<run_name>/results.json
        wanted = workspace / "prrfl" / r.path.parent.name / CROSSEVAL_FILE
        path = existing_json(wanted)
        if path is None:
            try:
                write_crosseval(workspace)
                path = existing_json(wanted)
            except (OSError, ValueError, RuntimeError, KeyError) as e:
                deployed = [p for p in find_json(workspace, CROSSEVAL_FILE, recursive=True) if load_json(p).get("run_id") == r.run_id]
                if deployed:
                    path = deployed[0]
                else:
                    log.warning("run %s (%s): no generalization/specialization evaluation: %s", r.run_id, workspace, e)
        found[r.run_id] = None if path is None else {**load_json(path), "method": r.method}  # the run's label
    protocols = [p for p in found.values() if p is not None]
    for p in list(protocols):  # the other models a run scored (PRR's deputy), as rows of their own
        for role, part in (p.get("other_models") or {}).items():
            general = {"model": "sites_last", **part["generalization"]}
            protocols.append(
                {
                    **p,
                    "method": f"{p['method']}/{role}",
                    "reported_model": role,
                    "generalization": general,
                    "specialization": part["specialization"],
                    "cross_site": {},
                    "other_models": {},
                }
            )
    return protocols


def protocol_table(protocols: Sequence[dict[str, Any]], methods: Sequence[str], metrics: Sequence[str]) -> str:
    """FCA's Table 4 layout: per method, generalization and specialization, mean ± std over seeds."""
    names = [PROTOCOL_LABELS.get(m, label(m)) for m in metrics]
    header = ["method", "seeds", "generalization scored by"] + [f"Gen {n}" for n in names] + [f"Spec {n}" for n in names]
    body = []
    for method in methods:
        runs = [p for p in protocols if p["method"] == method]
        if not runs:
            continue
        scored_by = "; ".join(sorted({GENERALIZATION_MODELS[p["generalization"]["model"] if p["generalization"] else None] for p in runs}))
        cells = [method, str(len({p["seed"] for p in runs})), scored_by]
        for part in ("generalization", "specialization"):
            cells += [mean_std([p[part]["values"][m] for p in runs if p[part]]) for m in metrics]
        body.append(cells)
    note = (
        "FCA's protocol, in percent. Spec: each site's model at its best validation round on its own test split, "
        "mean over the sites. Gen: the test splits of all sites pooled, scored by the method's global model after "
        "the last round when it has one, else by each site's model (mean over the sites): two protocols, named "
        "in the third column. <method>/<role> rows: the other model of the run (PRR's deputy D), each site's after "
        "the last round, scored both ways. "
        + ("bAUC: the mean one-vs-rest AUC over the classes present (Table II's AUC). " if "auc" in metrics else "")
        + "With several seeds: mean ± sample std over seeds. The cross-site matrices are in each run's crosseval.json."
    )
    return _markdown(header, body) + "\n\n" + note


def cross_site_table(protocols: Sequence[dict[str, Any]], method: str, metric: str, site_order: Sequence[str] = ()) -> str:
    """One method's cross-site matrix: rows = the site whose best model scores, columns = the site whose test split
    it scores, each named by its site label (`site-1_A`), `metric` mean ± std over seeds (the diagonal is Table II's
    value). Runs are matched by cohort, in the task's site order."""
    cells: dict[tuple[str, str], list[float]] = defaultdict(list)
    runs = [p for p in protocols if p["method"] == method]
    for p in runs:
        cohorts = p["cohorts"]
        for model_site, row in p["cross_site"].items():
            for test_site, values in row.items():
                cells[(cohorts[model_site], cohorts[test_site])].append(values[metric])
    names = cohort_labels((site, cohort) for p in runs for site, cohort in p["cohorts"].items())
    models = ordered({m for m, _ in cells}, site_order)
    tests = ordered({t for _, t in cells}, site_order)
    role = next((p.get("reported_model") for p in runs if p.get("reported_model")), None)
    body = [[f"{names[m]}'s {role or 'model'}"] + [mean_std(cells.get((m, t), [])) for t in tests] for m in models]
    return _markdown([f"{method}: {label(metric)} on →"] + [names[t] for t in tests], body)


def run_matrix(crosseval: dict[str, Any], task: str | None = None) -> str:
    """One run's cross-site matrix (its crosseval.json) in its task's primary metric, as `prrfl results` and
    `prrfl crosseval` print it; `task`: the run's, where the file does not name it."""
    facts = task_class(crosseval.get("task") or task)
    return cross_site_table([crosseval], crosseval["method"], facts.metric_names[0], facts.site_names)
