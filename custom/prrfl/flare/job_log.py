"""A deployed job's progress on the console: its server log followed while FLARE's monitor waits.

FLARE's job monitor (the recipe's `get_result` on a PocEnv or ProdEnv) prints the job's meta and a dot per poll,
nothing of the rounds. `JobLogFollower` reads the server's log of the job as it grows (`<server>/<job id>/log.txt`
in a POC workspace) and prints the job's own lines: the prrfl components' (each round sent with the time left and
done with its metrics, the last aggregate's scores, the results table, cross-site evaluation), warnings and errors
of those components included; FLARE's plumbing is left in the log.
"""

from __future__ import annotations

import re
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TextIO

from prrfl.flare.console import PLUMBING_MESSAGES

# "<date> <time>,<ms> - <logger> - <LEVEL> - [<FLARE's context>] - <message>", the format of FLARE's log files
# (`stamp`: the date and time; prrfl.flare.failure reads them too)
RECORD = re.compile(
    r"^(?P<stamp>\d{4}-\d\d-\d\d (?P<time>\d\d:\d\d:\d\d),\d+) - (?P<name>\S+) - (?P<level>[A-Z]+) - (?:\[[^\]]*\] - )?(?P<msg>.*)$"
)
COMPONENTS = frozenset({"PersonalizedWorkflow", "CrossSiteEvaluation"})  # the server-side prrfl components, as FLARE names their loggers


def progress_line(line: str) -> tuple[bool, str | None]:
    """(whether `line` starts a log record, what to print of it: None when it is not the job's own)."""
    match = RECORD.match(line)
    if match is None:
        return False, None
    name, msg = match["name"], match["msg"]
    if (name in COMPONENTS or name.startswith("prrfl")) and not msg.startswith(PLUMBING_MESSAGES):
        level = "" if match["level"] == "INFO" else f"{match['level']}: "
        return True, f"[{match['time']}] {level}{msg}"
    return True, None


class JobLogFollower(threading.Thread):
    """Follows the log file `find()` returns (None until it exists), printing `progress_line`'s lines to `out`, and the
    lines that continue a printed record (a table); `stop()` reads what is left and ends."""

    def __init__(self, find: Callable[[], Path | None], out: TextIO | None = None, poll: float = 0.5):
        super().__init__(name="prrfl-job-log", daemon=True)
        self.find, self.out, self.poll = find, out or sys.stdout, poll
        self._done = threading.Event()
        self._showing = False

    def stop(self, timeout: float = 5.0) -> None:
        self._done.set()
        if self.is_alive():
            self.join(timeout)

    def _show(self, line: str) -> None:
        starts, shown = progress_line(line.rstrip("\n"))
        if starts:
            self._showing = shown is not None
        if shown is not None:
            print(shown, file=self.out, flush=True)
        elif self._showing and not starts:
            print(line.rstrip("\n"), file=self.out, flush=True)

    def run(self) -> None:
        path = None
        while path is None:
            path = self.find()
            if path is None and self._done.wait(self.poll):
                return
        with open(path, errors="replace") as f:
            pending = ""
            while True:
                chunk = f.readline()
                if chunk:
                    pending += chunk
                    if pending.endswith("\n"):
                        self._show(pending)
                        pending = ""
                    continue
                if self._done.is_set():
                    if pending:
                        self._show(pending)
                    return
                self._done.wait(self.poll)


def poc_server_log(poc_workspace: str | Path, job_id: str) -> Callable[[], Path | None]:
    """Where a POC deployment's server writes the log of job `job_id` (None until it does)."""

    def find() -> Path | None:
        return next(iter(sorted(Path(poc_workspace).glob(f"*/prod_*/server/{job_id}/log.txt"))), None)

    return find
