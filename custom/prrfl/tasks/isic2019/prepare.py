"""FLamby's layout -> prepared per-centre splits (<out>/<centre>/{train,valid,test}.npz) and manifest.json.

Splits: FLamby's test fold is each centre's test split, untouched. Its train fold is split once more, stratified by
class: `valid_fraction` of each class's training images (rounded, at least one wherever the class has 3 or more)
form the validation split that selects each site's model; the rest train. FLamby and FCA have no validation split
(FCA reports its last round); carving it out of the training fold keeps the test fold held out for the report.
A class a centre lacks stays absent from all its splits (a missing class is the task's point, not an error).

Images: RGB, centre square crop on the shorter side, bicubic resize to `size` (FCA: 224). FLamby's resize script
leaves every image with a shorter side of 224 px: an image of another size was not prepared by it, and is refused
by name before anything is decoded (`short_side=None` accepts any size). Each file is written atomically and
manifest.json last: a folder with a manifest is complete.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from prrfl.data.manifest import PreparedManifest, config_hash, write_manifest
from prrfl.tasks.derm.images import load_square

from .layout import CENTRES, CLASS_NAMES, MANIFEST_NAME, NUM_CLASSES, SHORT_SIDE, SPLITS, SYNTHETIC_MARKER
from .records import IsicRecord, read_flamby
from .store import save_split, split_path

log = logging.getLogger(__name__)

FORMAT = "prrfl.isic2019.prepared/1"
VALID_FRACTION = 0.1
SPLIT_RULE = (
    "test = FLamby's test fold; valid = per class, round(valid_fraction x the class's train-fold images), at least 1 "
    "where the class has >= 3, drawn with the split seed; train = the rest of FLamby's train fold"
)


class Manifest(PreparedManifest):
    FORMAT = FORMAT
    KIND = "Fed-ISIC2019"

    def table(self) -> str:
        head = f"| centre | split | n | {' | '.join(CLASS_NAMES)} |"
        rows = [head, "|" + "---|" * (3 + NUM_CLASSES)]
        for centre, info in self.data["sites"].items():
            for split, s in info["splits"].items():
                rows.append(f"| {centre} | {split} | {s['n']} | " + " | ".join(str(s["counts"][c]) for c in CLASS_NAMES) + " |")
        return "\n".join(rows)


def valid_assignment(labels: Sequence[int], fraction: float, seed: int) -> np.ndarray:
    """Which training-fold images go to validation (bool per image): per class, the first round(fraction x n) of a
    seeded shuffle, at least one where the class has 3 or more images (so that it still trains on 2), none below."""
    labels = np.asarray(labels, np.int64)
    chosen = np.zeros(len(labels), bool)
    rng = np.random.default_rng(seed)
    for c in range(NUM_CLASSES):
        members = np.flatnonzero(labels == c)
        n = len(members)
        k = max(1, round(fraction * n)) if n >= 3 else 0
        chosen[rng.permutation(members)[:k]] = True
    return chosen


def check_short_sides(records: Sequence[IsicRecord], short_side: int) -> None:
    """Every image's shorter side is `short_side` (read from the file headers), or an error naming the first other."""
    for r in records:
        try:
            with Image.open(r.path) as im:
                size = im.size
        except OSError as e:
            raise ValueError(f"cannot read image {r.path}: {e}") from e
        if min(size) != short_side:
            raise ValueError(
                f"{r.path}: {size[0]}x{size[1]} px, but FLamby's resize script leaves every Fed-ISIC2019 image with a shorter "
                f"side of {short_side} px: prepare the images with it (or pass --any-size)"
            )


def prepare_isic2019(
    raw_root: str | Path,
    out_root: str | Path,
    *,
    size: int = 224,
    seed: int = 0,
    valid_fraction: float = VALID_FRACTION,
    centres: Sequence[str] = CENTRES,
    split_csv: str | Path | None = None,
    short_side: int | None = SHORT_SIDE,
) -> Manifest:
    """Prepare the requested centres of the FLamby layout under `raw_root` into `out_root` (module docstring)."""
    t0 = time.perf_counter()
    if not isinstance(size, int) or size < 8:
        raise ValueError(f"size must be an integer >= 8, got {size!r}")
    if not 0 < valid_fraction < 1:
        raise ValueError(f"valid_fraction must lie in (0, 1), got {valid_fraction!r}")
    unknown = [c for c in centres if c not in CENTRES]
    if unknown:
        raise ValueError(f"unknown Fed-ISIC2019 centre(s) {unknown}; expected some of {list(CENTRES)}")
    raw_root, out_root = Path(raw_root), Path(out_root)
    (out_root / MANIFEST_NAME).unlink(missing_ok=True)  # from here on the folder is not complete
    records = [r for r in read_flamby(raw_root, split_csv) if r.centre in centres]
    if short_side is not None:
        check_short_sides(records, short_side)
    sites: dict[str, Any] = {}
    warnings: list[str] = []
    for centre in centres:
        recs = sorted((r for r in records if r.centre == centre), key=lambda r: r.image_id)
        train_fold = [r for r in recs if r.fold == "train"]
        to_valid = valid_assignment(
            [r.label for r in train_fold], valid_fraction, int(np.random.SeedSequence([seed, CENTRES.index(centre)]).generate_state(1)[0])
        )
        members = {
            "train": [r for r, v in zip(train_fold, to_valid) if not v],
            "valid": [r for r, v in zip(train_fold, to_valid) if v],
            "test": [r for r in recs if r.fold == "test"],
        }
        sites[centre] = {"splits": {}}
        for split in SPLITS:
            chosen = members[split]
            labels = np.array([r.label for r in chosen], np.int64)
            images = np.stack([load_square(r.path, size) for r in chosen]) if chosen else np.zeros((0, 3, size, size), np.uint8)
            save_split(split_path(out_root, centre, split), images, labels, [r.image_id for r in chosen])
            counts = np.bincount(labels, minlength=NUM_CLASSES)
            sites[centre]["splits"][split] = {"n": len(chosen), "counts": dict(zip(CLASS_NAMES, map(int, counts)))}
        absent = [CLASS_NAMES[c] for c in range(NUM_CLASSES) if not sites[centre]["splits"]["train"]["counts"][CLASS_NAMES[c]]]
        if absent:
            warnings.append(f"centre {centre}: no training image of {', '.join(absent)}")
    synthetic = raw_root / SYNTHETIC_MARKER
    config = {
        "format": FORMAT,
        "size": size,
        "seed": seed,
        "valid_fraction": valid_fraction,
        "centres": list(centres),
        "short_side": short_side,
        "synthetic": json.loads(synthetic.read_text()) if synthetic.is_file() else None,
    }
    manifest = {
        "format": FORMAT,
        "config": config,
        "config_hash": config_hash(config),
        "classes": list(CLASS_NAMES),
        "image_layout": "uint8 [N,3,S,S] RGB, centre square crop of the shorter side, bicubic resize",
        "split_rule": SPLIT_RULE,
        "sources": {"raw_root": str(raw_root.resolve()), "split_csv": str(Path(split_csv).resolve()) if split_csv else None},
        "sites": sites,
        "warnings": warnings,
    }
    write_manifest(out_root, manifest)
    log.info("prepared %d centre(s) at %d px into %s in %.1f s", len(centres), size, out_root, time.perf_counter() - t0)
    return Manifest(out_root, manifest)
