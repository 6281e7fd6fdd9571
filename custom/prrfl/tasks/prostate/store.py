"""Prepared splits on disk: <root>/<site>/<split>.npz with the axial slices of whole volumes.

Arrays: `images` uint8 [N,1,S,S] (normalised slice x 255), `masks` uint8 [N,S,S] in {0,1},
`case_ids` str [N], `slice_index` int64 [N] (0 = the most inferior slice of the case). Every
slice of every case of the split is there, so `ProstateSplit.volume_rows` regroups a case's
slices in order (for a 3-D Dice). npz (uncompressed) like the dermoscopy splits: plain numpy,
loaded without pickle.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from prrfl.data.npz import load_npz, save_npz

from .layout import SPLITS

NPZ_KEYS = ("images", "masks", "case_ids", "slice_index")


@dataclass(frozen=True)
class ProstateSplit:
    """One split of one site, ready for training (images stay uint8; normalisation to [0,1] is /255)."""

    images: torch.Tensor  # uint8 [N, 1, S, S]
    masks: torch.Tensor  # uint8 [N, S, S], 1 = prostate
    case_ids: list[str]
    slice_index: torch.Tensor  # int64 [N]

    def __len__(self) -> int:
        return int(self.images.shape[0])

    @property
    def cases(self) -> list[str]:
        """The split's case ids, in order of first appearance."""
        return list(dict.fromkeys(self.case_ids))

    def volume_rows(self) -> dict[str, torch.Tensor]:
        """Per case, the row indices of its slices ordered by slice_index (inferior first)."""
        ids = np.asarray(self.case_ids)
        order = self.slice_index.numpy()
        out = {}
        for case in self.cases:
            rows = np.flatnonzero(ids == case)
            out[case] = torch.from_numpy(rows[np.argsort(order[rows], kind="stable")])
        return out

    def volume(self, case_id: str) -> tuple[torch.Tensor, torch.Tensor]:
        """(images [Z,1,S,S], masks [Z,S,S]) of one case, slices in order."""
        rows = self.volume_rows().get(case_id)
        if rows is None:
            raise KeyError(f"case {case_id!r} is not in this split (cases: {self.cases})")
        return self.images[rows], self.masks[rows]


def split_path(root: str | Path, site_name: str, split: str) -> Path:
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; expected one of {SPLITS}")
    return Path(root) / site_name / f"{split}.npz"


def _validate(path: Path, images: np.ndarray, masks: np.ndarray, case_ids: np.ndarray, slice_index: np.ndarray) -> None:
    if images.dtype != np.uint8 or images.ndim != 4 or images.shape[1] != 1 or images.shape[2] != images.shape[3]:
        raise ValueError(f"{path}: 'images' must be uint8 [N,1,S,S], got {images.dtype} {list(images.shape)}")
    n, s = images.shape[0], images.shape[2]
    if masks.dtype != np.uint8 or masks.shape != (n, s, s):
        got = f"{masks.dtype} {list(masks.shape)}"
        raise ValueError(f"{path}: 'masks' must be uint8 [{n},{s},{s}] like 'images', got {got}")
    if n and masks.max() > 1:
        raise ValueError(f"{path}: 'masks' must hold 0 and 1 only, found {int(masks.max())}")
    if case_ids.shape != (n,) or (n and case_ids.dtype.kind != "U"):
        raise ValueError(f"{path}: 'case_ids' must be {n} strings, got {case_ids.dtype} {list(case_ids.shape)}")
    if slice_index.shape != (n,) or slice_index.dtype.kind not in "iu":
        got = f"{slice_index.dtype} {list(slice_index.shape)}"
        raise ValueError(f"{path}: 'slice_index' must be {n} integers, got {got}")
    for case in np.unique(case_ids):
        idx = np.sort(slice_index[case_ids == case])
        if not np.array_equal(idx, np.arange(idx.size)):
            raise ValueError(f"{path}: the slices of case {case} must be numbered 0..{idx.size - 1} once each, got {idx.tolist()[:12]}")


def save_split(path: Path, images: np.ndarray, masks: np.ndarray, case_ids: list[str], slice_index: np.ndarray) -> Path:
    """Write one split atomically (validated first, so a bad array never reaches the disk)."""
    size = images.shape[-1] if images.ndim == 4 else 0
    arrays = {
        "images": images,
        "masks": masks,
        "case_ids": np.asarray(case_ids, dtype=str) if len(case_ids) else np.zeros(0, dtype="<U1"),
        "slice_index": np.asarray(slice_index, dtype=np.int64),
    }
    if not len(case_ids):
        arrays["images"] = images.reshape(0, 1, size, size)
        arrays["masks"] = masks.reshape(0, size, size)
    _validate(path, arrays["images"], arrays["masks"], arrays["case_ids"], arrays["slice_index"])
    return save_npz(path, arrays)


def load_split(root: str | Path, site_name: str, split: str) -> ProstateSplit:
    """Read and validate <root>/<site>/<split>.npz; missing or corrupt files raise errors naming the file."""
    path = split_path(root, site_name, split)
    arrays = load_npz(path, NPZ_KEYS, command="python -m prrfl.tasks.prostate prepare", list_expected=True)
    _validate(path, arrays["images"], arrays["masks"], arrays["case_ids"], arrays["slice_index"])
    return ProstateSplit(
        images=torch.from_numpy(arrays["images"]),
        masks=torch.from_numpy(arrays["masks"]),
        case_ids=[str(c) for c in arrays["case_ids"]],
        slice_index=torch.from_numpy(arrays["slice_index"].astype(np.int64)),
    )
