"""Per-FedAvg: personalized FedAvg by model-agnostic meta-learning (Fallah et al., NeurIPS 2020)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from prrfl.messages import Download
from prrfl.methods.fedavg import FedAvg
from prrfl.methods.method import check_finite
from prrfl.methods.view import SiteView


def sgd_step(params: Sequence[torch.Tensor], loss: torch.Tensor, lr: float) -> None:
    """p <- p - lr * dloss/dp, outside any optimiser (parameters the loss does not use stay)."""
    grads = torch.autograd.grad(loss, list(params), allow_unused=True)
    with torch.no_grad():
        for p, g in zip(params, grads):
            if g is not None:
                p.sub_(lr * g)


def first_order_meta_step(
    params: Sequence[torch.Tensor],
    inner_loss: Callable[[], torch.Tensor],
    outer_loss: Callable[[], torch.Tensor],
    alpha: float,
    optimizer: torch.optim.Optimizer,
) -> torch.Tensor:
    """Per-FedAvg (FO): w' = w - alpha * grad f(w; D), then the optimiser steps w with grad f(w'; D')
    (the first-order approximation drops the Hessian term). Returns f(w'; D')."""
    saved = [p.detach().clone() for p in params]
    sgd_step(params, inner_loss(), alpha)
    optimizer.zero_grad(set_to_none=True)
    loss = outer_loss()
    loss.backward()
    with torch.no_grad():
        for p, s in zip(params, saved):
            p.copy_(s)
    optimizer.step()
    return loss.detach()


def random_batch(site: SiteView, size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """`size` training samples drawn with replacement, augmented like the loop's batches."""
    train = site.train
    idx = torch.randint(len(train), (size,), generator=site.generator).to(train.targets.device)
    return site.task.train_transform(train.images[idx], train.targets[idx], site.generator)


class PerFedAvg(FedAvg):
    """Each site keeps the shared meta-model w and trains it with the first-order (FO) MAML step of
    `first_order_meta_step` on every batch: the loop's batch D for the inner step of size alpha,
    a second batch D' of the same size drawn at random from the training split for the outer step,
    whose size beta is the loop's learning rate (schedule included). The server averages the
    meta-models (FedAvg). The evaluated, personalized model is w after one SGD step of size alpha on
    a random training batch (`personal`), rebuilt after every download and every local epoch.

    Choices: the FO variant (not HF); alpha = 0.01; the outer step uses the loop's SGD optimiser
    (momentum and weight decay as configured); D' drawn with replacement; the whole model travels.
    """

    name = "perfedavg"
    global_model_reported = False  # a personalized model, scored after its local epochs
    roles = ("shared", "personal")
    eval_role = "personal"
    upload_role = "shared"
    download_roles = ("shared",)

    def __init__(self, cfg, task, *, alpha: float = 0.01, **options: Any):
        super().__init__(cfg, task, **options)
        if not alpha > 0:
            raise ValueError(f"Per-FedAvg option alpha must be > 0, got {alpha}")
        self.alpha = alpha

    def train_batch(self, site, inputs, targets):
        model = site.models["shared"]
        outer_inputs, outer_targets = random_batch(site, len(targets))
        loss = first_order_meta_step(
            list(model.parameters()),
            lambda: self.supervised_loss(site, model(inputs)[0], targets),
            lambda: self.supervised_loss(site, model(outer_inputs)[0], outer_targets),
            self.alpha,
            site.optimizers["shared"],
        )
        check_finite(site, loss)
        return {"shared": loss}

    def personalize(self, site: SiteView) -> None:
        personal = site.models["personal"]
        personal.load_state_dict(site.models["shared"].state_dict())
        personal.train()
        inputs, targets = random_batch(site, self.cfg.batch_size)
        sgd_step(list(personal.parameters()), self.supervised_loss(site, personal(inputs)[0], targets), self.alpha)

    def on_download(self, site: SiteView, download: Download, first: bool) -> None:
        super().on_download(site, download, first)
        self.personalize(site)

    def after_epoch(self, site: SiteView, epoch: int) -> None:
        self.personalize(site)
