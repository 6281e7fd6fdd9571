"""What travels between a site and the server, as plain data: no import of methods, tasks or the
site runtime, so that each of them can import it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

StateDict = dict[str, torch.Tensor]


@dataclass
class Upload:
    """What one site sends after its local round: shared parameters plus small statistics.

    num_train counts the site's training samples (images, or slices for a slice-wise segmentation
    task); class_counts are the task's per-class statistics of the training split (images per class
    for classification, voxels per class for segmentation), checked by the task on the server."""

    site: str
    params: StateDict
    num_train: int
    class_counts: list[int]
    meta: dict[str, Any] = field(default_factory=dict)


@dataclass
class Download:
    """What the server sends one site for the next round."""

    params: StateDict
    meta: dict[str, Any] = field(default_factory=dict)
