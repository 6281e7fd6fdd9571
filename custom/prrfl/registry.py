"""Tasks and methods by name, so a job config can name them; and the whole-config check."""

from __future__ import annotations

import importlib
from typing import Any

from prrfl.config import ConfigError, RunConfig, check_name, check_options
from prrfl.methods.method import Method
from prrfl.tasks.classification import ClassificationTask
from prrfl.tasks.contract import Task

# Each task by name, as "module:class": a site imports only its own task (the prostate task's MONAI is seconds of
# start-up a dermoscopy site does not need). Adding a task is one line here.
TASKS: dict[str, str] = {
    "derm": "prrfl.tasks.derm.task:DermTask",
    "isic2019": "prrfl.tasks.isic2019.task:Isic2019Task",
    "prostate": "prrfl.tasks.prostate.task:ProstateTask",
}


def _methods() -> dict[str, type[Method]]:
    from prrfl.methods.apfl import APFL
    from prrfl.methods.balancefl import BalanceFL
    from prrfl.methods.body_head import FedBABU, FedRep
    from prrfl.methods.creff import CReFF
    from prrfl.methods.fca import FCA
    from prrfl.methods.fedavg import FedAvg, FedBN, FedProx, SiloBN
    from prrfl.methods.fedproto import FedProto
    from prrfl.methods.fml import FML
    from prrfl.methods.harmofl import HarmoFL
    from prrfl.methods.ida import IDA
    from prrfl.methods.label_skew import FedLC, FedRS
    from prrfl.methods.local import Local
    from prrfl.methods.moon import MOON
    from prrfl.methods.perfedavg import PerFedAvg
    from prrfl.methods.pfedme import PFedMe
    from prrfl.methods.prr import PRR
    from prrfl.methods.prr_variants import PRRFL, FedeAMC, FedFocal

    classes = (PRR, PRRFL, FedAvg, FedProx, SiloBN, IDA, FedBN, FedProto, FML, PerFedAvg, PFedMe, APFL, FedeAMC, FedFocal, FCA, HarmoFL)
    classes += (Local, FedLC, FedRS, MOON, FedRep, FedBABU, BalanceFL, CReFF)  # FCA's Table 4 competitors
    return {cls.name: cls for cls in classes}


def task_class(name: str) -> type[Task]:
    """The task class called `name` (a ConfigError naming the config field 'task' otherwise), imported on demand."""
    check_name(name, TASKS, "task")
    module, cls = TASKS[name].split(":")
    return getattr(importlib.import_module(module), cls)


def task_names() -> list[str]:
    return sorted(TASKS)


def build_task(cfg: RunConfig) -> Task:
    """The task named by the config, given its data options (the task checks them)."""
    return task_class(cfg.task)(cfg.data)


def method_class(name: str) -> type[Method]:
    """The method class called `name` (a ConfigError naming the config field 'method' otherwise)."""
    methods = _methods()
    check_name(name, methods, "method")
    return methods[name]


def build_method(cfg: RunConfig, task: Task) -> Method:
    """The method named by the config; it must apply to the task (`Method.unsupported_reason`), its
    method_args are checked against the constructor's signature (`Method.option_parameters`), then
    the constructor applies its own rules."""
    cls = method_class(cfg.method)
    if cfg.class_loss != "method" and not isinstance(task, ClassificationTask):
        raise ConfigError(f"config field 'class_loss': {cfg.class_loss} needs a classification task; task '{task.name}' is not one")
    reason = cls.unsupported_reason(task)
    if reason:
        raise ConfigError(f"config field 'method': method '{cfg.method}' cannot run on task '{task.name}': {reason}")
    annotations = {name: p.annotation for name, p in cls.option_parameters().items()}
    check_options(cfg.method_args, annotations, owner=f"method '{cfg.method}'", path="method_args")
    return cls(cfg, task, **cfg.method_args)


def method_names() -> list[str]:
    return sorted(_methods())


def validate_config(values: dict[str, Any] | RunConfig) -> RunConfig:
    """Check a whole job configuration before anything runs: every field's type and range, the task
    and method names, the task's data options and the method's options. Builds the task and method
    objects, which is cheap (no data is read, no model is built). Raises ConfigError naming the
    config field; returns the RunConfig (the one given, or the one built from the dict)."""
    cfg = RunConfig.from_dict(values.to_dict() if isinstance(values, RunConfig) else values)
    task = build_task(cfg)
    try:
        build_method(cfg, task)
    except ConfigError:
        raise
    except ValueError as e:  # a rule of the method's own constructor (l1 <= l2, mu >= 0, ...)
        raise ConfigError(f"config field 'method_args' of method '{cfg.method}': {e}") from e
    return values if isinstance(values, RunConfig) else cfg


def validate_job(job: str, values: dict[str, Any] | RunConfig) -> RunConfig:
    """validate_config with the job named in the error, since one setting may apply to several jobs."""
    try:
        return validate_config(values)
    except ConfigError as e:
        raise ConfigError(f"job '{job}': {e}") from e
