"""Local Learning: every site trains alone (FCA's Table 4 baseline)."""

from __future__ import annotations

from typing import Any

import torch

from prrfl.messages import Download, Upload
from prrfl.methods.method import Method
from prrfl.methods.view import SiteView


class Local(Method):
    """Local Learning (the no-federation baseline of FCA's Table 4, Wicaksana et al.): each site trains its own
    model on its own data with the run's schedule (the same rounds x local epochs, loss and optimiser as every other
    method); nothing is aggregated. Only the first download counts: it is the initial model, the same at every site.
    Later downloads carry nothing (the server sends each site an empty download), so every site keeps its own model
    from round to round.

    Choices: no weight travels (`shared_keys` is empty; the upload carries only the site's counts); the site reports
    its model after its local epochs, selected on its validation split like every personalized method. Applies to
    every task.
    """

    name = "local"

    def shared_keys(self, model: torch.nn.Module) -> list[str]:
        return []

    def aggregate(self, uploads: list[Upload], round_idx: int, server: dict[str, Any]) -> dict[str, Download]:
        return {u.site: Download(params={}) for u in uploads}

    def on_download(self, site: SiteView, download: Download, first: bool) -> None:
        if first:  # the initial model; afterwards the site's model is its own
            super().on_download(site, download, first)
