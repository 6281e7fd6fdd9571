"""MOON: model-contrastive federated learning (Li, He & Song, CVPR 2021), a competitor of FCA's Table 4."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F

from prrfl.messages import Download
from prrfl.methods.fedavg import FedAvg
from prrfl.methods.method import frozen_copy
from prrfl.methods.view import SiteView
from prrfl.tasks.classification import ClassificationTask

if TYPE_CHECKING:
    from prrfl.tasks.contract import Task


def model_contrastive_loss(z: torch.Tensor, z_glob: torch.Tensor, z_prev: torch.Tensor, temperature: float) -> torch.Tensor:
    """Batch mean of -log( e^(sim(z, z_glob)/T) / (e^(sim(z, z_glob)/T) + e^(sim(z, z_prev)/T)) ), sim the cosine
    similarity of each sample's embeddings [B, D]."""
    positive = F.cosine_similarity(z, z_glob, dim=1)
    negative = F.cosine_similarity(z, z_prev, dim=1)
    logits = torch.stack([positive, negative], dim=1) / temperature
    return F.cross_entropy(logits, torch.zeros(len(z), dtype=torch.long, device=z.device))


class MOON(FedAvg):
    """MOON (Li et al., "Model-Contrastive Federated Learning", CVPR 2021): FedAvg whose local loss adds
        mu * -log( exp(sim(z, z_glob)/T) / (exp(sim(z, z_glob)/T) + exp(sim(z, z_prev)/T)) )
    to the supervised loss: z is the embedding of the model being trained, z_glob that of the global model the site
    received this round, z_prev that of the site's own model at the end of its previous round (`model_contrastive_loss`).
    It pulls the local representation towards the global one and away from the previous local one.

    Choices: mu = 1 (the paper's for CIFAR-100 and Tiny-ImageNet; 5 for CIFAR-10) and T = 0.5 (the paper's); FCA's
    published code holds FedAvg and FCA only and states no setting for them; the representation is
    the task model's embedding (the classifier's input), without the paper's extra projection head, so that the
    model is the one every method trains; the global and previous models are frozen copies in evaluation mode, as in
    the authors' code (one previous model: their buffer size 1); in the first round there is no previous model and
    the term is 0 (the authors' code: the positive pair alone); everything else is FedAvg's. Classification only: the
    contrast is between one embedding per image.
    """

    name = "moon"

    def __init__(self, cfg, task, *, mu: float = 1.0, temperature: float = 0.5, **options: Any):
        super().__init__(cfg, task, **options)
        if not (mu >= 0 and temperature > 0):
            raise ValueError(f"MOON options need mu >= 0 and temperature > 0, got {mu}, {temperature}")
        self.mu, self.temperature = mu, temperature
        self.frozen: dict[str, dict[str, torch.nn.Module]] = {}  # site -> {"global", "previous"}: rebuilt at each download

    @classmethod
    def unsupported_reason(cls, task: Task) -> str | None:
        if not isinstance(task, ClassificationTask):
            return "MOON contrasts one embedding per image (classification tasks)"
        return None

    def on_download(self, site: SiteView, download: Download, first: bool) -> None:
        model = site.models[self.upload_role]
        device = next(model.parameters()).device
        previous = None if first else {k: v.detach().clone() for k, v in model.state_dict().items()}
        super().on_download(site, download, first)
        frozen = {"global": frozen_copy(self, model.state_dict(), device)}
        if previous is not None:
            frozen["previous"] = frozen_copy(self, previous, device)
        self.frozen[site.name] = frozen

    def losses(self, site, targets, outputs):
        losses = super().losses(site, targets, outputs)
        frozen = self.frozen.get(site.name, {})
        if "previous" in frozen and self.mu > 0 and self.inputs is not None:
            inputs = self.inputs
            with torch.no_grad():
                z_glob, z_prev = frozen["global"](inputs)[1], frozen["previous"](inputs)[1]
            z = outputs[self.upload_role][1]
            losses[self.upload_role] = losses[self.upload_role] + self.mu * model_contrastive_loss(z, z_glob, z_prev, self.temperature)
        return losses
