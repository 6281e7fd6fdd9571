"""FCA: federated classifier anchoring (Wicaksana et al., "Fca: Taming long-tailed federated medical
image classification by classifier anchoring")."""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING, Any, Literal

import torch
from torch import nn

from prrfl.algorithms.det import kl_distillation
from prrfl.algorithms.losses import AUTHORS_PRIOR_EPSILON, balanced_softmax_loss
from prrfl.algorithms.pfa import batchnorm_statistics_keys
from prrfl.methods.fedavg import FedAvg
from prrfl.methods.view import SiteView
from prrfl.tasks.classification import ClassificationTask

if TYPE_CHECKING:
    from prrfl.tasks.contract import Task

AUTHORS_MILESTONES = (59, 69)  # the code's MultiStepLR(60, 70) stepped before each round's training


class TwoHeadModel(nn.Module):
    """The task's classification network (its own classifier = the federated head) plus a
    personalized head of the same shape on the same embedding. forward(x) -> (personalized logits,
    embedding): what a site evaluates; `federated(embedding)` gives the federated head's logits.
    Needs a network whose returned embedding is the input of its classifier layer (`classifier_key`)."""

    def __init__(self, base: nn.Module):
        super().__init__()
        self.base = base
        self.head_name = base.classifier_key.rpartition(".")[0]
        self.personal_head = copy.deepcopy(base.get_submodule(self.head_name))
        for layer in self.personal_head.modules():  # its own initialisation, not a copy of the other head's
            if hasattr(layer, "reset_parameters"):
                layer.reset_parameters()
        self.classifier_key = f"base.{base.classifier_key}"

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        _, embedding = self.base(x)
        return self.personal_head(embedding), embedding

    def federated(self, embedding: torch.Tensor) -> torch.Tensor:
        return self.base.get_submodule(self.head_name)(embedding)


def authors_consistency(federated_logits: torch.Tensor, personal_logits: torch.Tensor) -> torch.Tensor:
    """The code's term: torch's KLDivLoss (reduction 'mean') given PROBABILITIES where it expects log
    probabilities: mean over samples and classes of q (log q - p), q = softmax(personal) detached,
    p = softmax(federated), both + 1e-11. Linear in p: it pulls up the federated probability of the
    classes the personalized head favours, not a KL divergence."""
    p = torch.softmax(federated_logits, dim=1) + 1e-11
    q = torch.softmax(personal_logits.detach(), dim=1) + 1e-11
    return (q * (q.log() - p)).mean()  # what KLDivLoss(reduction="mean")(p, q) computes


class FCA(FedAvg):
    """One feature extractor with two heads at each site: a federated head, averaged with the
    extractor by the server, and a personalized head that never leaves the site. Both heads train
    with the balanced softmax of the site's own class prior, and a consistency term anchors the
    federated head to the personalized one:
        L = lam_fed * BS(z_fed) + lam_personal * BS(z_personal) + KL(softmax(z_personal) || softmax(z_fed))
    with the personalized side detached (the paper's best direction, federated <- personalized), so the
    term trains the federated head and the extractor. The server takes the sample-weighted FedAvg of
    everything except the personalized head. A site reports its model with the personalized head
    (specialization); the federated head is the global model's classifier.

    Choices: lam_fed = 1, lam_personal = 3 (the paper's best, Table 7, and the code); KL is the batch
    mean at temperature 1; BatchNorm running statistics are averaged with the rest (the code too;
    `bn_statistics="local"` keeps them at the site); the personalized head starts from its own
    random initialisation, the same at every site; a class the site lacks is masked out of its
    balanced softmax (log prior -inf). Options for the authors' code: `consistency="authors"`
    (`authors_consistency`), `prior="authors"` (log(prior + 1e-9): the missing class stays in the
    softmax with weight 1e-9), `optimizer="authors"` (Adam, lr 1e-3, weight decay
    5e-4, lr x 0.1 from epochs 59 and 69; the code trains 1 epoch per round). Image classification
    only: the balanced softmax and the anchoring are defined per image.
    """

    name = "fca"
    global_model_reported = False  # a personalized model, scored after its local epochs

    def __init__(
        self,
        cfg,
        task,
        *,
        lam_fed: float = 1.0,
        lam_personal: float = 3.0,
        consistency: Literal["kl", "authors"] = "kl",
        prior: Literal["masked", "authors"] = "masked",
        bn_statistics: Literal["averaged", "local"] = "averaged",
        optimizer: Literal["config", "authors"] = "config",
        **options: Any,
    ):
        super().__init__(cfg, task, **options)
        if not (lam_fed >= 0 and lam_personal >= 0):
            raise ValueError(f"FCA options lam_fed and lam_personal must be >= 0, got {lam_fed}, {lam_personal}")
        self.lam_fed, self.lam_personal = lam_fed, lam_personal
        self.consistency, self.bn_statistics, self.optimizer = consistency, bn_statistics, optimizer
        self.prior_epsilon = AUTHORS_PRIOR_EPSILON if prior == "authors" else None

    @classmethod
    def unsupported_reason(cls, task: Task) -> str | None:
        if not isinstance(task, ClassificationTask):
            return "FCA's balanced softmax and classifier anchoring are defined for one class per image (classification tasks)"
        return None

    def build_model(self) -> nn.Module:
        return TwoHeadModel(self.task.build_model())

    def build_optimizer(self, model: nn.Module) -> torch.optim.Optimizer:
        if self.optimizer == "authors":
            return torch.optim.Adam(model.parameters(), lr=1e-3, weight_decay=5e-4)
        return super().build_optimizer(model)

    def lr_at(self, epoch: int) -> float:
        if self.optimizer == "authors":
            return 1e-3 * 0.1 ** sum(epoch >= m for m in AUTHORS_MILESTONES)
        return super().lr_at(epoch)

    def build_global_model(self) -> nn.Module:
        """The global model is the task's network with the federated head as its classifier."""
        return self.task.build_model()

    def global_entries(self, params):
        """The averaged extractor and federated head: the `base.` entries of the download (incomplete,
        so no global model, when BN statistics stay at the sites, `bn_statistics="local"`)."""
        return {k.removeprefix("base."): v for k, v in params.items() if k.startswith("base.")}

    def local_keys(self, model: nn.Module) -> set[str]:
        keys = {k for k in model.state_dict() if k.startswith("personal_head.")}
        if self.bn_statistics == "local":
            keys |= batchnorm_statistics_keys(model)
        return keys

    def losses(self, site: SiteView, targets, outputs):
        personal, embedding = outputs["local"]
        federated = site.models["local"].federated(embedding)
        counts = torch.tensor(site.class_counts)
        loss = self.lam_fed * balanced_softmax_loss(federated, targets, counts, self.prior_epsilon)
        loss = loss + self.lam_personal * balanced_softmax_loss(personal, targets, counts, self.prior_epsilon)
        if self.consistency == "authors":
            return {"local": loss + authors_consistency(federated, personal)}
        return {"local": loss + kl_distillation(federated, personal)}  # teacher (personalized) detached
