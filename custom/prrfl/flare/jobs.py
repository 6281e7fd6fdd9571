"""The FLARE job folders under jobs/, generated from one table of configurations.

`prrfl jobs export` writes them and a test checks the committed folders still match. Each job is
one server app (PersonalizedWorkflow + a tracking receiver, prrfl.flare.tracking) and one client app (the Client API
script + the event converter that streams each site's scalars to the server) deployed to all sites.
"""

from __future__ import annotations

import contextlib
import functools
import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

from nvflare.apis.analytix import ANALYTIC_EVENT_TYPE
from nvflare.apis.dxo import DataKind
from nvflare.app_common.filters.percentile_privacy import PercentilePrivacy
from nvflare.app_common.filters.svt_privacy import SVTPrivacy
from nvflare.app_common.widgets.convert_to_fed_event import ConvertToFedEvent
from nvflare.client.config import ExchangeFormat
from nvflare.fuel.utils.constants import FrameworkType
from nvflare.job_config.api import FedJob
from nvflare.job_config.defs import FilterType
from nvflare.job_config.script_runner import ScriptRunner

from prrfl.config import RunConfig
from prrfl.flare.protocol import TASK_TRAIN
from prrfl.flare.tracking import receiver
from prrfl.flare.workflow import PersonalizedWorkflow
from prrfl.registry import method_class, method_names, task_class

SITE_SCRIPT = Path(__file__).parent / "entry" / "prrfl_site.py"

# The quick default: the embedded synthetic federation at 8% of Table I, 64 px, 5 rounds x 2 epochs.
QUICK: dict[str, Any] = {"num_rounds": 5, "local_epochs": 2}

# The paper's setting (TMI 2022, Sec. IV): 128 px, 50 rounds x 5 epochs, lr 1e-2 halved every 25
# epochs, batch 16; full Table I sizes for the synthetic federation (or set data_root per site).
PAPER: dict[str, Any] = {
    "num_rounds": 50,
    "local_epochs": 5,
    "data": {"image_size": 128, "synthetic_scale": 1.0, "synthetic_raw_size": [600, 450]},
}

# Prostate MRI, quick default: the embedded synthetic federation (5 sites, 30 % of the Table I cases,
# 64 px slices), a width-16 DeepLab-v2 ResNet-18, Adam 1e-3, batch 8, 10 rounds x 2 epochs.
PROSTATE_QUICK: dict[str, Any] = {
    "num_rounds": 10,
    "local_epochs": 2,
    "batch_size": 8,
    "optimizer": "adam",
    "lr": 1e-3,
    "lr_step_epochs": 1000,  # no decay (the paper states none for this task)
    "weight_decay": 0.0,
}

# The paper's prostate setting (TMI 2022, Sec. IV): 256 px slices, full Table I sizes, DeepLab-v2 with
# a ResNet-18 backbone (width 64), Adam 1e-3, batch 8, T = 60 epochs in rounds of E = 5.
PROSTATE_PAPER: dict[str, Any] = {
    **PROSTATE_QUICK,
    "num_rounds": 12,
    "local_epochs": 5,
    "data": {"image_size": 256, "model_width": 64, "synthetic_scale": 1.0, "synthetic_matrix_scale": 1.0},
}

# <task>_<method>: every registered method that applies to the task (the TMI paper's competitors) on
# the same pipeline, with the options its class docstring states as defaults.
def _method_jobs(task: str, settings: dict[str, Any]) -> dict[str, dict[str, Any]]:
    facts = task_class(task)(settings.get("data", {}))
    methods = [m for m in method_names() if method_class(m).unsupported_reason(facts) is None]
    return {f"{task}_{method}": {"task": task, "method": method, **settings} for method in methods}


JOBS: dict[str, dict[str, Any]] = {
    "derm_prr_paper": {"task": "derm", "method": "prr", **PAPER},
    **_method_jobs("derm", QUICK),
    "prostate_prr_paper": {"task": "prostate", "method": "prr", **PROSTATE_PAPER},
    **_method_jobs("prostate", PROSTATE_QUICK),
}


# FLARE's privacy filters, applied by each site to its train result (a weight difference) before it
# leaves the site, and only to weight differences (on full weights they would wreck the model);
# FLARE's default arguments otherwise, to be tuned per job in app/config/config_fed_client.json.
PRIVACY_FILTERS = {
    # share only the largest 90 % of |diff|, each clipped to 0.01
    "percentile": functools.partial(PercentilePrivacy, data_kinds=[DataKind.WEIGHT_DIFF]),
    # differential privacy by the sparse vector technique: a noisy 10 % of the diff
    "svt": functools.partial(SVTPrivacy, data_kinds=[DataKind.WEIGHT_DIFF]),
}


def job_config(name: str) -> RunConfig:
    if name not in JOBS:
        raise ValueError(f"unknown job '{name}'; available: {sorted(JOBS)}")
    return RunConfig.from_dict({"run_name": name, **JOBS[name]})


def build_job(
    name: str,
    cfg: RunConfig | None = None,
    min_clients: int = 1,
    privacy: str | None = None,
    resume: bool | str = False,
    tracking: str = "tensorboard",
    tracking_uri: str | None = None,
) -> FedJob:
    """resume: the workflow's resume mode (False, True or "auto", see PersonalizedWorkflow).
    tracking: "tensorboard" (event files in the server's run folder) or "mlflow" (tracking_uri: an MLflow
    tracking URI, default an SQLite file in the job's result folder); runs named as prrfl.flare.tracking says."""
    cfg = cfg or job_config(name)
    job = FedJob(name=name, min_clients=min_clients)
    job.to_server(PersonalizedWorkflow(config=cfg.to_dict(), resume=resume), id="workflow")
    job.to_server(receiver(tracking, tracking_uri, experiment=cfg.run_name), id="receiver")
    runner = ScriptRunner(
        script=SITE_SCRIPT.name,  # relative: resolved in the site's app/custom/, copied from the cwd
        framework=FrameworkType.PYTORCH,
        server_expected_format=ExchangeFormat.PYTORCH,
    )
    job.to_clients(runner)
    job.to_clients(ConvertToFedEvent(events_to_convert=[ANALYTIC_EVENT_TYPE]), id="event_to_fed")
    if privacy:
        if privacy not in PRIVACY_FILTERS:
            raise ValueError(f"unknown privacy filter '{privacy}'; available: {sorted(PRIVACY_FILTERS)}")
        job.to_clients(PRIVACY_FILTERS[privacy](), filter_type=FilterType.TASK_RESULT, tasks=[TASK_TRAIN])
    return job


def export_job(
    name: str,
    out_root: str | Path,
    cfg: RunConfig | None = None,
    min_clients: int = 1,
    bundle: bool = False,
    privacy: str | None = None,
    resume: bool | str = False,
    tracking: str = "tensorboard",
    tracking_uri: str | None = None,
) -> Path:
    """Write <out_root>/<name>/ (meta.json, app/config, app/custom/prrfl_site.py), replacing an old one.

    The sites import prrfl from their installation (pip install -e . on every site). bundle=True also
    copies the whole package into app/custom/ for sites that cannot install it (FLARE puts custom/
    on the path). privacy: one of PRIVACY_FILTERS, added to every site's train results. resume: the
    workflow's resume mode ("auto": a command that continues where an interrupted run stopped).
    tracking, tracking_uri: the tracking backend (build_job).
    """
    out_root = Path(out_root).resolve()
    with tempfile.TemporaryDirectory() as tmp, contextlib.chdir(tmp):
        shutil.copy(SITE_SCRIPT, SITE_SCRIPT.name)
        build_job(name, cfg, min_clients, privacy, resume, tracking, tracking_uri).export_job("export")
        exported = Path(tmp) / "export" / name
        # FLARE copies the imported modules it can trace, a partial package: keep it whole or not at all
        shutil.rmtree(exported / "app" / "custom" / "prrfl", ignore_errors=True)
        if bundle:
            package = Path(__file__).resolve().parents[1]
            shutil.copytree(package, exported / "app" / "custom" / "prrfl", ignore=shutil.ignore_patterns("__pycache__"))
        target = out_root / name
        if target.exists():
            shutil.rmtree(target)
        out_root.mkdir(parents=True, exist_ok=True)
        shutil.copytree(exported, target)
    return target


def job_files(folder: str | Path) -> dict[str, Any]:
    """A job folder's content (JSON parsed), for comparing an exported job with a committed one."""
    folder = Path(folder)
    content = {}
    for path in sorted(p for p in folder.rglob("*") if p.is_file() and "__pycache__" not in p.parts):
        rel = str(path.relative_to(folder))
        content[rel] = json.loads(path.read_text()) if path.suffix == ".json" else path.read_text()
    return content
