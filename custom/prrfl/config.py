"""Run configuration: one validated dataclass, sent by the server to every site with the first task.

Only site-local facts (data root, device, threads) are set at the site; everything that must agree
across sites (schedule, seeds, method options) lives here, in the job's server config.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any


@dataclass
class RunConfig:
    task: str = "derm"
    method: str = "prr"
    run_name: str = "derm_prr"  # names the persistent state folders on the server and the sites
    num_rounds: int = 5
    local_epochs: int = 2
    batch_size: int = 16
    lr: float = 1e-2
    lr_step_epochs: int = 25  # the paper halves the learning rate every 25 epochs
    lr_gamma: float = 0.5
    momentum: float = 0.0
    weight_decay: float = 1e-6
    seed: int = 0
    min_sites: int = 0  # 0: every site must answer each round
    select_from_round: int = 0  # best-on-validation selection considers rounds >= this (authors: 40 of 50)
    eval_test_every_epoch: bool = True  # per-epoch test curves (retrogress plots)
    method_args: dict[str, Any] = field(default_factory=dict)
    data: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        positive = ("num_rounds", "local_epochs", "batch_size", "lr_step_epochs")
        for name in positive:
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise ValueError(f"config field '{name}' must be a positive integer, got {getattr(self, name)!r}")
        for name in ("lr", "lr_gamma"):
            if not getattr(self, name) > 0:
                raise ValueError(f"config field '{name}' must be > 0, got {getattr(self, name)!r}")
        if self.min_sites < 0:
            raise ValueError(f"config field 'min_sites' must be >= 0, got {self.min_sites}")

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> "RunConfig":
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(f"unknown config field(s) {unknown}; expected some of {sorted(known)}")
        return cls(**values)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def lr_at(self, epoch: int) -> float:
        """Step schedule over the global epoch index (round * local_epochs + local epoch)."""
        return self.lr * self.lr_gamma ** (epoch // self.lr_step_epochs)
