"""The FLARE jobs under jobs/: one table of configurations (task, method, settings).

Each job is built by the recipe (prrfl.flare.job_recipe.PersonalizedRecipe); `prrfl jobs export` writes the
folders and `prrfl jobs check` (and a test) checks the committed ones still match. No FLARE import here.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from prrfl.config import RunConfig, with_settings
from prrfl.registry import method_class, method_names, task_class, task_names
from prrfl.tasks.contract import PROFILE_NAMES

# The settings of every <task>_<method> job under a profile: "quick" (the committed jobs), "bench", "paper"; each
# task states its own (Task.profiles).
PROFILES: dict[str, dict[str, dict[str, Any]]] = {
    profile: {task: task_class(task).profiles[profile] for task in task_names()} for profile in PROFILE_NAMES
}


# <task>_<method>: every registered method that applies to the task (the TMI paper's competitors) on
# the same pipeline, with the options its class docstring states as defaults.
def _method_jobs(task: str, settings: dict[str, Any]) -> dict[str, dict[str, Any]]:
    facts = task_class(task)(settings.get("data", {}))
    methods = [m for m in method_names() if method_class(m).unsupported_reason(facts) is None]
    return {f"{task}_{method}": {"task": task, "method": method, **settings} for method in methods}


# per task: <task>_prr_paper (PRR at the paper's setting), then its <task>_<method> jobs
JOBS: dict[str, dict[str, Any]] = {
    name: job
    for task in task_names()
    for name, job in {
        f"{task}_prr_paper": {"task": task, "method": "prr", **PROFILES["paper"][task]},
        **_method_jobs(task, PROFILES["quick"][task]),
    }.items()
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
