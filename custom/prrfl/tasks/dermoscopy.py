"""What the dermoscopy classification tasks share (derm, isic2019): one prepared folder per site of uint8 square
RGB images in npz splits, the slim VGG-16BN, the dermoscopy augmentation, the model card's preprocessing."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

import torch

from prrfl.data.augment import DermAugment, normalize
from prrfl.models import SlimVGG16BN
from prrfl.tasks.classification import ClassificationTask
from prrfl.tasks.contract import SiteData, Split


class StoredSplit(Protocol):
    images: torch.Tensor  # uint8 [N, 3, S, S]
    labels: torch.Tensor  # int64 [N]

    def __len__(self) -> int: ...


class DermoscopyTask(ClassificationTask):
    """A dermoscopy task reads its prepared splits (`read_split`, `split_file`); the rest is shared."""

    prediction = "images"

    def __init__(self, data_cfg: dict[str, Any]):
        super().__init__(data_cfg)
        self.augment = DermAugment()

    def read_split(self, root: Path, cohort: str, split: str) -> StoredSplit:
        """One prepared split of a cohort, checked (an error names the file)."""
        raise NotImplementedError

    def split_file(self, root: Path, cohort: str, split: str) -> Path:
        raise NotImplementedError

    def build_model(self) -> torch.nn.Module:
        return SlimVGG16BN(num_classes=self.num_classes)

    def preprocessing(self) -> dict[str, Any]:
        size = self.data_cfg["image_size"]
        return {
            "input": "dermoscopic image file (JPEG or PNG)",
            "image_size": size,
            "channels": 3,
            "steps": [
                "decoded as RGB",
                "centre square crop on the shorter side",
                f"bicubic resize to {size} x {size}, uint8",
                "x / 127.5 - 1 (values in [-1, 1])",
            ],
        }

    def load_site(self, cohort: str, device: torch.device, data_root: str | None) -> SiteData:
        root = self.prepared_root(data_root)
        self.cohort_dir(root, cohort)
        splits = {}
        for name in ("train", "valid", "test"):
            s = self.read_split(root, cohort, name)
            if name == "train" and len(s) == 0 and cohort != self.ood_cohort:  # the OOD cohort is test-only
                raise ValueError(f"{self.split_file(root, cohort, name)} holds no image: site {cohort} has nothing to train on")
            if s.images.shape[-1] != self.data_cfg["image_size"]:
                raise ValueError(
                    f"{self.split_file(root, cohort, name)} holds {s.images.shape[-1]} px images but the job asks for "
                    f"image_size={self.data_cfg['image_size']}"
                )
            splits[name] = Split(images=s.images.to(device), targets=s.labels.to(device))
        return self.site_data(cohort, **splits)

    def train_transform(self, images: torch.Tensor, targets: torch.Tensor, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        return self.augment(images, generator), targets

    def eval_transform(self, images: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return normalize(images), targets
