"""Tasks and methods by name, so a job config can name them."""

from __future__ import annotations

from prrfl.config import RunConfig
from prrfl.methods.base import Method
from prrfl.tasks.base import Task


def _tasks() -> dict[str, type[Task]]:
    from prrfl.tasks.derm import DermTask

    return {"derm": DermTask}


def _methods() -> dict[str, type[Method]]:
    from prrfl.methods.prr import PRR

    return {"prr": PRR}


def build_task(cfg: RunConfig) -> Task:
    tasks = _tasks()
    if cfg.task not in tasks:
        raise ValueError(f"unknown task '{cfg.task}'; available: {sorted(tasks)}")
    return tasks[cfg.task](cfg.data)


def build_method(cfg: RunConfig, task: Task) -> Method:
    methods = _methods()
    if cfg.method not in methods:
        raise ValueError(f"unknown method '{cfg.method}'; available: {sorted(methods)}")
    return methods[cfg.method](cfg, task, **cfg.method_args)


def method_names() -> list[str]:
    return sorted(_methods())

