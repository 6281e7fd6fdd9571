"""Prepared splits on disk: <root>/<centre>/<split>.npz with images uint8 [N,3,S,S], labels int64 [N], image ids."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from prrfl.data.npz import load_npz, save_npz

from .layout import NUM_CLASSES, SPLITS

NPZ_KEYS = ("images", "labels", "image_ids")


@dataclass(frozen=True)
class IsicSplit:
    images: torch.Tensor  # uint8 [N, 3, S, S]
    labels: torch.Tensor  # int64 [N], layout.CLASS_NAMES order
    image_ids: list[str]

    def __len__(self) -> int:
        return int(self.labels.shape[0])


def split_path(root: str | Path, centre: str, split: str) -> Path:
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; expected one of {SPLITS}")
    return Path(root) / centre / f"{split}.npz"


def _validate(path: Path, images: np.ndarray, labels: np.ndarray, ids: np.ndarray) -> None:
    if images.dtype != np.uint8 or images.ndim != 4 or images.shape[1] != 3 or images.shape[2] != images.shape[3]:
        raise ValueError(f"{path}: 'images' must be uint8 [N,3,S,S], got {images.dtype} {list(images.shape)}")
    if labels.ndim != 1 or labels.dtype.kind not in "iu" or labels.shape[0] != images.shape[0]:
        raise ValueError(f"{path}: 'labels' must be an integer vector of length {images.shape[0]}, got {labels.dtype} {list(labels.shape)}")
    if labels.size and (labels.min() < 0 or labels.max() >= NUM_CLASSES):
        raise ValueError(f"{path}: 'labels' must lie in 0..{NUM_CLASSES - 1}, got {labels.min()}..{labels.max()}")
    if ids.shape != labels.shape:
        raise ValueError(f"{path}: 'image_ids' must have length {labels.shape[0]}, got {list(ids.shape)}")


def save_split(path: Path, images: np.ndarray, labels: np.ndarray, image_ids: list[str]) -> Path:
    """Write one split atomically (validated first)."""
    arrays = {"images": images, "labels": labels.astype(np.int64), "image_ids": np.asarray(image_ids, dtype=str)}
    _validate(path, arrays["images"], arrays["labels"], arrays["image_ids"])
    return save_npz(path, arrays)


def load_split(root: str | Path, centre: str, split: str) -> IsicSplit:
    """Read and validate <root>/<centre>/<split>.npz; a missing or corrupt file raises an error naming it."""
    path = split_path(root, centre, split)
    arrays = load_npz(path, NPZ_KEYS, command="python -m prrfl.tasks.isic2019 prepare")
    _validate(path, arrays["images"], arrays["labels"], arrays["image_ids"])
    return IsicSplit(
        torch.from_numpy(arrays["images"]), torch.from_numpy(arrays["labels"].astype(np.int64)), [str(i) for i in arrays["image_ids"]]
    )
