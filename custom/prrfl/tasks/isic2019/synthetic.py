"""A synthetic Fed-ISIC2019 in FLamby's layout, for every machine without the data.

It writes exactly what FLamby's download and resize scripts leave on disk, so the real reader and preparation run on
it: `ISIC_2019_Training_Input_preprocessed/<image>.jpg` (shorter side 224 px) and the `train_test_split` CSV (image,
one-hot MEL..UNK, target, center, fold, fold2), plus a `synthetic.json` marker naming the generator's parameters.

Counts: FLamby's per centre, class and fold (layout.COUNTS) times `scale`, rounded; a class a centre holds keeps at
least 3 images in its train fold (so that its validation split gets one and 2 still train; fewer where FLamby has
fewer) and, where FLamby's test fold has it, 1 in its test fold; a class a centre lacks stays at 0, in both folds. At
scale 1 the counts are FLamby's.
Pixels: `render.render_image` (each centre's acquisition, eight lesion types). Image ids are numbered in a seeded
random order, so that neither an id nor a row's place in the CSV tells its centre or class.
"""

from __future__ import annotations

import csv
import io
import json
import logging
import time
from pathlib import Path

import numpy as np

from prrfl.data.publish import build_dir, map_in_workers
from prrfl.data.shift import check_shift

from .layout import CENTRES, CLASS_NAMES, COUNTS, CSV_COLUMNS, FOLDS, IMAGES_DIR, SPLIT_CSV, SYNTHETIC_MARKER, UNKNOWN_CLASS

log = logging.getLogger(__name__)

GENERATOR_VERSION = "isic2019-synth/1"
MIN_TRAIN, MIN_TEST = 3, 1  # per class a centre holds (module docstring)


def scaled_counts(scale: float) -> dict[str, dict[str, tuple[int, ...]]]:
    """Images per centre, fold and class at `scale` (module docstring)."""
    if not (scale > 0 and np.isfinite(scale)):
        raise ValueError(f"scale must be a finite number > 0, got {scale}")
    floors = {"train": MIN_TRAIN, "test": MIN_TEST}
    return {
        centre: {fold: tuple(max(min(n, floors[fold]), round(scale * n)) for n in COUNTS[centre][fold]) for fold in FOLDS}
        for centre in CENTRES
    }


def plan(scale: float, seed: int) -> list[dict]:
    """One row per image: image id, label, centre, fold and the seed of its pixels; in the CSV's (shuffled) order."""
    rows = [
        {"label": label, "centre": centre, "fold": fold}
        for centre, folds in scaled_counts(scale).items()
        for fold, counts in folds.items()
        for label, n in enumerate(counts)
        for _ in range(n)
    ]
    rng = np.random.default_rng(np.random.SeedSequence([seed, 2019]))
    order = rng.permutation(len(rows))
    pixel_seeds = rng.integers(0, 2**63 - 1, size=len(rows))
    return [{**rows[i], "image": f"ISIC_{k:07d}", "seed": int(pixel_seeds[k])} for k, i in enumerate(order)]


def _csv_text(rows: list[dict]) -> str:
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(CSV_COLUMNS)
    for r in rows:
        hot = ["1.0" if c == r["label"] else "0.0" for c in range(len(CLASS_NAMES))]
        center = CENTRES.index(r["centre"])
        writer.writerow([r["image"], *hot, "0.0", r["label"], center, r["fold"], f"{r['fold']}_{center}"])
    assert UNKNOWN_CLASS == CSV_COLUMNS[1 + len(CLASS_NAMES)]  # the "0.0" written above is the UNK column
    return buf.getvalue()


def _write_one(task: tuple[dict, str, float]) -> None:
    from .render import JPEG_QUALITY, render_image

    row, path, shift = task
    render_image(row["label"], row["centre"], row["seed"], shift).save(path, "JPEG", quality=JPEG_QUALITY[row["centre"]])


def generate_synthetic_isic2019(
    out: str | Path, *, scale: float = 1.0, seed: int = 0, shift: float = 1.0, workers: int = 1, overwrite: bool = False
) -> dict:
    """Write the synthetic FLamby layout to `out` (module docstring); returns the content of its synthetic.json.
    `shift` scales how much the centres' acquisitions differ (0: alike, 1: as designed); `workers` > 1 renders in
    spawned processes (the calling program's main module must be importable)."""
    check_shift(shift)
    t0 = time.perf_counter()
    rows = plan(scale, seed)

    def write(tmp: Path) -> dict:
        (tmp / IMAGES_DIR).mkdir()
        (tmp / SPLIT_CSV).write_text(_csv_text(rows))
        map_in_workers(_write_one, [(r, str(tmp / IMAGES_DIR / f"{r['image']}.jpg"), shift) for r in rows], workers)
        info = {
            "generator": "prrfl.tasks.isic2019.synthetic",
            "version": GENERATOR_VERSION,
            "seed": seed,
            "scale": scale,
            "site_shift": shift,
            "counts": {c: {f: dict(zip(CLASS_NAMES, n)) for f, n in folds.items()} for c, folds in scaled_counts(scale).items()},
            "images": len(rows),
        }
        (tmp / SYNTHETIC_MARKER).write_text(json.dumps(info, indent=2) + "\n")
        return info

    info = build_dir(Path(out), write, overwrite=overwrite)
    log.info("synthetic Fed-ISIC2019: %d images written to %s in %.1f s", len(rows), out, time.perf_counter() - t0)
    return info
