"""The FLARE jobs under jobs/: one table of configurations (task, method, settings).

Each job is built by the recipe (prrfl.flare.recipe.PersonalizedRecipe); `prrfl jobs export` writes the
folders and `prrfl jobs check` (and a test) checks the committed ones still match. No FLARE import here.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from prrfl.config import RunConfig, with_settings
from prrfl.registry import method_class, method_names, task_class

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
# 64 px slices), a width-16 DeepLab-v2 ResNet-18, Adam 1e-3, batch 8, 10 rounds x 2 epochs. The paper's
# schedule scaled to these 20 epochs: lr halved every 8 (25 of the paper's 60 epochs x 20 / 60 = 8.3),
# i.e. after epochs 8 and 16 as the paper's after 25 and 50.
PROSTATE_QUICK: dict[str, Any] = {
    "num_rounds": 10,
    "local_epochs": 2,
    "batch_size": 8,
    "optimizer": "adam",
    "lr": 1e-3,
    "lr_step_epochs": 8,
    "lr_gamma": 0.5,
    "weight_decay": 0.0,
}

# The paper's prostate setting (TMI 2022, Sec. IV): 256 px slices, full Table I sizes, DeepLab-v2 with
# a ResNet-18 backbone (width 64), Adam 1e-3, batch 8, T = 60 epochs in rounds of E = 5, "on both
# datasets ... the learning rate is divided by 2 after every 25 epochs".
PROSTATE_PAPER: dict[str, Any] = {
    **PROSTATE_QUICK,
    "num_rounds": 12,
    "local_epochs": 5,
    "lr_step_epochs": 25,
    "data": {"image_size": 256, "model_width": 64, "synthetic_scale": 1.0, "synthetic_matrix_scale": 1.0},
}


# The benchmark (`prrfl sweep --profile bench`), at the paper's E = 5 local epochs per round, so that PRR's DET can
# reach its Sublimate phase (a round's third epoch on; prrfl.algorithms.det.next_phase). The number of rounds is
# where FedAvg's global model stops climbing, by the rule of docs/calibration.md ("The schedule") read from a long
# FedAvg run: 12 rounds on dermoscopy (60 epochs; its global model predicts one class for the first rounds), 6 on
# prostate (30 epochs). Dermoscopy: 25 % of the Table I sizes (4x the quick jobs' images, so every site holds every
# class), 64 px, at the paper's lr 1e-2 halved every 25 epochs. Prostate: 60 % of the Table I cases, 128 px slices,
# the quick jobs' network and schedule (lr halved every 8 epochs). Every method runs the same schedule.
DERM_BENCH: dict[str, Any] = {"num_rounds": 12, "local_epochs": 5, "data": {"synthetic_scale": 0.25}}
PROSTATE_BENCH: dict[str, Any] = {**PROSTATE_QUICK, "num_rounds": 6, "local_epochs": 5, "data": {"image_size": 128, "synthetic_scale": 0.6}}

# The settings of every <task>_<method> job under a profile: "quick" (the committed jobs), "bench", "paper".
PROFILES: dict[str, dict[str, dict[str, Any]]] = {
    "quick": {"derm": QUICK, "prostate": PROSTATE_QUICK},
    "bench": {"derm": DERM_BENCH, "prostate": PROSTATE_BENCH},
    "paper": {"derm": PAPER, "prostate": PROSTATE_PAPER},
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


def job_config(name: str, profile: str = "quick") -> RunConfig:
    """The configuration of job `name`; under another profile than "quick", the <task>_<method> job
    with that profile's settings for its task in place of the quick ones."""
    if name not in JOBS:
        raise ValueError(f"unknown job '{name}'; available: {sorted(JOBS)}")
    if profile not in PROFILES:
        raise ValueError(f"unknown profile '{profile}'; available: {sorted(PROFILES)}")
    job = JOBS[name]
    if profile != "quick":
        job = {"task": job["task"], "method": job["method"], **PROFILES[profile][job["task"]]}
    return RunConfig.from_dict({"run_name": name, **job})


def job_values(name: str, base: Mapping[str, Any], overrides: Mapping[str, Any]) -> dict[str, Any]:
    """The config values of job `name` (its settings `base`, run_name the job's own) with `overrides`
    applied (dotted keys reach nested options, prrfl.config.with_settings); not yet validated."""
    return with_settings(RunConfig.from_dict({"run_name": name, **base}).to_dict(), overrides)


def job_files(folder: str | Path) -> dict[str, Any]:
    """A job folder's content (JSON parsed), for comparing an exported job with a committed one."""
    folder = Path(folder)
    content = {}
    for path in sorted(p for p in folder.rglob("*") if p.is_file() and "__pycache__" not in p.parts):
        rel = str(path.relative_to(folder))
        content[rel] = json.loads(path.read_text()) if path.suffix == ".json" else path.read_text()
    return content
