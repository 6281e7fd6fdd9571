"""FedProto: federated prototype learning (Tan et al., AAAI 2022)."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from prrfl.messages import Download, Upload
from prrfl.methods import prototype_exchange as protos
from prrfl.methods.method import Method
from prrfl.methods.view import SiteView
from prrfl.server.class_statistics import download_meta, site_prototypes


def prototype_regulariser(
    embeddings: torch.Tensor, labels: torch.Tensor, global_protos: torch.Tensor, present: torch.Tensor
) -> torch.Tensor:
    """Mean squared error between each embedding [B, D] and the global prototype of its class;
    samples whose class has no global prototype contribute 0 (still counted in the mean)."""
    target = global_protos.to(embeddings.device, embeddings.dtype)[labels]
    has = present.to(embeddings.device)[labels][:, None]
    return F.mse_loss(torch.where(has, embeddings, target), target)


def average_prototypes(site_protos: torch.Tensor, class_counts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Global prototype of class c = sum_k n_kc * p_kc / sum_k n_kc over the sites holding c.
    site_protos [K, C, D], class_counts [K, C] -> ([C, D] float64, present [C])."""
    counts = class_counts.to(torch.float64)
    total = counts.sum(dim=0)
    mean = torch.einsum("kc,kcd->cd", counts, site_protos.to(torch.float64)) / total.clamp(min=1)[:, None]
    return mean, total > 0


class FedProto(Method):
    """Only class prototypes travel, never weights. A site trains its own model with
    CE + lambda * MSE(embedding, global prototype of the sample's class) and uploads the per-class
    mean embeddings; the server averages them per class weighted by each site's class count.

    Choices: lambda = 1 (authors' code default); the embedding is what the task pools per class (the
    classifier's 64-d input for dermoscopy, masked feature-map averages for segmentation); local prototypes are the mean embeddings over the last local epoch's training batches (train
    mode, as the authors' code); the regulariser is the authors' MSE, with samples of a class that has
    no global prototype yet (the first round) contributing 0. All sites start from the same initial
    model. The evaluated model is the site's model with its own classifier (the paper's
    prototype-distance inference is not used).
    """

    name = "fedproto"

    def __init__(self, cfg, task, *, lam: float = 1.0, **options: Any):
        super().__init__(cfg, task, **options)
        self.lam = lam

    def shared_keys(self, model: torch.nn.Module) -> list[str]:
        return []

    def aggregate(self, uploads: list[Upload], round_idx: int, server: dict[str, Any]) -> dict[str, Download]:
        site_protos, present = site_prototypes([u.meta for u in uploads])
        counts = torch.tensor([u.class_counts for u in uploads]) * present
        meta = download_meta(*average_prototypes(site_protos, counts))
        return {u.site: Download(params={}, meta=dict(meta)) for u in uploads}

    def on_download(self, site: SiteView, download: Download, first: bool) -> None:
        if first:
            super().on_download(site, download, first)
        protos.receive(site, download.meta)

    def losses(self, site, targets, outputs):
        logits, embedding = outputs["local"]
        loss = self.supervised_loss(site, logits, targets)
        if "global_prototypes" in site.memory:
            mem = site.memory
            vectors, classes = site.task.class_embeddings(embedding, targets)
            loss = loss + self.lam * prototype_regulariser(vectors, classes, mem["global_prototypes"], mem["global_present"])
        return {"local": loss}

    def after_batch(self, site, targets, outputs):
        protos.track(site, outputs["local"][1], targets)

    def after_epoch(self, site: SiteView, epoch: int) -> None:
        protos.finish_epoch(site)

    def upload_meta(self, site: SiteView) -> dict[str, Any]:
        return protos.upload_meta(site)
