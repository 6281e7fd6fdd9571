"""Each site's results file (`SiteResult`), found under any number of workspaces, and which method, variant and
seed it is."""

from __future__ import annotations

import dataclasses
import json
import logging
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prrfl.config import variant_settings
from prrfl.metrics import improves
from prrfl.registry import task_class
from prrfl.storage import find_json, load_json

log = logging.getLogger(__name__)


RESULTS_GLOB = "**/prrfl/*/results.json"
LEGACY_TASK = "derm"  # results files written before they named their task hold dermoscopy runs


# ----- the runs under a folder, for `prrfl results` -------------------------------------------
def variant_label(method: str, method_args: dict[str, Any], run: Mapping[str, Any] | None = None) -> str:
    """`prr` for the method with its defaults; `prr[cpa_global=false,det_enabled=false]` for a run that sets
    options (e.g. a Table IV ablation), so that such runs are reported apart from the method's own. `run`: the
    run's config or results, whose variant fields that are not the defaults are named the same way
    (`prrfl.config.VARIANT_FIELDS`): a classification term that is not the method's own
    (`fedavg[class_loss="balanced_softmax"]`), other numerics (`prr[precision="bf16"]`)."""
    options = {**method_args, **variant_settings(run or {})}
    if not options:
        return method
    return f"{method}[{','.join(f'{k}={json.dumps(v)}' for k, v in sorted(options.items()))}]"


@dataclass(frozen=True)
class SiteResult:
    """One site's results file of one run."""

    path: Path
    task: str
    method: str
    seed: int
    run_id: str
    site: str
    cohort: str
    rounds_completed: int
    best: dict[str, Any] | None
    last: dict[str, Any] | None
    ood: dict[str, float] | None
    history: list[dict[str, Any]]
    class_counts: list[int] | None = None  # training images (voxels) per class
    reported_model: str | None = None  # the role whose metrics these are (PRR: "personal"); None: not recorded
    select_from_round: int = 0  # the first round the best-on-validation selection considered
    reported_at: str = "round"  # "download": the global model as received (prrfl.site.trainer.record_download)
    other_model: bool = False  # a model the run scored beside its reported one (`other_model_results`): the run's files are not its

    @classmethod
    def load(cls, path: Path) -> SiteResult | None:
        """None for the server's run summary, which lives in the same folder layout. `method` is the run's
        label in every table: the method, with the options set for the run in brackets (an ablation)."""
        data = load_json(path)
        if "site" not in data:
            return None
        keys = ("seed", "run_id", "site", "cohort", "rounds_completed", "best", "last", "ood", "history", "class_counts", "reported_model")
        method = variant_label(data.get("method"), data.get("method_args") or {}, data)
        found = {k: data.get(k) for k in keys}
        return cls(
            path=path,
            task=data.get("task", LEGACY_TASK),
            method=method,
            select_from_round=data.get("select_from_round", 0),
            reported_at=data.get("reported_at", "round"),
            **found,
        )

    def other_model_results(self) -> list[SiteResult]:
        """The models the run evaluated every round beside the reported one, each as a result of its own: PRR's
        deputy D beside P, labelled `<method>/<role>`, and, for a method that reports its global model as received,
        the site's model after its local epochs, labelled `<method>/trained`. Each with its rounds' valid and test
        metrics, its best round on validation by the same rule as the reported model's, its last round. Runs
        recorded before the other models were (no `other_models` in their rounds) give none."""
        rounds = [h for h in self.history if h["kind"] == "round"]
        out = []
        for role in sorted({role for h in rounds for role in h.get("other_models", {})}):
            own = [{**self.scored(h), **h["other_models"][role]} for h in rounds if role in h.get("other_models", {})]
            out.append(self.as_other(f"{self.method}/{role}", own, role))
        if self.reported_at == "download" and rounds:
            out.append(
                self.as_other(f"{self.method}/trained", [{**self.scored(h), "valid": h["valid"], "test": h["test"]} for h in rounds])
            )
        return out

    @staticmethod
    def scored(h: dict[str, Any]) -> dict[str, Any]:
        return {"kind": "round", "round": h["round"], "epochs_done": h["epochs_done"]}

    def as_other(self, method: str, own: list[dict[str, Any]], role: str | None = None) -> SiteResult:
        primary = task_class(self.task).metric_names[0]
        best = None
        for h in own:  # the site loop's rule (prrfl.metrics.improves)
            if improves(None if best is None else best["valid"][primary], h["valid"][primary], h["round"], self.select_from_round):
                best = {"round": h["round"], "valid": h["valid"], "test": h["test"]}
        role = role or self.reported_model
        return dataclasses.replace(
            self, method=method, best=best, last=own[-1], ood=None, history=own, reported_model=role, reported_at="round", other_model=True
        )

    def identity(self) -> dict[str, Any]:
        """The columns that name this site's run in every tidy table."""
        return {"method": self.method, "seed": self.seed, "run_id": self.run_id, "site": self.site, "cohort": self.cohort}

    def evaluations(self) -> dict[str, dict[str, float]]:
        """The metric sets a run reports, by split name (absent ones left out)."""
        best, last = self.best or {}, self.last or {}
        found = {"best_valid": best.get("valid"), "best_test": best.get("test"), "last_test": last.get("test"), "ood": self.ood}
        return {split: metrics for split, metrics in found.items() if metrics}


def find_results(workspaces: Iterable[str | Path], methods: Sequence[str] | None = None, task: str | None = None) -> list[SiteResult]:
    """Every site results file under the workspaces (of the given methods and task only, if any).

    A file reached through two overlapping workspaces counts once. The other models a run recorded beside
    the reported one come as results of their own (`SiteResult.other_model_results`: "prr/deputy" beside
    "prr"). Two runs of one method with the same seed are refused: the paired test matches runs by seed, and silently picking one would hide
    which run the table shows.
    """
    found: dict[tuple[str, str, str], SiteResult] = {}
    for ws in workspaces:
        for path in find_json(ws, RESULTS_GLOB):
            result = SiteResult.load(path)
            if result is not None and (not methods or result.method in methods) and (not task or result.task == task):
                found.setdefault((result.method, result.run_id, result.site), result)
    loaded = list(found.values())
    loaded += [other for r in loaded for other in r.other_model_results()]
    results = sorted(loaded, key=lambda r: (r.task, r.method, r.seed, r.cohort, r.site))
    runs: dict[tuple[str, str, int], dict[str, Path]] = defaultdict(dict)
    for r in results:
        runs[(r.task, r.method, r.seed)].setdefault(r.run_id, r.path.parent)
    for (task_name, method, seed), by_id in runs.items():
        if len(by_id) > 1:
            listing = ", ".join(f"{run_id} ({folder})" for run_id, folder in sorted(by_id.items()))
            raise ValueError(
                f"method '{method}' on task '{task_name}' has {len(by_id)} runs with seed {seed}: {listing}; report one of them"
            )
    return results


def method_order(results: Sequence[SiteResult], methods: Sequence[str] | None, reference: str) -> list[str]:
    """The requested methods that have results, in the requested order; else the reference first."""
    present = {r.method for r in results}
    if methods:
        missing = [m for m in methods if m not in present]
        if missing:
            log.warning("no results for method(s) %s: left out of the report", ", ".join(missing))
        # each requested method's other models (its label + "/<role>") right after it
        return [x for m in methods if m in present for x in (m, *sorted(d for d in present if d.startswith(f"{m}/")))]
    return sorted(present, key=lambda m: (m.split("/")[0] != reference, m.split("/")[0], m))  # "prr/deputy" after "prr"
