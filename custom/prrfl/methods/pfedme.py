"""pFedMe: personalized FL with Moreau envelopes (Dinh et al., NeurIPS 2020)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from prrfl.messages import Download, Upload
from prrfl.methods.fedavg import FedAvg
from prrfl.methods.method import check_finite
from prrfl.server import aggregation


def solve_personalized(
    theta: Sequence[torch.Tensor],
    w: Sequence[torch.Tensor],
    loss_fn: Callable[[], torch.Tensor],
    lam: float,
    lr: float,
    steps: int,
) -> torch.Tensor:
    """Approximate argmin_theta f(theta) + (lam/2)||theta - w||^2 by `steps` gradient steps of size
    `lr` from the current theta (in place). Returns f at the last step's starting point."""
    for _ in range(steps):
        loss = loss_fn()
        grads = torch.autograd.grad(loss, list(theta))
        with torch.no_grad():
            for t, g, anchor in zip(theta, grads, w):
                t.sub_(lr * (g + lam * (t - anchor)))
    return loss.detach()


def moreau_step(w: Sequence[torch.Tensor], theta: Sequence[torch.Tensor], lam: float, eta: float) -> None:
    """The local model's step on the Moreau envelope: w <- w - eta * lam * (w - theta)."""
    with torch.no_grad():
        for p, t in zip(w, theta):
            p.sub_(eta * lam * (p - t))


class PFedMe(FedAvg):
    """Each site keeps its copy w of the shared model and a personalized model theta. On every batch
    theta approximately solves min f(theta; batch) + (lam/2)||theta - w||^2 with K gradient steps of
    size `personal_lr` (`solve_personalized`), then w moves towards it (`moreau_step`, eta = the
    loop's learning rate). The server averages the w's (by training-set size) and mixes:
    w_global <- (1 - beta) * w_global + beta * average. The evaluated model is theta.

    Choices: lam = 15, K = 5, personal_lr = 0.01, beta = 1 (plain FedAvg of the w's; the paper also
    uses beta = 2); the first round's mix starts from the average (the server has no earlier global
    model); theta restarts from the downloaded global model every round (the authors' code);
    BatchNorm running statistics, which have no gradient, are copied from theta into w after each
    batch (the paper's models have no BN); both updates are plain gradient steps (the loop's momentum
    and weight decay do not apply); the whole model travels.
    """

    name = "pfedme"
    global_model_reported = False  # a personalized model, scored after its local epochs
    roles = ("shared", "personal")
    eval_role = "personal"
    upload_role = "shared"
    download_roles = ("shared", "personal")

    def __init__(self, cfg, task, *, lam: float = 15.0, inner_steps: int = 5, personal_lr: float = 0.01, beta: float = 1.0, **options: Any):
        super().__init__(cfg, task, **options)
        if not (lam >= 0 and inner_steps >= 1 and personal_lr > 0 and beta > 0):
            raise ValueError("pFedMe options need lam >= 0, inner_steps >= 1, personal_lr > 0 and beta > 0")
        self.lam, self.inner_steps, self.personal_lr, self.beta = lam, inner_steps, personal_lr, beta

    def aggregate(self, uploads: list[Upload], round_idx: int, server: dict[str, Any]) -> dict[str, Download]:
        average = self.average(uploads)
        previous = server.get("global", average)
        server["global"] = aggregation.weighted_average([previous, average], torch.tensor([1 - self.beta, self.beta]))
        return {u.site: Download(params=dict(server["global"])) for u in uploads}

    def train_batch(self, site, inputs, targets):
        shared, personal = site.models["shared"], site.models["personal"]
        theta, w = list(personal.parameters()), list(shared.parameters())
        loss = solve_personalized(
            theta, w, lambda: self.supervised_loss(site, personal(inputs)[0], targets), self.lam, self.personal_lr, self.inner_steps
        )
        check_finite(site, loss)
        moreau_step(w, theta, self.lam, site.optimizers["shared"].param_groups[0]["lr"])
        with torch.no_grad():
            for mine, theirs in zip(shared.buffers(), personal.buffers()):
                mine.copy_(theirs)
        return {"personal": loss}
