"""What a kept run (prrfl.kept) keeps of a run's files: everything a report reads, every number as it is, so that a
report built from kept runs is the report built from their workspaces, byte for byte. Left out:

* of a site's results: the paths of the machine it ran on (data_root, state_dir), the counts no table reads
  (num_train, rounds_missed), the wall-clock timings of its rounds; of its last round, only the test metrics (the
  tables' "last round" column); of its per-epoch records (kind "epoch" and "download"), whose test metrics only the
  curves and the retrogress read, only the task's primary metric of `test` and `shared_test` (their validation
  metrics, which benchmarks/global_curve.py reads, whole);
* of the server's results: of each site's summary, what the site's own results file holds (last, ood, download_drop);
* of a crosseval.json: the hashes of the weights FLARE's cross-site evaluation scored (models).
"""

from __future__ import annotations

from typing import Any

from prrfl import kept
from prrfl.registry import task_class
from prrfl.report.runs import LEGACY_TASK

SITE_DROPPED = ("data_root", "state_dir", "num_train", "rounds_missed")
RECORD_DROPPED = ("timing",)
PER_EPOCH_KINDS = ("epoch", "download")
PER_EPOCH_PRIMARY_ONLY = ("test", "shared_test")
SERVER_SITE_DROPPED = ("last", "ood", "download_drop")
CROSSEVAL_DROPPED = ("models",)


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
        return _without(data, CROSSEVAL_DROPPED)
    return data


def _without(data: Any, keys: tuple[str, ...]) -> Any:
    return {k: v for k, v in data.items() if k not in keys} if isinstance(data, dict) else data


def _slim_site(data: dict[str, Any]) -> dict[str, Any]:
    primary = task_class(data.get("task", LEGACY_TASK)).metric_names[0]
    last = data.get("last")
    out = _without(data, SITE_DROPPED)
    if isinstance(last, dict) and "test" in last:
        out["last"] = {"test": last["test"]}
    out["history"] = [_slim_record(r, primary) for r in data["history"]]
    return out


def _slim_record(record: Any, primary: str) -> Any:
    record = _without(record, RECORD_DROPPED)
    if not isinstance(record, dict) or record.get("kind") not in PER_EPOCH_KINDS:
        return record
    for key in PER_EPOCH_PRIMARY_ONLY:
        if isinstance(record.get(key), dict) and primary in record[key]:
            record[key] = {primary: record[key][primary]}
    return record
