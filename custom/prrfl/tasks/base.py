"""The task contract: every data set exports the same names, so every method and runner works on it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import torch
import torch.nn.functional as F


@dataclass
class Split:
    images: torch.Tensor  # uint8 [N, C, H, W], on the training device
    labels: torch.Tensor  # int64 [N]

    def __len__(self) -> int:
        return int(self.labels.shape[0])


@dataclass
class SiteData:
    cohort: str
    train: Split
    valid: Split
    test: Split
    num_classes: int

    @property
    def num_train(self) -> int:
        return len(self.train)

    @property
    def class_counts(self) -> list[int]:
        return torch.bincount(self.train.labels.cpu(), minlength=self.num_classes).tolist()

    def split(self, name: str) -> Split:
        if name not in ("train", "valid", "test"):
            raise ValueError(f"unknown split '{name}', expected train, valid or test")
        return getattr(self, name)


class Task:
    """Base of a task package's main class."""

    name: ClassVar[str]
    num_classes: ClassVar[int]
    class_names: ClassVar[tuple[str, ...]]
    site_names: ClassVar[tuple[str, ...]]  # the federation's cohorts, in FLARE site order
    ood_cohort: ClassVar[str | None] = None  # evaluated at the end, never trained on
    primary_metric: ClassVar[str]
    classifier_key: ClassVar[str]  # state-dict key of the last classifier layer

    def __init__(self, data_cfg: dict[str, Any]):
        self.data_cfg = dict(data_cfg)

    def build_model(self) -> torch.nn.Module:
        raise NotImplementedError

    def loss(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(logits, labels)

    def load_site(self, cohort: str, device: torch.device, data_root: str | None) -> SiteData:
        raise NotImplementedError

    def train_inputs(self, images: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        raise NotImplementedError

    def eval_inputs(self, images: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def metrics(self, probs: np.ndarray, labels: np.ndarray) -> dict[str, float]:
        raise NotImplementedError

    def cohort_of(self, site_name: str) -> str:
        """FLARE site name -> cohort: the cohort's own name, or site-N -> N-th cohort. (A site named
        otherwise states its cohort in its local config.)"""
        if site_name in self.site_names:
            cohort = site_name
        elif site_name.startswith("site-") and site_name[5:].isdigit() and 1 <= int(site_name[5:]) <= len(self.site_names):
            cohort = self.site_names[int(site_name[5:]) - 1]
        else:
            raise ValueError(
                f"cannot map FLARE site '{site_name}' to a {self.name} cohort: name it one of {list(self.site_names)}, "
                f"use site-1..site-{len(self.site_names)}, or set 'cohort' in the site's local config"
            )
        return cohort
