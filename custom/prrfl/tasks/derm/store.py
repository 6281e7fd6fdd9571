"""Prepared splits on disk: <root>/<site>/<split>.npz with images uint8 [N,3,S,S], labels int64 [N], ids.

npz (uncompressed, prrfl.data.npz) because it is plain numpy, loads without pickle, memory-maps
nothing surprising and needs no extra dependency; a split is read once per process and moved to
the device whole.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from prrfl.data.npz import load_npz, save_npz

from .layout import NUM_CLASSES, SPLITS

NPZ_KEYS = ("images", "labels", "image_ids", "lesion_ids")


@dataclass(frozen=True)
class DermSplit:
    """One split of one site, ready for training (images stay uint8; normalisation happens on the device)."""

    images: torch.Tensor  # uint8 [N, 3, S, S]
    labels: torch.Tensor  # int64 [N], nv=0 bkl=1 mel=2
    image_ids: list[str]
    lesion_ids: list[str]  # '' where unknown

    def __len__(self) -> int:
        return int(self.labels.shape[0])


def split_path(root: str | Path, site: str, split: str) -> Path:
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; expected one of {SPLITS}")
    return Path(root) / site / f"{split}.npz"


def save_split(path: Path, images: np.ndarray, labels: np.ndarray, image_ids: list[str], lesion_ids: list[str]) -> Path:
    """Write one split atomically (validated first, so a bad array never reaches the disk)."""
    _validate(path, images, labels, np.asarray(image_ids, dtype=str), np.asarray(lesion_ids, dtype=str))
    arrays = {
        "images": images,
        "labels": labels.astype(np.int64),
        "image_ids": np.asarray(image_ids, dtype=str),
        "lesion_ids": np.asarray(lesion_ids, dtype=str),
    }
    return save_npz(path, arrays)


def _validate(path: Path, images: np.ndarray, labels: np.ndarray, ids: np.ndarray, lesions: np.ndarray) -> None:
    n = labels.shape[0] if labels.ndim == 1 else -1
    if images.dtype != np.uint8 or images.ndim != 4 or images.shape[1] != 3 or images.shape[2] != images.shape[3]:
        raise ValueError(f"{path}: 'images' must be uint8 [N,3,S,S], got {images.dtype} {list(images.shape)}")
    if labels.ndim != 1 or labels.dtype.kind not in "iu" or images.shape[0] != n:
        got = f"{labels.dtype} {list(labels.shape)}"
        raise ValueError(f"{path}: 'labels' must be an integer vector of length {images.shape[0]}, got {got}")
    if n and (labels.min() < 0 or labels.max() >= NUM_CLASSES):
        raise ValueError(f"{path}: 'labels' must lie in 0..{NUM_CLASSES - 1}, got {labels.min()}..{labels.max()}")
    if ids.shape != (n,) or lesions.shape != (n,):
        raise ValueError(f"{path}: 'image_ids' / 'lesion_ids' must have length {n}, got {list(ids.shape)} / {list(lesions.shape)}")


def load_split(root: str | Path, site: str, split: str) -> DermSplit:
    """Read and validate <root>/<site>/<split>.npz; missing or corrupt files raise errors naming the file."""
    path = split_path(root, site, split)
    arrays = load_npz(path, NPZ_KEYS, command="python -m prrfl.tasks.derm prepare")
    _validate(path, arrays["images"], arrays["labels"], arrays["image_ids"], arrays["lesion_ids"])
    return DermSplit(
        images=torch.from_numpy(arrays["images"]),
        labels=torch.from_numpy(arrays["labels"].astype(np.int64)),
        image_ids=[str(i) for i in arrays["image_ids"]],
        lesion_ids=[str(i) for i in arrays["lesion_ids"]],
    )


def class_counts(split: DermSplit | torch.Tensor | np.ndarray) -> tuple[int, ...]:
    """(n_nv, n_bkl, n_mel) of a split or a label vector."""
    labels = split.labels if isinstance(split, DermSplit) else split
    labels = labels.numpy() if isinstance(labels, torch.Tensor) else np.asarray(labels)
    return tuple(int(c) for c in np.bincount(labels.astype(np.int64), minlength=NUM_CLASSES)[:NUM_CLASSES])
