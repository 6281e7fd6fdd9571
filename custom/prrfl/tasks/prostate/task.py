"""Prostate MRI segmentation (TMI 2022, Sec. IV, Table III) over 5 hospitals: clients A-E = RUNMC,
BMC (NCI-ISBI 2013), UCL, BIDMC, HK (PROMISE12); I2CVB may join as a sixth site through a site's
local `cohort` setting.

A site's data is a prepared folder (`python -m prrfl.tasks.prostate prepare`: axial T2 slices of
each case, normalised per volume and resized, split 7:1:2 by patient); with no data root the
embedded synthetic federation is generated in the same raw NIfTI layout and prepared on first use,
cached and shared by all sites of the machine. Samples are 2-D slices; Dice and IoU are computed
on each test volume from its slices.
"""

from __future__ import annotations

import math
import typing
from pathlib import Path
from typing import Any, Literal, TypedDict

import torch

from prrfl.config import check_options
from prrfl.data.augment import SliceAugment, normalize
from prrfl.data.publish import default_cache_dir
from prrfl.models.deeplab import DeepLabV2ResNet18
from prrfl.tasks.contract import SiteData, Split
from prrfl.tasks.prostate.cache import ensure_synthetic_prostate
from prrfl.tasks.prostate.layout import SITES, TABLE_SITES
from prrfl.tasks.prostate.prepare import PERCENTILES
from prrfl.tasks.prostate.splitting import MIN_VALID_CASES
from prrfl.tasks.prostate.store import load_split, split_path
from prrfl.tasks.segmentation import SegmentationTask


class ProstateData(TypedDict):
    """The `data` options of a prostate job (the task's options); validation checks each value."""

    image_size: int
    model_width: int
    prototype_pooling: Literal["area", "sum"]
    synthetic_scale: float
    synthetic_seed: int
    synthetic_matrix_scale: float
    synthetic_shift: float
    split_seed: int
    split_min_valid_cases: int
    augmentation: Literal["paper", "extended"]


DEFAULT_DATA: dict[str, Any] = {
    "image_size": 64,  # the paper: 256
    "model_width": 16,  # channels of ResNet-18's first stage; the paper's network: 64
    "prototype_pooling": "area",  # "sum": the authors' unnormalised masked pooling
    "synthetic_scale": 0.3,  # fraction of the Table I case counts (at least 3 cases per site); 1.0 = full size
    "synthetic_seed": 0,
    # how much the sites' acquisitions differ (prrfl.tasks.prostate.scanner.shifted): 1.5, calibrated on the paper's
    # baselines (docs/calibration.md); 1 = the scanner profiles as written, the federation of earlier releases
    "synthetic_shift": 1.5,
    "synthetic_matrix_scale": 1 / 3,  # in-plane matrix of the generated volumes: 1.0 = the scanners' 384-512 px
    "split_seed": 0,
    # validation cases per site at least, wherever its training split keeps 3 (prrfl.tasks.prostate.splitting);
    # 1: the plain 7:1:2 rounding, which gives the small sites a single validation volume
    "split_min_valid_cases": MIN_VALID_CASES,
    "augmentation": "paper",  # the paper's random flip and rotation; "extended": SliceAugment.extended()
}


# Job settings per profile (Task.profiles; prrfl.flare.jobs builds every prostate_<method> job from them).
# quick: the embedded synthetic federation (5 sites, 30 % of the Table I cases, 64 px slices), a width-16 DeepLab-v2
# ResNet-18, Adam 1e-3, batch 8, 10 rounds x 2 epochs. The paper's schedule scaled to these 20 epochs: lr halved
# every 8 (25 of the paper's 60 epochs x 20 / 60 = 8.3), i.e. after epochs 8 and 16 as the paper's after 25 and 50.
QUICK: dict[str, Any] = {
    "num_rounds": 10,
    "local_epochs": 2,
    "batch_size": 8,
    "optimizer": "adam",
    "lr": 1e-3,
    "lr_step_epochs": 8,
    "lr_gamma": 0.5,
    "weight_decay": 0.0,
}

# paper (TMI 2022, Sec. IV): 256 px slices, full Table I sizes, DeepLab-v2 with a ResNet-18 backbone (width 64),
# Adam 1e-3, batch 8, T = 60 epochs in rounds of E = 5, "on both datasets ... the learning rate is divided by 2
# after every 25 epochs".
PAPER: dict[str, Any] = {
    **QUICK,
    "num_rounds": 12,
    "local_epochs": 5,
    "lr_step_epochs": 25,
    "data": {"image_size": 256, "model_width": 64, "synthetic_scale": 1.0, "synthetic_matrix_scale": 1.0},
}

# bench (`prrfl sweep --profile bench`), at the paper's E = 5: 6 rounds (30 epochs), where FedAvg's global model
# stops climbing by the rule of docs/calibration.md ("The schedule"); 60 % of the Table I cases, 128 px slices, the
# quick jobs' network and schedule (lr halved every 8 epochs). Every method runs the same schedule.
BENCH: dict[str, Any] = {**QUICK, "num_rounds": 6, "local_epochs": 5, "data": {"image_size": 128, "synthetic_scale": 0.6}}


class ProstateTask(SegmentationTask):
    name = "prostate"
    num_classes = 2
    class_names = ("background", "prostate")
    site_names = TABLE_SITES  # RUNMC, BMC, UCL, BIDMC, HK: clients A-E
    extra_cohorts = tuple(s for s in SITES if s not in TABLE_SITES)  # I2CVB, through a site's settings
    paper_table = "Table III"
    profiles = {"quick": QUICK, "bench": BENCH, "paper": PAPER}
    prediction = "volumes"

    def __init__(self, data_cfg: dict[str, Any]):
        check_options(data_cfg, typing.get_type_hints(ProstateData), owner="prostate data", path="data")
        super().__init__({**DEFAULT_DATA, **data_cfg})
        d = self.data_cfg
        rules = {
            "image_size": (d["image_size"] >= 32 and d["image_size"] % 8 == 0, "a multiple of 8, >= 32"),
            "model_width": (d["model_width"] >= 4, "an integer >= 4"),
            "synthetic_scale": (0 < d["synthetic_scale"] < math.inf, "a number > 0"),
            "synthetic_matrix_scale": (0 < d["synthetic_matrix_scale"] <= 2, "a number in (0, 2]"),
            "synthetic_seed": (d["synthetic_seed"] >= 0, "an integer >= 0"),
            "synthetic_shift": (0 <= d["synthetic_shift"] < math.inf, "a number >= 0"),
            "split_seed": (d["split_seed"] >= 0, "an integer >= 0"),
            "split_min_valid_cases": (d["split_min_valid_cases"] >= 1, "an integer >= 1"),
        }
        self.check_data_ranges(rules)
        self.image_size = d["image_size"]
        self.prototype_pooling = d["prototype_pooling"]
        self.augment = SliceAugment.extended() if d["augmentation"] == "extended" else SliceAugment()

    def build_model(self) -> torch.nn.Module:
        return DeepLabV2ResNet18(num_classes=self.num_classes, in_channels=1, width=self.data_cfg["model_width"])

    def preprocessing(self) -> dict[str, Any]:
        lo, hi = PERCENTILES
        return {
            "input": "T2-weighted MRI volume (NIfTI)",
            "image_size": self.image_size,
            "channels": 1,
            "steps": [
                "reoriented to axial slices, inferior first (RAS)",
                f"intensities clipped to the volume's {lo} and {hi} percentiles and scaled to [0, 1]",
                "each slice zero-padded to a centred square",
                f"each slice resized to {self.image_size} x {self.image_size} (area when shrinking, bilinear when growing)",
                "x * 255 rounded to uint8, then x / 127.5 - 1 (values in [-1, 1])",
            ],
        }

    def prepared_root(self, data_root: str | None, workers: int = 1) -> Path:
        """A site's prepared data: its own root, or the shared synthetic federation (built on first use)."""
        if data_root:
            return self.given_root(data_root)
        d = self.data_cfg
        return Path(
            ensure_synthetic_prostate(
                default_cache_dir(),
                scale=d["synthetic_scale"],
                seed=d["synthetic_seed"],
                size=d["image_size"],
                split_seed=d["split_seed"],
                min_valid_cases=d["split_min_valid_cases"],
                matrix_scale=d["synthetic_matrix_scale"],
                shift=d["synthetic_shift"],
                workers=workers,
            )
        )

    def load_site(self, cohort: str, device: torch.device, data_root: str | None) -> SiteData:
        root = self.prepared_root(data_root)
        self.cohort_dir(root, cohort)
        splits = {}
        for name in ("train", "valid", "test"):
            s = load_split(root, cohort, name)
            path = split_path(root, cohort, name)
            if name == "train" and len(s) == 0:
                raise ValueError(f"{path} holds no slice: site {cohort} has nothing to train on")
            if s.images.shape[-1] != self.image_size:
                raise ValueError(f"{path} holds {s.images.shape[-1]} px slices but the job asks for image_size={self.image_size}")
            rows = s.volume_rows()  # each volume's slices together and in order: Dice is computed per volume
            order = torch.cat(list(rows.values())) if rows else torch.zeros(0, dtype=torch.long)
            groups = torch.cat([torch.full((len(r),), i, dtype=torch.long) for i, r in enumerate(rows.values())]) if rows else order
            splits[name] = Split(images=s.images[order].to(device), targets=s.masks[order].long().to(device), groups=groups.to(device))
        return self.site_data(cohort, **splits)

    def train_transform(self, images: torch.Tensor, targets: torch.Tensor, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        return self.augment(images, targets, generator)

    def eval_transform(self, images: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return normalize(images), targets
