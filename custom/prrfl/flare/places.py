"""Where the workflow and the sites keep what must survive a re-run, and the check that they can write there.

* Deployment (a job on a provisioned server or site): `<participant workspace>/prrfl/<run_name>/`, beside
  FLARE's startup/ and local/ folders, which FLARE leaves alone from one job to the next.
* Simulator: every `nvflare simulator` run deletes its workspace except startup/ and local/ (which it
  copies into every participant, so large files do not belong there either). The state therefore goes
  beside the workspace: `<simulator workspace>.state/<participant>/<run_name>/`; e.g. for
  `-w workspace/derm_prr`, the server's state is in `workspace/derm_prr.state/server/derm_prr/`.

A new run (not a resumed one) first moves an earlier run's state folder aside (`set_aside_previous_run`).
A site's results.json is also written under its workspace (`<site workspace>/prrfl/<run_name>/`), where
`prrfl results` and `prrfl report` look; in a deployment both places are the same folder.
"""

from __future__ import annotations

import os
import shutil
import uuid
from pathlib import Path

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
        simulator_root = Path(workspace_root).resolve().parent
        return simulator_root.with_name(simulator_root.name + STATE_SUFFIX) / participant / run_name
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
