"""What a method's hooks see of a site: its models, optimisers and memory, its training data and
statistics, its evaluation and scalar log, nothing of the loop's bookkeeping (checkpoints, history,
best-on-validation record). The shared loop (prrfl.site.trainer) builds one per round from the site's
runtime (`SiteRuntime.view`) and passes it to every hook of `prrfl.methods.base.Method`.

This module imports neither the methods nor the runtime, so that both can import it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from prrfl.tasks.base import Split, Task

Scalar = Callable[[str, float, int], None]  # (tag, value, step): one value of a site's tracked curves


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

    @property
    def num_train(self) -> int:
        """Training samples (Upload.num_train)."""
        return len(self.train)
