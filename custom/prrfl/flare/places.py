"""Where the workflow and the sites keep what must survive a re-run, and the check that they can write there.

* Deployment (a job on a provisioned server or site): `<participant workspace>/prrfl/<run_name>/`, beside
  FLARE's startup/ and local/ folders, which FLARE leaves alone from one job to the next.
* Simulator: every `nvflare simulator` run deletes its workspace except startup/ and local/ (which it
  copies into every participant, so large files do not belong there either). The state therefore goes
  beside the workspace: `<simulator workspace>.state/<participant>/<run_name>/`; e.g. for
  `-w workspace/derm_prr`, the server's state is in `workspace/derm_prr.state/server/derm_prr/`.

A new run (not a resumed one) first moves an earlier run's state folder aside (`set_aside_previous_run`).
A workspace holds one running job at a time (`RunLock`): the server takes a lock before anything is read
or moved, so a second job started on the same simulator workspace (or, in a deployment, a second job of the
same run_name) is refused in one line naming the run that holds it, instead of moving its live state aside.
FLARE's simulator empties its workspace before that check can run, though: the first job finds its run folder's
marker gone (`mark_workspace`), trains on, and ends with an error (exit status 2) whose line says what was lost
and where the rest is (`emptied_report`).
A site's results.json is also written under its workspace (`<site workspace>/prrfl/<run_name>/`), where
`prrfl results` and `prrfl report` look; in a deployment both places are the same folder.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import socket
import time
import uuid
from pathlib import Path
from typing import Any

from nvflare.private.fed.simulator.simulator_const import SimulatorConstants

from prrfl.storage import set_aside

STATE_SUFFIX = ".state"


def in_simulator(job_id: str | None) -> bool:
    """FLARE's simulator runs every job under one fixed job id (FLARE's MLflow receiver tells it the same way)."""
    return job_id == SimulatorConstants.JOB_NAME


def default_state_dir(workspace_root: Path, participant: str, run_name: str, job_id: str | None) -> Path:
    """workspace_root: this participant's FLARE workspace (`<simulator workspace>/<participant>` in the
    simulator, the startup kit's folder in a deployment)."""
    if in_simulator(job_id):
        return simulator_state_root(Path(workspace_root).resolve().parent) / participant / run_name
    return output_dir(workspace_root, run_name)


def output_dir(workspace_root: Path, run_name: str) -> Path:
    """Where a participant's results files go inside its workspace (found by `prrfl results` / `report`)."""
    return Path(workspace_root).resolve() / "prrfl" / run_name


def ensure_writable(folder: Path, owner: str, setting: str) -> Path:
    """Create `folder` and prove a file can be written and renamed in it, before any work is done.
    owner: who needs it ("site msk"); setting: how to choose another folder. Raises OSError naming both."""
    folder = Path(folder)
    probe = folder / f".write-test-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    try:
        folder.mkdir(parents=True, exist_ok=True)
        probe.write_bytes(b"")
        probe.replace(probe.with_suffix(".ok"))
        probe.with_suffix(".ok").unlink()
    except OSError as e:
        raise OSError(f"{owner}: state folder {folder} is not writable ({e.strerror or e}); {setting}") from e
    return folder


def set_aside_previous_run(folder: Path) -> Path | None:
    """Before a new run writes into `folder`, move what an earlier run left there to
    `<folder>.replaced-<time>` beside it, so a new run never overwrites another's state (rename it back to
    resume that run). Only the latest such copy is kept. Returns where the files went, None if there were none."""
    folder = Path(folder)
    if not folder.is_dir() or not any(folder.iterdir()):
        return None
    for older in folder.parent.glob(f"{folder.name}.replaced-*"):
        shutil.rmtree(older, ignore_errors=True)
    return set_aside(folder, "replaced")


def differences(saved: dict[str, Any], now: dict[str, Any], limit: int = 4) -> list[str]:
    """What differs between what a saved state records of its run and this job, one "key: <saved> saved, <now>
    now" per differing key in key order (a dict on both sides: per inner key, "key.inner"), the first `limit`
    of them and "..." for the rest. The checks of a resume name with it what makes a state another run's."""

    def shown(values: dict[str, Any], key: str) -> str:
        return f"{values[key]!r:.60}" if key in values else "absent"

    found = []
    for key in sorted(set(saved) | set(now), key=str):
        if key in saved and key in now and saved[key] == now[key]:
            continue
        if isinstance(saved.get(key), dict) and isinstance(now.get(key), dict):
            found += [f"{key}.{inner}" for inner in differences(saved[key], now[key], limit=len(saved[key]) + len(now[key]))]
        else:
            found.append(f"{key}: {shown(saved, key)} saved, {shown(now, key)} now")
    return found[:limit] + (["..."] if len(found) > limit else [])


def lock_file(workspace_root: Path, state_dir: Path, job_id: str | None) -> Path:
    """The lock a running job holds: in the simulator one per simulator workspace (every run there shares
    `<ws>.state/`, and a second simulator run wipes the first one's workspace), in a deployment one per state
    folder (FLARE keeps jobs apart by job id; only two jobs of the same run_name would share a folder)."""
    if in_simulator(job_id):
        return simulator_lock_file(Path(workspace_root).resolve().parent)
    state_dir = Path(state_dir).resolve()
    return state_dir.with_name(state_dir.name + ".lock")


def simulator_lock_file(simulator_workspace: Path) -> Path:
    """The lock of a simulator workspace (`-w`), beside it with the state: `<ws>.state/running.lock`."""
    return simulator_state_root(simulator_workspace) / "running.lock"


def simulator_state_root(simulator_workspace: Path) -> Path:
    """`<ws>.state`, beside a simulator workspace `<ws>` (`-w`): where every run there keeps its state."""
    simulator_workspace = Path(simulator_workspace).resolve()
    return simulator_workspace.with_name(simulator_workspace.name + STATE_SUFFIX)


RUNNING_MARKER = ".prrfl-running"


def mark_workspace(folder: Path, text: str) -> Path | None:
    """A marker in the server's run folder of the workspace; its disappearance tells the job that its workspace was
    emptied while it ran (a second `nvflare simulator` on it). None when it cannot be written."""
    marker = Path(folder) / RUNNING_MARKER
    try:
        marker.parent.mkdir(parents=True, exist_ok=True)
        marker.write_text(text)
    except OSError:
        return None
    return marker


def emptied_warning(run_dir: Path, found: str, state_root: Path) -> str:
    """The warning of a simulator job that finds its workspace emptied while it runs (`found`: "after round 3")."""
    return (
        f"{run_dir} was emptied while this job ran (found {found}; a second `nvflare simulator` on the same workspace?): "
        f"what it wrote there (log files, TensorBoard events) is lost; the job goes on, its checkpoints and results are in {state_root}, "
        "and it will end with an error saying what was lost"
    )


def emptied_report(
    run: str,
    workspace: Path,
    found: str,
    state_dir: Path,
    run_dir: Path,
    run_name: str,
    tensorboard: Path | None = None,
    cross_site: bool = False,
) -> str:
    """The line a simulator job whose workspace was emptied while it ran ends with (an error, exit status 2): what
    is lost and where what is kept is. run: "run <id> of '<run_name>'"; found: when the job saw it ("after round
    3"); state_dir: the server's state folder (`<ws>.state/server/<run_name>`); run_dir: the server's run folder
    in the workspace, where the results were written again; tensorboard: the job's TensorBoard folder, when events
    written there were lost (prrfl.flare.tracking.TensorBoardReceiver.lost); cross_site: whether a cross-site evaluation was to follow (it is not run)."""
    workspace, state_dir = Path(workspace), Path(state_dir)
    lost = [f"its log files in {workspace} (what the simulator printed holds the whole log)"]
    if tensorboard is not None:
        lost.append(f"its TensorBoard events ({tensorboard})")
    if cross_site:
        lost.append("its cross-site evaluation, not run (the sites' folders are gone)")
    kept = (
        f"the checkpoints and results in {simulator_state_root(workspace)} (the server's in {state_dir}), the results also "
        f"written again to {Path(run_dir) / 'results.json'} and each site's {workspace}/<site>/prrfl/{run_name}/results.json"
    )
    remedy = f"; `prrfl crosseval {workspace}` computes the cross-site matrix from them" if cross_site else ""
    return (
        f"{run} finished training, but the simulator workspace {workspace} was emptied while it ran (found {found}; a second "
        f"`nvflare simulator` on it?). Lost: {'; '.join(lost)}. Kept: {kept}{remedy}"
    )


class WorkspaceBusy(OSError):
    """Another job holds the lock; `holder` is what it wrote into the lock file."""

    def __init__(self, message: str, holder: dict[str, Any]):
        super().__init__(message)
        self.holder = holder


def busy_message(what: str, holder: dict[str, Any]) -> str:
    """The one line that refuses a second job: `what` (e.g. "the simulator workspace /w") is in use by whom."""
    return f"{what} is in use by {RunLock.describe(holder)}: wait for that job to end, or give this one another workspace"


class RunLock:
    """An exclusive lock (flock) on a file that names its holder. The operating system releases it when the
    holding process ends, however it ends (a kill -9 leaves no stale lock); the file itself stays."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self._fd: int | None = None
        self._info: dict[str, Any] = {}

    def acquire(self, **holder: Any) -> RunLock:
        """Take the lock and write `holder` (who holds it) into the file; raises WorkspaceBusy naming the
        holder when another process has it."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            holder = self.holder()
            raise WorkspaceBusy(busy_message(str(self.path), holder), holder) from None
        self._fd = fd
        self._info = {"pid": os.getpid(), "host": socket.gethostname(), "since": time.strftime("%Y-%m-%d %H:%M:%S")}
        self.update(**holder)
        return self

    def update(self, **holder: Any) -> None:
        """Rewrite who holds the lock (e.g. the run id, once it is known)."""
        if self._fd is None:
            return
        self._info.update(holder)
        data = json.dumps(self._info, sort_keys=True).encode()
        os.ftruncate(self._fd, 0)
        os.pwrite(self._fd, data, 0)

    def holder(self) -> dict[str, Any]:
        try:
            info = json.loads(self.path.read_text() or "{}")
            return info if isinstance(info, dict) else {}
        except (OSError, ValueError):
            return {}

    @staticmethod
    def describe(info: dict[str, Any]) -> str:
        if not info:
            return "another process (it has not said which yet)"
        run = f"run {info['run_id']} of " if info.get("run_id") else ""
        return f"{run}job '{info.get('run_name', '?')}' (pid {info.get('pid', '?')} on {info.get('host', '?')}, since {info.get('since', '?')})"

    def release(self) -> None:
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None
