"""FedAvg with a local loss for label-distribution skew: FedLC (logit calibration) and FedRS (restricted
softmax), two competitors of FCA's Table 4. FCA's published code holds FedAvg and FCA only, so the settings here
are the papers'."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F

from prrfl.methods.fedavg import FedAvg
from prrfl.tasks.classification import ClassificationTask

if TYPE_CHECKING:
    from prrfl.tasks.contract import Task


def _own_class_term(name: str, cfg) -> None:
    """The method's rule is its classification term: a run's `class_loss=balanced_softmax`, which replaces every
    method's term, would leave plain FedAvg under the method's name."""
    if cfg.class_loss != "method":
        raise ValueError(f"{name}'s rule is its classification loss; class_loss={cfg.class_loss} would replace it (use class_loss=method)")


def classification_only(name: str, task: Task) -> str | None:
    if not isinstance(task, ClassificationTask):
        return f"{name}'s loss works on the class counts of a site's images (classification tasks)"
    return None


def calibrated_cross_entropy(logits: torch.Tensor, labels: torch.Tensor, class_counts: Sequence[int], tau: float) -> torch.Tensor:
    """FedLC's loss: cross entropy of the logits z_c - tau * n_c^(-1/4), n_c the site's count of class c. A class
    the site lacks (n_c = 0) gets -inf (the formula's limit for tau > 0): it drops out of the softmax."""
    counts = torch.as_tensor(class_counts, dtype=torch.float64, device=logits.device)
    shift = torch.where(counts > 0, tau * counts.clamp(min=1) ** -0.25, torch.inf if tau > 0 else 0.0)
    return F.cross_entropy(logits - shift.to(logits.dtype), labels)


def restricted_logits(logits: torch.Tensor, class_counts: Sequence[int], alpha: float) -> torch.Tensor:
    """FedRS's restricted softmax input: the logit of every class the site lacks (n_c = 0) times alpha, the others
    as they are."""
    present = torch.as_tensor(class_counts, device=logits.device) > 0
    scale = torch.where(present, 1.0, alpha).to(logits.dtype)
    return logits * scale


class FedLC(FedAvg):
    """FedLC (Zhang et al., "Federated Learning with Label Distribution Skew via Logits Calibration", ICML 2022):
    FedAvg whose local loss calibrates each class's logit by the site's count of that class,
        L = CE(z - tau * n^(-1/4), y),  i.e. -log( e^(z_y - tau n_y^(-1/4)) / sum_c e^(z_c - tau n_c^(-1/4)) ),
    so that a site's frequent classes are pushed less than its rare ones (`calibrated_cross_entropy`).

    Choices: tau = 1.0 (the paper's default; FCA's code states no setting for it); n_c are the site's training
    counts; a class the site lacks is out of its softmax (the formula's limit at n_c = 0); the calibration is a
    training loss only: the models are evaluated on their plain logits. Everything else is FedAvg's (sample-weighted
    average of the whole model, the global model reported). Classification only; refused with
    `class_loss=balanced_softmax`, which would replace the calibrated loss.
    """

    name = "fedlc"

    def __init__(self, cfg, task, *, tau: float = 1.0, **options: Any):
        super().__init__(cfg, task, **options)
        _own_class_term("FedLC", cfg)
        if not tau >= 0:
            raise ValueError(f"FedLC option tau must be >= 0, got {tau}")
        self.tau = tau

    @classmethod
    def unsupported_reason(cls, task: Task) -> str | None:
        return classification_only("FedLC", task)

    def class_term(self, site, logits, targets):
        return calibrated_cross_entropy(logits, targets, site.class_counts, self.tau)


class FedRS(FedAvg):
    """FedRS (Li & Zhan, "FedRS: Federated Learning with Restricted Softmax for Label Distribution Non-IID Data",
    KDD 2021): FedAvg whose local loss restricts the softmax of the classes a site lacks: their logits are scaled by
    alpha before the cross entropy (`restricted_logits`), so the site's updates push the missing classes' weights
    less.

    Choices: alpha = 0.5 (the paper's default; FCA's code states no setting for it); the restriction is the paper's
    binary one (1 for a class the site has, alpha for one it lacks) applied to the whole logit, bias included; it is a
    training loss only: the models are evaluated on their plain logits. Everything else is FedAvg's. Classification
    only; refused with `class_loss=balanced_softmax`, which would replace the restricted softmax.
    """

    name = "fedrs"

    def __init__(self, cfg, task, *, alpha: float = 0.5, **options: Any):
        super().__init__(cfg, task, **options)
        _own_class_term("FedRS", cfg)
        if not 0 <= alpha <= 1:
            raise ValueError(f"FedRS option alpha must lie in [0, 1], got {alpha}")
        self.alpha = alpha

    @classmethod
    def unsupported_reason(cls, task: Task) -> str | None:
        return classification_only("FedRS", task)

    def class_term(self, site, logits, targets):
        return F.cross_entropy(restricted_logits(logits, site.class_counts, self.alpha), targets)
