"""The runs under a folder, whatever wrote them (`prrfl results`): each run's server summary (`RunResults`) or its
sites' own files, one table per run with its cross-site matrix."""

from __future__ import annotations

import logging
import os
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prrfl.crosseval import CROSSEVAL_FILE
from prrfl.kept import is_kept
from prrfl.registry import task_class
from prrfl.report.protocol import run_matrix
from prrfl.report.runs import LEGACY_TASK
from prrfl.storage import existing_json, find_json, holder, load_json
from prrfl.summary import results_table

log = logging.getLogger(__name__)


RESULTS_FILE = "results.json"


@dataclass(frozen=True)
class RunResults:
    """One run's per-site summaries: the server's results.json when the folder holds one (it adds each
    site's participation), else the sites' own files."""

    name: str
    run_id: str
    task: str
    source: str  # where the numbers come from, for the table's title
    summaries: dict[str, dict[str, Any]]
    crosseval: dict[str, Any] | None = None  # the crosseval.json beside the server's results.json (FLARE's cross-site evaluation)

    def title(self) -> str:
        return f"{self.name} (run {self.run_id}, task {self.task}): {self.source}{self.unfinished()}"

    def unfinished(self) -> str:
        """A warning for the title when the run has not completed its rounds (interrupted, or still running): its
        numbers are those so far, not its results. Empty for a finished run, or where the files do not say
        (results written before they recorded the run's rounds)."""
        planned = max((s.get("num_rounds") or 0 for s in self.summaries.values()), default=0)
        done = max((s.get("rounds_completed") or 0 for s in self.summaries.values()), default=0)
        if not planned or done >= planned:
            return ""
        return f". NOT FINISHED: {done} of {planned} rounds done (interrupted, or still running); the numbers so far, not the run's results"

    def table(self) -> str:
        """The per-site table; then the cross-site matrix of the task's primary metric, when the run has one."""
        facts = task_class(self.task)
        table = results_table(self.summaries, facts.table_metrics, facts.table_note)
        if self.crosseval:
            matrix = run_matrix(self.crosseval, self.task)
            table += f"\n\nCross-site evaluation: each site's best model (rows) on each site's test split\n\n{matrix}"
        return table


def server_run(path: Path, data: dict[str, Any]) -> RunResults:
    """The run of a server's results.json (`data`, read from `path`), with the crosseval.json beside it."""
    config = data["config"]
    crosseval = existing_json(path.with_name(CROSSEVAL_FILE))
    return RunResults(
        config.get("run_name", "?"),
        str(data.get("run_id")),
        config.get("task", LEGACY_TASK),
        str(path),
        data["sites"],
        None if crosseval is None else load_json(crosseval),
    )


def results_kind(data: Any) -> str | None:
    """'server' for the workflow's results.json, 'site' for a site's, None for a file of another shape."""
    if not isinstance(data, dict):
        return None
    sites = data.get("sites")
    if isinstance(sites, dict) and isinstance(data.get("config"), dict) and all(isinstance(s, dict) for s in sites.values()):
        return "server"
    return "site" if isinstance(data.get("site"), str) and "best" in data else None


def find_runs(folder: str | Path) -> tuple[list[RunResults], list[str]]:
    """The runs whose results.json files lie anywhere under `folder` (or `folder` itself, a results.json or a kept
    run), and a note for every results.json skipped (unreadable, or not a prrfl run's).

    Searching at any depth covers every workspace this product writes: a simulator workspace
    (server/simulate_job/, site-N/prrfl/<run>/), a `prrfl run` workspace (<job>/ and <job>.state/ in it),
    a POC workspace (<project>/prod_00/: the participants' prrfl/<run>/ folders and the admin's downloads
    in transfer/<job id>/), a `prrfl deploy poc` folder (the same, and result/) and kept runs (prrfl.kept:
    <run>.kept.json.gz, read as the workspace it was). The same run is
    found there several times (the workspace copy, the state copy, the download): it is one run, keyed
    by its run id; a site's copies agree, or the one with more rounds is the newer. Runs come by name,
    then oldest first (e.g. a run set aside as <run>.replaced-<time> before the run that replaced it)."""
    folder = Path(folder)
    files = [folder] if folder.is_file() and not is_kept(folder) else find_json(folder, RESULTS_FILE, recursive=True)
    servers: dict[str, tuple[Path, dict[str, Any]]] = {}
    sites: dict[str, dict[str, tuple[Path, dict[str, Any]]]] = defaultdict(dict)
    notes = []
    for path in files:
        try:
            data = load_json(path)
        except (OSError, ValueError) as e:
            notes.append(f"{path}: skipped, not readable as JSON ({e})")
            continue
        kind = results_kind(data)
        if kind == "server":
            servers.setdefault(str(data.get("run_id")), (path, data))
        elif kind == "site":
            copies, site = sites[str(data.get("run_id") or data.get("run_name"))], data["site"]
            if site not in copies or (data.get("rounds_completed") or 0) > (copies[site][1].get("rounds_completed") or 0):
                copies[site] = (path, data)
        else:
            notes.append(
                f"{path}: skipped, not a prrfl results file (neither the server's 'sites' and 'config' nor a site's 'site' and 'best')"
            )
    runs = []  # (name, when written, run)
    for run_id in servers.keys() | sites.keys():
        if run_id in servers:
            path, data = servers[run_id]
            run = server_run(path, data)
            written = holder(path).stat().st_mtime
        else:
            found = sites[run_id]
            first = next(iter(found.values()))[1]
            where = Path(os.path.commonpath([p.parent for p, _ in found.values()]))
            source = f"the sites' results.json under {where} (no server results.json)"
            run = RunResults(
                first.get("run_name", "?"), run_id, first.get("task", LEGACY_TASK), source, {s: d for s, (_, d) in found.items()}
            )
            written = max(holder(p).stat().st_mtime for p, _ in found.values())
        runs.append((run.name, written, run))
    return [run for *_, run in sorted(runs, key=lambda r: r[:2])], notes


# ----- discovery ---------------------------------------------------------------------------
