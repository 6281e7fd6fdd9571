"""Evaluation across sites after a run: FCA's generalization / specialization protocol and the
cross-site matrix.

* specialization: each site's reported model (its best validation round, `best_<role>.pt`) on its
  own test split, averaged over the sites;
* generalization: the pooled test splits of all sites, scored by the method's global model after the
  last round when the method has one (`Method.global_params`: FedAvg and its kin, FCA's extractor
  with the federated head, HarmoFL with its shared amplitude), otherwise by each site's reported model,
  averaged over the sites (PRR, FedBN, SiloBN, FedProto: no single model fits every site);
* cross-site matrix: each site's reported model on every site's test split (rows: the model's site);
* the other models a method trains beside the reported one (PRR's deputy D beside its personalized P),
  each site's as it stands after the last round (its checkpoint), scored the same two ways
  (`other_models`): generalization as the mean over the sites of each site's model on the pooled test
  splits, specialization on its own.

Metrics: the task's `protocol_metrics` (bACC and bAUC for classification: bAUC is the mean one-vs-rest
AUC over the classes present; Dice for segmentation, per volume, the volumes of all sites pooled).

This needs every site's test split and models in one place: the simulator's workspace (or any setting
where one person holds all the data). Each site's results.json says where its state folder and data are;
the server's results.json where the global model is. Written to `<workspace>/prrfl/<run_name>/crosseval.json`.

On a deployment no one holds all the data: FLARE's cross-site evaluation (prrfl.flare.cross_site) has each
site score every site's best model on its own test split, and `cross_site_eval_result` puts FLARE's matrix
in the same layout, written beside the server's results.json. It has the cross-site matrix and
specialization (its diagonal); generalization needs the pooled test splits, so it is null there.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from prrfl.config import RunConfig
from prrfl.metrics import nanmean
from prrfl.numerics import prepare_model
from prrfl.registry import build_method, build_task, task_class
from prrfl.site.state import CHECKPOINT
from prrfl.storage import load_json, load_torch, save_json
from prrfl.tasks.contract import Split

log = logging.getLogger(__name__)

CROSSEVAL_FILE = "crosseval.json"


@dataclass
class RunFiles:
    """What a finished run left in a workspace: its config, each site's results, the global model."""

    workspace: Path
    cfg: RunConfig
    run_id: str
    sites: dict[str, dict[str, Any]]  # site name -> its results.json
    global_model: dict[str, Any] | None  # {"file", "round"} from the server's results.json

    @property
    def output(self) -> Path:
        return self.workspace / "prrfl" / self.cfg.run_name / CROSSEVAL_FILE


def find_runs(workspace: str | Path) -> list[RunFiles]:
    """Every run whose site results and server results are in `workspace` (a simulator workspace)."""
    workspace = Path(workspace).resolve()
    sites: dict[str, dict[str, dict[str, Any]]] = defaultdict(dict)
    for path in sorted(workspace.glob("*/prrfl/*/results.json")):
        data = load_json(path)
        if "site" not in data:
            continue
        missing = [k for k in ("cohort", "state_dir") if k not in data]
        if missing:
            raise ValueError(f"{path}: no {', '.join(missing)} (results written before runs recorded where their models are)")
        sites[data["run_id"]][data["site"]] = data
    servers = {}
    for path in sorted(workspace.glob("server/**/results.json")):
        data = load_json(path)
        if "config" in data and "sites" in data:
            servers[data["run_id"]] = data
    runs = []
    for run_id, by_site in sorted(sites.items()):
        server = servers.get(run_id)
        if server is None:
            raise FileNotFoundError(
                f"{workspace}: sites of run {run_id} wrote results, but no server results.json of that run was found "
                "under server/ (did the run finish?)"
            )
        cfg = RunConfig.from_dict(server["config"])
        runs.append(RunFiles(workspace, cfg, run_id, dict(sorted(by_site.items())), server.get("global_model")))
    if not runs:
        raise FileNotFoundError(f"no finished run in {workspace} (no */prrfl/<run>/results.json of a site)")
    return runs


def evaluate_run(run: RunFiles, device: str | torch.device = "cpu") -> dict[str, Any]:
    """The protocol's numbers for one run (see the module's docstring), as a JSON-ready dict."""
    device = torch.device(device)
    task = build_task(run.cfg)
    method = build_method(run.cfg, task)
    metrics = list(task.protocol_metrics)
    tests: dict[str, Split] = {}
    models: dict[str, torch.nn.Module] = {}
    for site, results in run.sites.items():
        tests[site] = task.load_site(results["cohort"], device, results.get("data_root")).test
        best = Path(results["state_dir"]) / f"best_{method.eval_role}.pt"
        if best.exists():
            models[site] = _loaded(method.build_model(), load_torch(best, map_location=device), run.cfg, device)
        else:
            log.warning("run %s: site %s has no reported model (%s); left out of the protocol", run.run_id, site, best)
    if not models:
        raise FileNotFoundError(f"run {run.run_id}: no site's reported model (best_{method.eval_role}.pt) was found")
    pooled = Split.pooled(list(tests.values()))
    cross = {m: {t: task.evaluate(model, tests[t]) for t in tests} for m, model in models.items()}
    own = {site: {k: cross[site][site][k] for k in metrics} for site in models}
    if run.global_model:
        model = _loaded(method.build_global_model(), load_torch(Path(run.global_model["file"]), map_location=device), run.cfg, device)
        values = task.evaluate(model, pooled)
        generalization = {"model": "global", "round": run.global_model["round"], "per_site": None}
    else:
        per_site = {site: task.evaluate(model, pooled) for site, model in models.items()}
        values = {k: nanmean(v[k] for v in per_site.values()) for k in metrics}
        generalization = {"model": "sites", "round": None, "per_site": {s: {k: v[k] for k in metrics} for s, v in per_site.items()}}
    return {
        "run_id": run.run_id,
        "run_name": run.cfg.run_name,
        "task": run.cfg.task,
        "method": run.cfg.method,
        "seed": run.cfg.seed,
        "metrics": metrics,
        "reported_model": method.eval_role,
        "cohorts": {site: results["cohort"] for site, results in run.sites.items()},
        "pooled_test_samples": len(pooled),
        "generalization": {**generalization, "values": {k: values[k] for k in metrics}},
        "specialization": {"values": {k: nanmean(v[k] for v in own.values()) for k in metrics}, "per_site": own},
        "cross_site": cross,
        "other_models": _other_models(run, task, method, tests, pooled, metrics, device),
    }


def _other_models(run: RunFiles, task, method, tests: dict[str, Split], pooled: Split, metrics: list[str], device) -> dict[str, Any]:
    """role -> generalization and specialization of each site's final model of that role (from the site's
    checkpoint), for every role the method trains beside the reported one; a site without a checkpoint
    is left out with a warning."""
    out: dict[str, Any] = {}
    for role in (r for r in method.roles if r != method.eval_role):
        general, own = {}, {}
        for site, results in run.sites.items():
            path = Path(results["state_dir"]) / CHECKPOINT
            if not path.exists():
                log.warning("run %s: site %s has no checkpoint (%s); its final %s is left out", run.run_id, site, path, role)
                continue
            model = _loaded(method.build_model(), load_torch(path, map_location=device)["models"][role], run.cfg, device)
            general[site] = {k: v for k, v in task.evaluate(model, pooled).items() if k in metrics}
            own[site] = {k: v for k, v in task.evaluate(model, tests[site]).items() if k in metrics}
        if general:
            out[role] = {
                "round": "last",
                "generalization": {"values": {k: nanmean(v[k] for v in general.values()) for k in metrics}, "per_site": general},
                "specialization": {"values": {k: nanmean(v[k] for v in own.values()) for k in metrics}, "per_site": own},
            }
    return out


def cross_site_eval_result(
    server: dict[str, Any],
    matrix: dict[str, dict[str, dict[str, float]]],
    models: dict[str, dict[str, Any]] | None = None,
    errors: dict[str, str] | None = None,
) -> dict[str, Any]:
    """The crosseval.json of a run evaluated by FLARE's cross-site evaluation. server: the workflow's
    results.json; matrix: FLARE's cross_val_results.json (data site -> model site -> metrics); models:
    site -> its card's cohort, round, role and weights_sha256; errors: what could not be evaluated, and why."""
    cfg = RunConfig.from_dict(server["config"])
    metrics = list(task_class(cfg.task).protocol_metrics)
    cross: dict[str, dict[str, dict[str, float]]] = defaultdict(dict)  # model site -> data site, as evaluate_run
    for data_site, by_model in sorted(matrix.items()):
        for model_site, values in sorted(by_model.items()):
            cross[model_site][data_site] = values
    own = {site: {k: row[site][k] for k in metrics} for site, row in sorted(cross.items()) if site in row}
    return {
        "run_id": server["run_id"],
        "run_name": cfg.run_name,
        "task": cfg.task,
        "method": cfg.method,
        "seed": cfg.seed,
        "metrics": metrics,
        "evaluated_by": "FLARE cross-site evaluation: each site scored every site's best model on its own test split",
        "cohorts": {site: summary["cohort"] for site, summary in server["sites"].items() if "cohort" in summary},
        "models": dict(sorted((models or {}).items())),
        "errors": dict(sorted((errors or {}).items())),
        "pooled_test_samples": None,
        "generalization": None,  # the pooled test splits of all sites are in no one place
        "specialization": {"values": {k: nanmean(v[k] for v in own.values()) for k in metrics}, "per_site": own},
        "cross_site": dict(sorted(cross.items())),
    }


def write_crosseval(workspace: str | Path, device: str | torch.device = "cpu") -> list[Path]:
    """Evaluate every finished run in the workspace and write its crosseval.json; returns the files."""
    written = []
    for run in find_runs(workspace):
        written.append(save_json(evaluate_run(run, device), run.output))
    return written


def summary_line(result: dict[str, Any]) -> str:
    """One line for logs: 'generalization (global) bacc 51.2 auc 70.3; specialization bacc 60.1 auc 75.0' (the task's order)."""

    def values(part: dict[str, Any]) -> str:
        return " ".join(f"{k} {part['values'][k]:.1f}" for k in result["metrics"])

    gen = result["generalization"]
    spec = f"specialization {values(result['specialization'])}"
    return (
        f"generalization ({gen['model']}) {values(gen)}; {spec}" if gen else f"{spec} (no generalization: the test splits are not pooled)"
    )


def _loaded(model: torch.nn.Module, state: dict[str, torch.Tensor], cfg: RunConfig, device: torch.device) -> torch.nn.Module:
    """`model` with the weights `state`, on `device`, in evaluation mode, computing as the run trained it (`prrfl.numerics`)."""
    model.load_state_dict(state)
    return prepare_model(model.to(device), cfg).eval()
