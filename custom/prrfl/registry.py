"""Tasks and methods by name, so a job config can name them."""

from __future__ import annotations

from prrfl.config import RunConfig
from prrfl.methods.base import Method
from prrfl.tasks.base import Task


def _tasks() -> dict[str, type[Task]]:
    from prrfl.tasks.derm import DermTask

    return {"derm": DermTask}


def _methods() -> dict[str, type[Method]]:
    from prrfl.methods.apfl import APFL
    from prrfl.methods.fedavg import FedAvg, FedBN, FedProx, SiloBN
    from prrfl.methods.fedproto import FedProto
    from prrfl.methods.fml import FML
    from prrfl.methods.ida import IDA
    from prrfl.methods.perfedavg import PerFedAvg
    from prrfl.methods.pfedme import PFedMe
    from prrfl.methods.prr import PRR
    from prrfl.methods.prr_variants import PRRFL, FedeAMC, FedFocal

    classes = (PRR, PRRFL, FedAvg, FedProx, SiloBN, IDA, FedBN, FedProto, FML, PerFedAvg, PFedMe, APFL, FedeAMC, FedFocal)
    return {cls.name: cls for cls in classes}


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

