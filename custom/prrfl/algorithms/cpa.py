"""Conjoint Prototype-Aligned (CPA) loss, the supervised loss of PRR at each site (TMI 2022, Sec. III-C).

Global conjoint objective: for a sample of class c the softmax competition from class j is scaled
by G[c, j] = min(1, (N_j / N_c)^beta), computed from the GLOBAL class counts, so a head class
pushes rare classes' logits down less hard. Local prototype-aligned refinement: every sample of
class c is weighted by gamma_c = (1 + tau) / (s_c + tau), where s_c is the cosine between the
site's class prototype and the global one, so classes whose local embedding drifts from the
federation's get more weight.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Literal

import torch
import torch.nn.functional as F

Reduction = Literal["mean", "sum", "none"]
AUTHORS_EPS = 1e-6  # the authors' epsilon in the softmax denominator and inside the log


def conjoint_mask(class_counts: Sequence[float] | torch.Tensor, beta: float = 0.8) -> torch.Tensor:
    """G [C, C] (float64): G[c, j] = min(1, (N_j / N_c)^beta); rows = target class c.

    The diagonal is 1. A class with N = 0 has no imbalance ratio: its row and column are 1, i.e.
    it competes as in a plain softmax (a 0 entry would drop it from every other class's softmax).
    """
    counts = torch.as_tensor(class_counts, dtype=torch.float64)
    if counts.ndim != 1 or counts.numel() == 0:
        raise ValueError(f"class_counts must be a non-empty 1-D sequence, got shape {tuple(counts.shape)}")
    if not torch.isfinite(counts).all() or (counts < 0).any():
        raise ValueError(f"class_counts must be finite and non-negative, got {counts.tolist()}")
    if not (beta >= 0 and math.isfinite(beta)):
        raise ValueError(f"beta must be finite and non-negative, got {beta}")
    ratio = counts[None, :] / counts[:, None]  # N_j / N_c
    mask = ratio.pow(beta).clamp(max=1.0)
    empty = counts == 0
    mask[empty, :] = 1.0
    mask[:, empty] = 1.0
    return mask


def cpa_loss(
    logits: torch.Tensor,
    targets: torch.Tensor,
    mask: torch.Tensor,
    gamma: torch.Tensor | None = None,
    reduction: Reduction = "mean",
    authors_eps: bool = False,
) -> torch.Tensor:
    """L = -gamma_y * log p^_y with p^_c = e^{z_c} / (e^{z_c} + sum_{j != c} G[c, j] e^{z_j}).

    logits [B, C, *spatial] with targets [B, *spatial] (class indices); mask G [C, C]; gamma [C]
    per-class weights (None = 1). "mean" averages over all samples (and positions) without
    normalising by gamma, as the authors do; "none" returns the per-sample losses [B, *spatial].
    The default evaluates log p^ as z_y - logsumexp_j(z_j + log G[y, j]) (G[y, y] taken as 1),
    exact and finite for any logits; an entry G = 0 is a log of -inf that simply drops out.
    `authors_eps` reproduces the authors' formula instead: max-shifted exponentials with 1e-6 added
    to the denominator and inside the log.
    """
    z, y = _flatten_classes(logits, targets)
    num_classes = z.shape[1]
    if mask.shape != (num_classes, num_classes):
        raise ValueError(f"mask must be [{num_classes}, {num_classes}], got {tuple(mask.shape)}")
    if gamma is not None and gamma.shape != (num_classes,):
        raise ValueError(f"gamma must be [{num_classes}], got {tuple(gamma.shape)}")
    # each sample's denominator coefficients: its target's row of G, with 1 for the target itself
    coef = mask.to(z.device, z.dtype)[y].scatter(1, y[:, None], 1.0)
    if authors_eps:
        e = (z - z.max(dim=1, keepdim=True).values).exp()
        e_y = e.gather(1, y[:, None]).squeeze(1)
        log_p = torch.log(e_y / ((coef * e).sum(dim=1) + AUTHORS_EPS) + AUTHORS_EPS)
    else:
        log_p = z.gather(1, y[:, None]).squeeze(1) - torch.logsumexp(z + coef.log(), dim=1)
    loss = -log_p if gamma is None else -gamma.to(z.device, z.dtype)[y] * log_p
    if reduction == "mean":
        return loss.mean()
    if reduction == "sum":
        return loss.sum()
    if reduction == "none":
        return loss.view(targets.shape)
    raise ValueError(f"reduction must be 'mean', 'sum' or 'none', got {reduction!r}")


def _flatten_classes(logits: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[B, C, *spatial], [B, *spatial] -> [N, C], [N] with the class axis last."""
    if logits.ndim < 2 or targets.shape != logits.shape[:1] + logits.shape[2:]:
        raise ValueError(f"need logits [B, C, *S] and targets [B, *S], got {tuple(logits.shape)} and {tuple(targets.shape)}")
    return logits.movedim(1, -1).reshape(-1, logits.shape[1]), targets.reshape(-1).long()


def prototype_gamma(
    local_protos: torch.Tensor,
    global_protos: torch.Tensor,
    tau: float = 3.0,
    present: torch.Tensor | None = None,
) -> torch.Tensor:
    """gamma [C] = (1 + tau) / (s_c + tau), s_c = cosine(local prototype c, global prototype c).

    Aligned prototypes give 1, orthogonal ones (1 + tau) / tau, opposite ones (1 + tau) / (tau - 1)
    (2 at tau = 3; unbounded for tau <= 1). A class marked absent in `present` [C] (locally or
    globally), or whose prototype is the zero vector (no direction), gets gamma = 1: no
    refinement without evidence. The result carries no gradient: it is a per-class loss weight.
    """
    if local_protos.shape != global_protos.shape or local_protos.ndim != 2:
        raise ValueError(
            f"need local and global prototypes of the same [C, D] shape, got {tuple(local_protos.shape)} and {tuple(global_protos.shape)}"
        )
    if not tau > 0:
        raise ValueError(f"tau must be positive, got {tau}")
    local, glob = local_protos.detach(), global_protos.detach().to(local_protos.device, local_protos.dtype)
    cosine = F.cosine_similarity(local, glob, dim=1)
    defined = (local.norm(dim=1) > 0) & (glob.norm(dim=1) > 0)
    if present is not None:
        defined &= present.to(defined.device, torch.bool)
    gamma = (1.0 + tau) / (cosine + tau)
    return torch.where(defined, gamma, torch.ones_like(gamma))
