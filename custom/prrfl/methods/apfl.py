"""APFL: adaptive personalized federated learning (Deng et al., arXiv 2003.13461, 2020)."""

from __future__ import annotations

from typing import Any

import torch
from torch.func import functional_call

from prrfl.messages import Download
from prrfl.methods.fedavg import FedAvg
from prrfl.methods.method import check_finite
from prrfl.methods.view import SiteView


def mix_parameters(personal: torch.nn.Module, shared: torch.nn.Module, alpha: torch.Tensor | float) -> dict[str, torch.Tensor]:
    """v_bar = alpha * v + (1 - alpha) * w per parameter; gradients reach v and alpha, not w."""
    w = dict(shared.named_parameters())
    return {n: alpha * v + (1 - alpha) * w[n].detach() for n, v in personal.named_parameters()}


class APFL(FedAvg):
    """Each site keeps its copy w of the shared model, a local model v and a mixing weight alpha;
    the personalized model is the parameter mixture v_bar = alpha * v + (1 - alpha) * w. On every
    batch (the paper's Algorithm 1, one learning rate eta = the loop's):
        w     <- w - eta * grad f(w)                      (plain local SGD, averaged by the server)
        v     <- v - eta * grad_v f(v_bar)                (= alpha * grad f(v_bar))
        alpha <- clip(alpha - eta * <v - w, grad f(v_bar)>, 0, 1)   (when `adaptive_alpha`)
    The evaluated model is v_bar (role `mixed`), rebuilt after every download and local epoch.

    Choices: alpha starts at 0.5 and is learned (adaptive_alpha=True); v_bar's forward uses v's
    BatchNorm running statistics, which that forward updates, so the mixed model carries them; w's
    update and v's use the loop's SGD optimisers; the whole w travels and is averaged by
    training-set size; v never leaves the site.
    """

    name = "apfl"
    global_model_reported = False  # a personalized model, scored after its local epochs
    roles = ("shared", "personal", "mixed")
    eval_role = "mixed"
    upload_role = "shared"
    download_roles = ("shared",)

    def __init__(self, cfg, task, *, alpha: float = 0.5, adaptive_alpha: bool = True, **options: Any):
        super().__init__(cfg, task, **options)
        if not 0 <= alpha <= 1:
            raise ValueError(f"APFL option alpha must lie in [0, 1], got {alpha}")
        self.alpha, self.adaptive_alpha = alpha, adaptive_alpha

    def train_batch(self, site, inputs, targets):
        shared, personal = site.models["shared"], site.models["personal"]
        alpha = torch.tensor(site.memory["alpha"], device=inputs.device, requires_grad=self.adaptive_alpha)
        loss_w = self.supervised_loss(site, shared(inputs)[0], targets)
        mixed_logits = functional_call(personal, mix_parameters(personal, shared, alpha), (inputs,))[0]
        loss_mixed = self.supervised_loss(site, mixed_logits, targets)
        total = loss_w + loss_mixed
        check_finite(site, total)
        for opt in site.optimizers.values():
            opt.zero_grad(set_to_none=True)
        total.backward()
        site.optimizers["shared"].step()
        site.optimizers["personal"].step()
        if self.adaptive_alpha:
            lr = site.optimizers["personal"].param_groups[0]["lr"]
            site.memory["alpha"] = min(1.0, max(0.0, float(alpha.detach() - lr * alpha.grad)))
        return {"shared": loss_w.detach(), "mixed": loss_mixed.detach()}

    def refresh_mixed(self, site: SiteView) -> None:
        """Write v_bar into the `mixed` model (parameters mixed, buffers from v)."""
        personal, mixed = site.models["personal"], site.models["mixed"]
        with torch.no_grad():
            mixed.load_state_dict({**personal.state_dict(), **mix_parameters(personal, site.models["shared"], site.memory["alpha"])})

    def on_download(self, site: SiteView, download: Download, first: bool) -> None:
        super().on_download(site, download, first)
        site.memory.setdefault("alpha", self.alpha)
        site.memory["round"] = download.round
        self.refresh_mixed(site)

    def after_epoch(self, site: SiteView, epoch: int) -> None:
        self.refresh_mixed(site)
        site.log_scalar("apfl/alpha", site.memory["alpha"], site.memory["round"] * self.cfg.local_epochs + epoch)
