"""Why a job failed, from its log files: the first real error of its server and sites, on the command's last lines.

A job that fails inside FLARE's simulator ends `prrfl run` on FLARE's "Simulation failed with return code N"; the
cause (a site's exception, the workflow's refusal to start) is somewhere among the hundreds of lines above, and in the
participants' log files: `<simulator workspace>/<participant>/log.txt` (server, site-1, ...; a deployment's job
process writes `<participant>/<job id>/log.txt`). `find_cause` reads them and returns the earliest error that is a
cause: an exception (named by its type and message, "ValueError: ...": a site's exception reaches its log.txt as the
traceback its process printed, a record a line, around the error record that names the failed task), the reason of a
workflow's abort ("Aborting current RUN due to FATAL_SYSTEM_ERROR received: <reason>"), or another error record's
message; FLARE's follow-up errors once a job is going down (a failed download, "fire abort event", ...: NOISE) are
never a cause. `failure_lines` says it in two lines, the cause and the log file with its line, or, when none is
found, that none was and which logs to read.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import NamedTuple

from prrfl.flare.job_log import RECORD  # a FLARE log record's first line

STAMP = "%Y-%m-%d %H:%M:%S,%f"
ERROR_LEVELS = frozenset({"ERROR", "CRITICAL", "FATAL"})
TRACEBACK = "Traceback (most recent call last):"
EXCEPTION_LINE = re.compile(r"^(?P<type>[A-Za-z_][\w.]*)(?::\s*(?P<msg>.*))?$")
# FLARE's abort of a run carries the reason a component gave (prrfl's workflow: why the job cannot start or go on)
ABORT = re.compile(r"^Aborting current RUN due to \w+ received:\s*(?P<reason>.*)$")
# FLARE's errors that follow a cause as the job goes down (or a site stops waiting): never the cause themselves
NOISE = (
    "failed to download",
    "fire abort event",
    "abort_task",
    "KeyboardInterrupt",
    "SystemExit",
)
LOG_NAME = "log.txt"
# folders between a participant's folder and its job log: the simulator's job, a deployment's download
JOB_FOLDERS = frozenset({"simulate_job", "workspace"})
PRINTED = timedelta(seconds=2)  # a printed traceback's records follow its first within this
NEAR = timedelta(seconds=2)  # an error record and the traceback its process printed are this close in time
MAX_CHARS = 300  # a cause longer than this is cut, with "..."
MAX_NAMED = 6  # log files named when no cause is found


@dataclass(frozen=True)
class Cause:
    """A job's failure as its log says it: which process (server, site-1), what (an exception "ValueError: ...", or
    an error record's message), and where (the log file, and the line where the record or the traceback starts, 1-based)."""

    process: str
    text: str
    path: Path
    line: int

    def __str__(self) -> str:
        return f"{self.process}: {self.text}"


def log_files(root: str | Path, job_id: str | None = None, since: float | None = None) -> list[Path]:
    """The log files under `root`, the oldest part of each rotated log first (log.txt.2, log.txt.1, log.txt), in path
    order: every `log.txt` at most four folders down (a simulator workspace: <participant>/log.txt; a POC workspace:
    <project>/prod_NN/<participant>/<job id>/log.txt). job_id: only those in a folder of that name; since: only those
    written to at or after that time (time.time()), which leaves out another run's."""
    root = Path(root)
    found = []
    for depth in range(5):
        for path in sorted(root.glob("/".join(["*"] * depth + [LOG_NAME]))):
            if job_id is not None and job_id not in path.relative_to(root).parts[:-1]:
                continue
            rotated = sorted(path.parent.glob(f"{LOG_NAME}.*"), key=_rotation, reverse=True)
            found += [p for p in [*rotated, path] if p.is_file() and _rotation(p) >= 0 and _recent(p, since)]
    return found


def _rotation(path: Path) -> int:
    """0 for log.txt, N for log.txt.N, -1 for another name."""
    suffix = path.name[len(LOG_NAME) :]
    if not suffix:
        return 0
    return int(suffix[1:]) if suffix[1:].isdigit() else -1


def _recent(path: Path, since: float | None) -> bool:
    try:
        return since is None or path.stat().st_mtime >= since
    except OSError:
        return False


def process_name(path: Path, root: Path, job_id: str | None = None) -> str:
    """The participant a log file belongs to: the nearest folder above it that is not a job's (simulate_job, the job
    id, a download's workspace/); "server" for a log at the root (a downloaded server workspace)."""
    skip = JOB_FOLDERS | ({job_id} if job_id else set())
    folders = [p for p in Path(path).relative_to(root).parts[:-1] if p not in skip]
    return folders[-1] if folders else "server"


class Record(NamedTuple):
    """A log record: its first line's number (1-based), time stamp, level, logger, and lines (the message's first line,
    then the lines that continue it: a traceback, a table)."""

    line: int
    stamp: datetime
    level: str
    name: str
    lines: list[str]


def records(lines: Iterable[str]) -> Iterator[Record]:
    """The log records of a file's lines. Lines before the first record (the tail of a rotated record) are left out."""
    current: Record | None = None
    for number, raw in enumerate(lines, 1):
        line = raw.rstrip("\n")
        match = RECORD.match(line)
        stamp = _stamp(match["stamp"]) if match else None
        if stamp is None:
            if current is not None:
                current.lines.append(line)
            continue
        if current is not None:
            yield current
        current = Record(number, stamp, match["level"], match["name"], [match["msg"]])
    if current is not None:
        yield current


def _stamp(text: str) -> datetime | None:
    try:
        return datetime.strptime(text, STAMP)
    except ValueError:  # digits that are no time (a month 13): not a record's start
        return None


def exception_of(lines: list[str]) -> str | None:
    """The exception a traceback in `lines` ends with ("ValueError: bad value"), from the last traceback in them (a
    chained exception's outermost one); None when they hold no traceback."""
    starts = [i for i, line in enumerate(lines) if line.strip() == TRACEBACK or line.endswith(TRACEBACK)]
    if not starts:
        return None
    for line in lines[starts[-1] + 1 :]:
        if line and not line[0].isspace():
            match = EXCEPTION_LINE.match(line)
            if match is None:
                return line.strip()
            kind = match["type"].rsplit(".", 1)[-1]  # prrfl.config.ConfigError: ConfigError
            return f"{kind}: {match['msg']}" if match["msg"] else kind
    return None


def printed_tracebacks(recs: list[Record]) -> list[tuple[Record, str]]:
    """The tracebacks a process printed (its stderr, which FLARE's script runner logs a chunk a record, at INFO:
    "Traceback (most recent call last):", then a record per frame and one for the exception): (the record of the
    traceback's first line, its exception). A traceback is the records of the same logger within PRINTED of its first."""
    found = []
    i = 0
    while i < len(recs):
        head = recs[i]
        i += 1
        if head.level in ERROR_LEVELS or head.lines[0].strip() != TRACEBACK:
            continue
        lines = list(head.lines)
        while i < len(recs) and recs[i].name == head.name and recs[i].stamp - head.stamp <= PRINTED:
            lines += recs[i].lines
            i += 1
        text = exception_of(lines)
        if text is not None:
            found.append((head, text))
    return found


def trimmed(text: str, process: str) -> str | None:
    """A cause's text on one line, the process named once and cut to MAX_CHARS; None for FLARE's follow-up noise."""
    text = " ".join(text.split())
    if not text or any(noise in text for noise in NOISE):
        return None
    # "site site-1: ..." or "ValueError: site site-1: ..." said by site-1 itself: the process is named once
    text = re.sub(rf"^((?:[A-Za-z_]\w*: )?)(?:site )?{re.escape(process)}: ", r"\1", text, count=1)
    return text if len(text) <= MAX_CHARS else text[: MAX_CHARS - 3].rstrip() + "..."


def file_causes(recs: list[Record]) -> Iterator[tuple[datetime, int, str]]:
    """The causes in a log file's records: (time, line, text before trimming). An error record says what its own
    traceback's exception is; without one, the exception of a traceback the process printed around it (NEAR: a logged
    exception's traceback reaches the file on the process's stderr, at times before the error record itself); without
    either, its message (an abort's: the reason). A printed traceback near no error record is a cause of its own."""
    printed = printed_tracebacks(recs)
    used = set()
    for rec in recs:
        if rec.level not in ERROR_LEVELS:
            continue
        text, line = exception_of(rec.lines), rec.line
        if text is None:
            near = [(head, exc) for head, exc in printed if abs(head.stamp - rec.stamp) <= NEAR]
            if near:
                head, text = min(near, key=lambda found: abs(found[0].stamp - rec.stamp))
                used.add(head.line)
                line = head.line
            else:
                abort = ABORT.match(rec.lines[0].strip())
                text = abort["reason"] if abort else rec.lines[0]
        yield rec.stamp, line, text
    for head, text in printed:
        if head.line not in used:
            yield head.stamp, head.line, text


def find_cause(root: str | Path, job_id: str | None = None, since: float | None = None) -> Cause | None:
    """The earliest cause (by its time stamp, across the log files under `root`: log_files) that is not FLARE's
    follow-up noise (file_causes, trimmed), or None."""
    root = Path(root)
    best: tuple[datetime, int, Cause] | None = None
    for order, path in enumerate(log_files(root, job_id, since)):
        process = process_name(path, root, job_id)
        try:
            with open(path, errors="replace") as f:
                recs = list(records(f))
        except OSError:
            continue
        for stamp, line, raw in file_causes(recs):
            text = trimmed(raw, process)
            if text is not None and (best is None or (stamp, order) < best[:2]):
                best = (stamp, order, Cause(process, text, path, line))
    return best[2] if best else None


def failure_lines(workspace: str | Path, job_id: str | None = None, since: float | None = None) -> list[str]:
    """What a command prints before its error line when a job failed: the cause and the log file it is in, or that
    no cause was found and the log files to read (or that there are none). Never raises: the command's error and exit
    status follow whatever the logs hold."""
    try:
        cause = find_cause(workspace, job_id, since)
        files = [p for p in log_files(workspace, job_id, since) if p.name == LOG_NAME]
    except Exception as e:  # a bug here must not replace the job's own error
        return [f"prrfl: no cause found: reading the job's logs under {workspace} failed ({type(e).__name__}: {e})"]
    if cause is not None:
        return [f"prrfl: cause: {cause}", f"prrfl: from line {cause.line} of {cause.path}"]
    if not files:
        return [f"prrfl: no cause found: no log file of the job under {workspace}"]
    named = ", ".join(str(p) for p in files[:MAX_NAMED]) + (f" and {len(files) - MAX_NAMED} more" if len(files) > MAX_NAMED else "")
    return [f"prrfl: no cause found in the job's logs; read {named}"]
