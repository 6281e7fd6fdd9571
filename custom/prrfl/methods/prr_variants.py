"""PRR relatives: the MICCAI 2021 PRR-FL, and PRR with its CPA loss replaced by another imbalance
loss (TMI 2022, Table XI: FedeAMC, Fed-Focal). Only the supervised loss (and the PFA flavour for
PRR-FL) changes; PFA, DET and all PRR options work as in `PRR`."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

import torch
import torch.nn.functional as F

from prrfl.messages import Download
from prrfl.methods.method import global_class_counts
from prrfl.methods.prr import PRR
from prrfl.methods.view import SiteView


class PRRFL(PRR):
    """PRR-FL (Chen et al., MICCAI 2021), the conference version: PFA averaging the AMPLITUDE only
    (each site keeps its own phase) with the last FC mixed as a matrix like every other layer, DET,
    and plain cross entropy (no CPA, no prototypes).

    Choices: every other setting (r schedule 0.35 -> 0.48, conv layout, uniform site weights, DET
    thresholds 0.7 / 0.9 on the validation split) is PRR's default; each is still an option.
    """

    name = "prrfl"
    MICCAI: dict[str, Any] = {"pfa_components": "amplitude", "classifier_rowwise": False, "cpa_global": False, "cpa_local": False}

    def __init__(self, cfg, task, **options: Any):
        super().__init__(cfg, task, **{**self.MICCAI, **options})


class _PRRWithLoss(PRR):
    """PRR with CPA replaced by another imbalance loss as the classification term of the task's
    loss (the whole loss for classification, beside Dice for segmentation); CPA and with it the
    prototype exchange are off."""

    def __init__(self, cfg, task, **prr_options: Any):
        clash = sorted({"cpa_global", "cpa_local"} & set(prr_options))
        if clash:
            raise ValueError(f"method '{self.name}' replaces the CPA loss; options {clash} do not apply")
        super().__init__(cfg, task, cpa_global=False, cpa_local=False, **prr_options)


def count_weights(class_counts: Sequence[float] | torch.Tensor, power: float = 1.0) -> torch.Tensor:
    """w_c = (N / (C * N_c))^power for the C classes with N_c > 0, 0 for absent classes (float64).
    At power 1, sum_c N_c * w_c = N: the weights keep the loss on the whole set at CE's scale."""
    counts = torch.as_tensor(class_counts, dtype=torch.float64)
    present = counts > 0
    ratio = counts.sum() / (present.sum() * counts)
    return torch.where(present, ratio, 0.0) ** power


def reweighted_cross_entropy(logits: torch.Tensor, labels: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """mean_i w_{y_i} * CE_i (a plain mean over samples, not normalised by the weights)."""
    ce = F.cross_entropy(logits, labels, reduction="none")
    return (weights.to(logits.device, logits.dtype)[labels] * ce).mean()


def focal_loss(logits: torch.Tensor, labels: torch.Tensor, gamma: float = 2.0, alpha: torch.Tensor | None = None) -> torch.Tensor:
    """mean_i -alpha_{y_i} (1 - p_{y_i})^gamma log p_{y_i} (Lin et al. 2017); gamma = 0, alpha = None is CE."""
    log_p = F.log_softmax(logits, dim=1).gather(1, labels[:, None]).squeeze(1)
    loss = -((1 - log_p.exp()) ** gamma) * log_p
    if alpha is not None:
        loss = alpha.to(logits.device, logits.dtype)[labels] * loss
    return loss.mean()


class FedeAMC(_PRRWithLoss):
    """PRR whose supervised loss is cross entropy re-weighted by class counts (TMI 2022, Table XI):
    each sample of class c weighs w_c = (N / (C * N_c))^power (`count_weights`).

    Choices: counts = "global" uses the federation's training counts that every download carries
    (the counts CPA's mask uses), "local" the site's own; power = 1 (inverse frequency); the loss is
    the plain sample mean of the weighted CE (not divided by the batch's weights).
    """

    name = "fedeamc"

    def __init__(self, cfg, task, *, counts: Literal["global", "local"] = "global", power: float = 1.0, **prr_options: Any):
        super().__init__(cfg, task, **prr_options)
        if counts not in ("global", "local"):
            raise ValueError(f"FedeAMC option counts must be 'global' or 'local', got {counts!r}")
        self.counts, self.power = counts, power

    def on_download(self, site: SiteView, download: Download, first: bool) -> None:
        super().on_download(site, download, first)
        counts = global_class_counts(download, self.name) if self.counts == "global" else site.class_counts
        site.memory["class_weights"] = count_weights(counts, self.power)

    def class_term(self, site, logits, targets):
        return reweighted_cross_entropy(logits, targets, site.memory["class_weights"])


class FedFocal(_PRRWithLoss):
    """PRR whose supervised loss is the focal loss of Fed-Focal (Sarkar et al., 2020; TMI 2022,
    Table XI): -alpha_y (1 - p_y)^gamma log p_y, which down-weights well-classified samples.

    Choices: gamma = 2; alpha = None (no class weights; a list gives one per class); only the loss
    is taken from Fed-Focal: its server-side client sampling does not apply inside PRR.
    """

    name = "fedfocal"

    def __init__(self, cfg, task, *, gamma: float = 2.0, alpha: Sequence[float] | None = None, **prr_options: Any):
        super().__init__(cfg, task, **prr_options)
        if not gamma >= 0 or (alpha is not None and len(alpha) != task.num_classes):
            raise ValueError(f"Fed-Focal needs gamma >= 0 and alpha None or one value per class, got {gamma}, {alpha}")
        self.gamma = gamma
        self.alpha = None if alpha is None else torch.tensor(alpha, dtype=torch.float64)

    def class_term(self, site, logits, targets):
        return focal_loss(logits, targets, self.gamma, self.alpha)
