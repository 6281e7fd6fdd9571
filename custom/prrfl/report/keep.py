"""What a kept run (prrfl.kept) keeps of a run's files: everything a report or `prrfl results` reads, every number as it
is, so that a report built from kept runs is the report built from their workspaces, byte for byte. Left out:

* of a site's results: the paths of the machine it ran on (data_root, state_dir), the counts no table reads
  (num_train, rounds_missed), the wall-clock timings of its rounds; of its last round, only the test metrics (the
  tables' "last round" column);
* of its per-round records: the metrics of the model a site reports at its rounds (PRR's P, whose `best` and `last`
  hold what the tables read of it, its test curve the per-epoch records); of the models whose best and last round a
  report takes from these records (the other models, `other_models`: PRR's deputy, the `<method>/deputy` rows; at a
  site that reports the global model as received, the model it trained, the `<method>/trained` rows), the validation
  and test metrics but the task's primary metric, except at their last round and at every round the selection could
  take (from `select_from_round` on, a validation primary metric at least every one before it), kept whole; of the
  shared model's test metrics (`shared_test`, the retrogress of the model a download overwrites), only the primary;
* of its per-epoch records (kind "epoch" and "download"), whose test metrics only the curves and the retrogress read,
  only the task's primary metric of `test` and `shared_test`, and of their validation metrics (a global model's as
  received) the first of the papers' table, which benchmarks/global_curve.py reads;
* of the server's results: of each site's summary, what the site's own results file holds (last, ood, download_drop);
* of a crosseval.json: the hashes of the weights FLARE's cross-site evaluation scored (models) and the sentence saying
  who evaluated (evaluated_by: the same in every file of FLARE's evaluation, which its path names); of its cross-site
  matrix, the task's primary metric, the one every matrix shows; the per-site values behind its generalization
  means (`per_site`), which no table shows (those of specialization stay: benchmarks/fca_table4.py's paired tests
  pair FCA's Table 4 specialization by (site, seed)).

`pack` of what `slim` keeps gives the same bytes again: a kept run packed again (benchmarks/keep_results.py
--compact) changes only where these rules leave out more than the rules it was kept by.
"""

from __future__ import annotations

import math
from typing import Any

from prrfl import kept
from prrfl.registry import task_class
from prrfl.report.runs import LEGACY_TASK

SITE_DROPPED = ("data_root", "state_dir", "num_train", "rounds_missed")
RECORD_DROPPED = ("timing",)
PER_EPOCH_KINDS = ("epoch", "download")
PRIMARY_ONLY = ("test", "shared_test")  # of a per-epoch record
ROUND_METRICS = ("valid", "test")  # a model's metrics in a round record
ROUND_PRIMARY_ONLY = ("shared_test",)
SERVER_SITE_DROPPED = ("last", "ood", "download_drop")
CROSSEVAL_DROPPED = ("models", "evaluated_by")
CROSSEVAL_PARTS = ("generalization",)  # whose per_site values no table shows


def pack(members: dict[str, Any]) -> bytes:
    """The kept run of a run's files (each by its path in the workspace, the done marker as kept.DONE_MEMBER)."""
    return kept.encode({name: slim(data) for name, data in members.items()})


def slim(data: Any) -> Any:
    """A run's file as kept: what no report reads left out (see the module's docstring), by the file's shape; a file
    of another shape (a done marker) whole."""
    if kept.is_site_results(data):
        return _slim_site(data)
    if isinstance(data, dict) and isinstance(data.get("sites"), dict) and isinstance(data.get("config"), dict):
        return {**data, "sites": {name: _without(summary, SERVER_SITE_DROPPED) for name, summary in data["sites"].items()}}
    if isinstance(data, dict) and "cross_site" in data:
        return _slim_crosseval(data)
    return data


def _without(data: Any, keys: tuple[str, ...]) -> Any:
    return {k: v for k, v in data.items() if k not in keys} if isinstance(data, dict) else data


def _only(values: Any, keep: set[str]) -> Any:
    """A dict of metrics with only the metrics `keep` names; anything else as it is."""
    return {k: v for k, v in values.items() if k in keep} if isinstance(values, dict) else values


def _slim_site(data: dict[str, Any]) -> dict[str, Any]:
    task = task_class(data.get("task", LEGACY_TASK))
    primary = task.metric_names[0]
    last = data.get("last")
    out = _without(data, SITE_DROPPED)
    if isinstance(last, dict) and "test" in last:
        out["last"] = {"test": last["test"]}
    out["history"] = [_slim_record(r, primary, task.table_metrics[0]) for r in data["history"]]
    rounds = [r for r in out["history"] if isinstance(r, dict) and r.get("kind") == "round"]
    select_from = data.get("select_from_round", 0)
    # the site's own model: a report picks its best and last round from the round records only where the site
    # reports the global model as received (its `/trained` rows); else the site's best and last hold them
    trained = data.get("reported_at", "round") == "download"
    _slim_model([(r.get("round"), r) for r in rounds], primary, select_from if trained else None)
    for role in sorted({role for r in rounds if isinstance(r.get("other_models"), dict) for role in r["other_models"]}):
        held = [r for r in rounds if isinstance(r.get("other_models"), dict) and isinstance(r["other_models"].get(role), dict)]
        for r in held:
            r["other_models"][role] = dict(r["other_models"][role])
        _slim_model([(r.get("round"), r["other_models"][role]) for r in held], primary, select_from)
    return out


def _slim_record(record: Any, primary: str, table_metric: str) -> Any:
    """One record's own fields (a round's other models: `_slim_site`), in a new dict."""
    record = _without(record, RECORD_DROPPED)
    if not isinstance(record, dict):
        return record
    if record.get("kind") == "round":
        record = {**record, **{k: _only(record[k], {primary}) for k in ROUND_PRIMARY_ONLY if k in record}}
        if isinstance(record.get("other_models"), dict):
            record["other_models"] = dict(record["other_models"])
    elif record.get("kind") in PER_EPOCH_KINDS:
        record = {**record, **{k: _only(record[k], {primary}) for k in PRIMARY_ONLY if k in record}}
        if "valid" in record:
            record["valid"] = _only(record["valid"], {table_metric})
    return record


def _slim_model(rounds: list[tuple[Any, dict[str, Any]]], primary: str, select_from: int | None) -> None:
    """One model's metrics (`valid`, `test`) in each of its round records ((round, metrics), changed in place): whole
    where a report can take the model's best or last round from them, elsewhere the primary metric. `select_from`: the
    first round the selection considers; None where a report takes nothing from them (the site's best and last hold
    what it reads): then none are kept."""
    if select_from is None:
        for _, metrics in rounds:
            for key in ROUND_METRICS:
                metrics.pop(key, None)
        return
    picked = _selectable(rounds, primary, select_from)
    for i, (_, metrics) in enumerate(rounds):
        if i not in picked:
            metrics.update({k: _only(metrics[k], {primary}) for k in ROUND_METRICS if k in metrics})


def _selectable(rounds: list[tuple[Any, dict[str, Any]]], primary: str, select_from: int) -> set[int]:
    """The rounds (indices into `rounds`) a report may take a model's best or last from: the last, and each eligible
    round (from `select_from` on, its validation primary metric a number) whose validation primary metric is at least
    every eligible one before it (the selection, prrfl.metrics.improves, takes the first maximum; ties are kept too).
    A round without a number for that metric, or without its round index, is kept whole."""
    picked, best = {len(rounds) - 1} if rounds else set(), None
    for i, (round_idx, metrics) in enumerate(rounds):
        score = metrics["valid"].get(primary) if isinstance(metrics.get("valid"), dict) else None
        if not isinstance(score, int | float) or not isinstance(round_idx, int):
            picked.add(i)
        elif round_idx >= select_from and not math.isnan(score) and (best is None or score >= best):
            picked.add(i)
            best = score
    return picked


def _slim_crosseval(data: dict[str, Any]) -> dict[str, Any]:
    primary = task_class(data.get("task", LEGACY_TASK)).metric_names[0]
    out = _no_per_site(_without(data, CROSSEVAL_DROPPED))
    if isinstance(out["cross_site"], dict):
        out["cross_site"] = {m: _without_per_model(row, primary) for m, row in out["cross_site"].items()}
    if isinstance(out.get("other_models"), dict):
        out["other_models"] = {role: _no_per_site(model) for role, model in out["other_models"].items()}
    return out


def _no_per_site(data: Any) -> Any:
    """A crosseval.json (or its part for one of the other models) without the per-site values of its generalization."""
    if not isinstance(data, dict):
        return data
    return {**data, **{part: _without(data[part], ("per_site",)) for part in CROSSEVAL_PARTS if part in data}}


def _without_per_model(row: Any, primary: str) -> Any:
    """A model's row of the cross-site matrix (test site -> metrics) with the primary metric only."""
    return {site: _only(values, {primary}) for site, values in row.items()} if isinstance(row, dict) else row
