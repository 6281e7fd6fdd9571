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
    """What the server sends one site for the next round.

    params and meta are the method's (`Method.aggregate`); round and global_class_counts are the
    federation's, filled by the transport when the download reaches the site
    (`prrfl.flare.protocol.model_to_download`): a download the server has not sent yet keeps their
    defaults."""

    params: StateDict
    meta: dict[str, Any] = field(default_factory=dict)  # the method's own values (e.g. global prototypes)
    round: int = 0  # the round the site trains with this download (0-based)
    global_class_counts: list[int] | None = None  # the federation's training statistics per class (Upload.class_counts summed)
