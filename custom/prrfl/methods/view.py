"""What a method's hooks see of a site: its models, optimisers and memory, its training data and
statistics, its evaluation and scalar log, nothing of the loop's bookkeeping (checkpoints, history,
best-on-validation record). The shared loop (prrfl.site.trainer) builds one per round from the site's
runtime (`SiteRuntime.view`) and passes it to every hook of `prrfl.methods.method.Method`.

This module imports neither the methods nor the runtime, so that both can import it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from prrfl.tasks.contract import Split, Task

Scalar = Callable[[str, float, int], None]  # (tag, value, step): one value of a site's tracked curves


class LossCheck:
    """Whether a site's training losses are finite (`prrfl.methods.method.check_finite`), tested the way its device
    affords. On the CPU each loss is tested when it is checked, before its step: reading a value there costs
    nothing. On a GPU reading it would make the host wait for the device at every batch, so each test is folded
    into one flag that stays on the device (`deferred`), read once by `settle`: the loop settles at the end of
    every epoch. Either way a non-finite loss raises FloatingPointError naming the site; on a GPU the epoch's
    remaining steps have run by then, and the round fails all the same (nothing is uploaded or checkpointed)."""

    def __init__(self, site: str, deferred: bool = False):
        self.site = site
        self.deferred = deferred
        self.pending: torch.Tensor | None = None  # deferred: whether every loss checked since the last settle was finite

    def check(self, loss: torch.Tensor) -> None:
        if not self.deferred:
            if not torch.isfinite(loss):
                raise self.error(f"non-finite training loss {float(loss.detach())}")
            return
        finite = torch.isfinite(loss.detach()).all()
        self.pending = finite if self.pending is None else self.pending & finite

    def settle(self) -> None:
        """Raise for a deferred loss that was not finite (one read of the device), and start afresh."""
        pending, self.pending = self.pending, None
        if pending is not None and not bool(pending):
            raise self.error("non-finite training loss in this epoch")

    def error(self, what: str) -> FloatingPointError:
        return FloatingPointError(f"site {self.site}: {what} (lower the learning rate?)")


@dataclass(frozen=True, eq=False)
class SiteView:
    """One site as its method sees it during a round. The containers are the runtime's own: a hook
    changes the models, steps the optimisers and writes `memory` (checkpointed by the loop); the
    view itself cannot be rebound."""

    name: str
    task: Task
    models: dict[str, torch.nn.Module]  # by role (Method.roles)
    optimizers: dict[str, torch.optim.Optimizer]  # by role
    memory: dict[str, Any]  # what the method keeps at the site between rounds
    train: Split  # the training split (e.g. for extra batches beside the loop's)
    class_counts: list[int]  # the task's statistics of the training split (Upload.class_counts)
    generator: torch.Generator  # the site's RNG for batches and augmentation
    evaluate: Callable[[str, str], dict[str, float]]  # (role, split name) -> the task's metrics
    log_scalar: Scalar
    loss_check: LossCheck  # where check_finite tests a training loss

    @property
    def num_train(self) -> int:
        """Training samples (Upload.num_train)."""
        return len(self.train)
