"""Class prototypes as they travel, shared by PRR (CPA loss) and FedProto.

A site averages one model's embeddings per class (`prrfl.algorithms.class_prototypes.PrototypeTracker`, the tracker the
FLARE components' Client API scripts use too) over the batches of each local epoch (the authors'
choice in both papers: the features of the batches being trained on, in train mode), pooled per
class as the task says (`Task.class_embeddings`: an image's embedding for classification, the
feature map's masked average per class for segmentation); the last epoch's prototypes go up in
Upload.meta (prrfl.keys names them). The server's global prototypes (prrfl.server.class_statistics) come down in
Download.meta, read by `prrfl.server.class_statistics.GlobalStatistics`.
"""

from __future__ import annotations

from typing import Any

import torch

from prrfl.algorithms.class_prototypes import PrototypeTracker
from prrfl.keys import PROTOTYPE_PRESENT, PROTOTYPES
from prrfl.methods.view import SiteView
from prrfl.server.class_statistics import GlobalStatistics


def track(site: SiteView, embedding: torch.Tensor, targets: torch.Tensor) -> None:
    """Add a batch's embedding and targets (call from after_batch)."""
    vectors, classes = site.task.class_embeddings(embedding.detach(), targets)
    tracker = site.memory.get("tracker")
    if tracker is None:
        tracker = site.memory["tracker"] = PrototypeTracker(site.task.num_classes)
    tracker.update(vectors, classes)


def finish_epoch(site: SiteView) -> None:
    """The epoch's prototypes [C, D] and which classes had samples (call from after_epoch)."""
    protos, present = site.memory.pop("tracker").prototypes()
    site.memory["prototypes"] = protos.double()
    site.memory["prototype_present"] = present


def upload_meta(site: SiteView) -> dict[str, Any]:
    return {
        PROTOTYPES: site.memory["prototypes"].tolist(),
        PROTOTYPE_PRESENT: site.memory["prototype_present"].tolist(),
    }


def receive(site: SiteView, meta: dict[str, Any]) -> None:
    """Keep the global prototypes of a download (`prrfl.server.class_statistics.GlobalStatistics`), when it brings some."""
    sent = GlobalStatistics.from_meta(meta)
    if sent.prototypes is not None:
        site.memory["global_prototypes"] = sent.prototypes
        site.memory["global_present"] = sent.present
