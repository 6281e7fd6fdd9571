"""FedAvg and the methods that differ from it by one rule: FedProx (local objective), FedBN and
SiloBN (which BatchNorm entries stay at the site)."""

from __future__ import annotations

from typing import Any

import torch

from prrfl.algorithms.pfa import batchnorm_keys, batchnorm_statistics_keys
from prrfl.messages import Download, Upload
from prrfl.methods.method import Method, proximal_term
from prrfl.methods.view import SiteView
from prrfl.server import aggregation


class FedAvg(Method):
    """FedAvg (McMahan et al., AISTATS 2017): each site trains its copy of the shared model for E
    local epochs; the server averages the copies weighted by training-set size and sends the
    average to every site, which overwrites its model with it.

    Choices: every state-dict entry travels, BatchNorm running statistics included. The reported
    (selected) model is the global model as each site receives it, scored on the site's validation
    and test splits when the download arrives, as the papers and FedBN's and HarmoFL's code evaluate
    after communication (the methods below inherit it: FedBN's and SiloBN's carry the site's own
    BatchNorm entries; `report_global_model=false` reports the model after the local epochs instead).
    `weighting="uniform"` gives every site 1/K.
    """

    name = "fedavg"
    global_model_reported = True
    download_roles: tuple[str, ...] = ("local",)  # the models a download (after the first) overwrites

    def __init__(self, cfg, task, *, weighting: aggregation.Weighting = "samples", **options: Any):
        super().__init__(cfg, task, **options)
        if weighting not in aggregation.WEIGHTINGS:
            raise ValueError(f"option weighting must be one of {aggregation.WEIGHTINGS}, got {weighting!r}")
        self.weighting = weighting

    def local_keys(self, model: torch.nn.Module) -> set[str]:
        """State-dict keys that never leave the site."""
        return set()

    def shared_keys(self, model: torch.nn.Module) -> list[str]:
        local = self.local_keys(model)
        return [k for k in model.state_dict() if k not in local]

    def site_weights(self, uploads: list[Upload]) -> torch.Tensor:
        return aggregation.site_weights(uploads, self.weighting)

    def average(self, uploads: list[Upload]) -> dict[str, torch.Tensor]:
        return aggregation.weighted_average([u.params for u in uploads], self.site_weights(uploads))

    def aggregate(self, uploads: list[Upload], round_idx: int, server: dict[str, Any]) -> dict[str, Download]:
        average = self.average(uploads)
        return {u.site: Download(params=dict(average)) for u in uploads}

    def global_params(self, downloads: dict[str, Download]) -> dict[str, torch.Tensor] | None:
        """The average every site received, as the global model's state dict when it is a whole one
        (None when entries stay at the sites, e.g. FedBN's BatchNorm)."""
        params = self.global_entries(next(iter(downloads.values())).params) if downloads else {}
        with torch.random.fork_rng(devices=[]):
            whole = set(self.build_global_model().state_dict())
        return params if set(params) == whole else None

    def global_entries(self, params: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The entries of a download that belong to the global model, under its key names."""
        return dict(params)

    def on_download(self, site: SiteView, download: Download, first: bool) -> None:
        """The first download (the initial model) starts every role; later ones overwrite the shared
        entries of `download_roles` (local keys stay)."""
        for role in self.roles if first else self.download_roles:
            site.models[role].load_state_dict(download.params, strict=first)


class FedProx(FedAvg):
    """FedProx (Li et al., MLSys 2020): FedAvg whose local objective adds (mu/2)||w - w_global||^2,
    w_global being the model of the last download, over all trainable parameters.

    Choices: mu = 0.01 (the paper searches {0.001, 0.01, 0.1, 1}); every site does its full E epochs
    (no partial work / straggler simulation).
    """

    name = "fedprox"

    def __init__(self, cfg, task, *, mu: float = 0.01, **options: Any):
        super().__init__(cfg, task, **options)
        if not mu >= 0:
            raise ValueError(f"FedProx option mu must be >= 0, got {mu}")
        self.mu = mu

    def on_download(self, site: SiteView, download: Download, first: bool) -> None:
        super().on_download(site, download, first)
        model = site.models[self.upload_role]
        site.memory["global_params"] = {n: p.detach().clone() for n, p in model.named_parameters()}

    def losses(self, site, targets, outputs):
        losses = super().losses(site, targets, outputs)
        pull = proximal_term(site.models[self.upload_role], site.memory["global_params"], self.mu)
        losses[self.upload_role] = losses[self.upload_role] + pull
        return losses


class FedBN(FedAvg):
    """FedBN (Li et al., ICLR 2021): FedAvg in which every BatchNorm layer (affine weight and bias,
    running statistics) stays at its site; everything else is averaged."""

    name = "fedbn"

    def local_keys(self, model: torch.nn.Module) -> set[str]:
        return batchnorm_keys(model)


class SiloBN(FedAvg):
    """SiloBN (Andreux et al., DART 2020): FedAvg in which BatchNorm running statistics (mean,
    variance, batch counter) stay at their site while the BN affine weight and bias are averaged
    with everything else.

    Choices: the site evaluates with its own running statistics (the paper's local-statistics
    inference), i.e. its model after local training.
    """

    name = "silobn"

    def local_keys(self, model: torch.nn.Module) -> set[str]:
        return batchnorm_statistics_keys(model)
