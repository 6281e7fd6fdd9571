"""Classification losses a run may put in place of the task's cross entropy, pure torch."""

from __future__ import annotations

import torch
import torch.nn.functional as F

AUTHORS_PRIOR_EPSILON = 1e-9  # FCA's code: log(prior + 1e-9)


def balanced_softmax_loss(
    logits: torch.Tensor, targets: torch.Tensor, class_counts: torch.Tensor, prior_epsilon: float | None = None
) -> torch.Tensor:
    """Balanced softmax (Ren et al. 2020): cross entropy of logits + log(prior), prior = the site's own
    class frequencies. A class the site does not hold has prior 0, log -inf: it drops out of the
    softmax. With `prior_epsilon` the shift is log(prior + epsilon), as the FCA authors' code with 1e-9:
    a missing class keeps the tiny weight 1e-9 (log -20.7) in the softmax and its logit a gradient."""
    counts = class_counts.to(logits.device, torch.float64)
    prior = counts / counts.sum()
    if prior_epsilon is None:
        log_prior = torch.where(counts > 0, prior.log(), -torch.inf)
    else:
        log_prior = (prior + prior_epsilon).log()
    return F.cross_entropy(logits + log_prior.to(logits.dtype), targets)
