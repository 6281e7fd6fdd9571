"""Writes a synthetic federation in the real raw layouts (HAM10000 + ISIC 2017), so the real loaders run on it.

Output (under `out`): HAM10000_metadata.csv + HAM10000_images/*.jpg (sites A, B, C, OOD),
ISIC-2017/<ground-truth csv> + ISIC-2017/images/*.jpg + ISIC-2017/msk_image_ids.txt (site D), and
synthetic.json (seed, scale, counts, generator version). Everything is written into a hidden
temporary folder that is renamed to `out` only when complete, with synthetic.json last.
"""

from __future__ import annotations

import csv
import io
import json
import logging
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from PIL import Image

from prrfl.data.publish import build_dir, map_in_workers
from prrfl.data.shift import check_shift

from .acquisition import SITE_PROFILES, acquire, shifted
from .layout import (
    CLASS_INDEX,
    DEFAULT_LAYOUT,
    HAM_COLUMNS,
    ISIC_COLUMNS,
    SITE_NAMES,
    SITES,
    SYNTHETIC_MARKER,
    RawLayout,
)
from .lesions import sample_lesion
from .plan import GENERATOR_VERSION, SynthImage, plan_federation, table_counts
from .render import draw_hair, draw_lesion, draw_skin, sample_view
from .splitting import HELDOUT_MIN_PER_CLASS

log = logging.getLogger(__name__)

DEFAULT_IMAGE_SIZE = (600, 450)  # HAM10000's width x height


def render_synthetic_image(item: SynthImage, width: int, height: int, shift: float = 1.0) -> Image.Image:
    """The picture of one planned image (deterministic in its seeds), before JPEG encoding; `shift` scales the
    cohorts' acquisition differences (acquisition.shifted)."""
    profile = shifted(SITE_PROFILES[item.site], shift)
    spec = sample_lesion(item.kind, np.random.default_rng(item.lesion_seed))
    rng = np.random.default_rng(item.image_seed)
    img, fine = draw_skin(rng, width, height, rng.uniform(*profile.skin))
    draw_lesion(img, spec, sample_view(spec, rng, width, height, profile.zoom))
    img *= 1 + fine
    draw_hair(img, rng, int(rng.poisson(profile.hair * rng.gamma(2.0, 0.5))))
    return acquire(img, rng, profile)


def encode_jpeg(im: Image.Image, quality: int) -> bytes:
    buf = io.BytesIO()
    im.save(buf, "JPEG", quality=quality)
    return buf.getvalue()


def _write_one(task: tuple[SynthImage, int, int, str, float]) -> None:
    item, width, height, path, shift = task
    im = render_synthetic_image(item, width, height, shift)
    Path(path).write_bytes(encode_jpeg(im, shifted(SITE_PROFILES[item.site], shift).jpeg_quality))


def _image_path(root: Path, item: SynthImage, layout: RawLayout) -> Path:
    if SITES[item.site].source == "ham10000":
        return root / layout.ham_images / f"{item.image_id}{layout.image_ext}"
    return root / layout.isic_dir / layout.isic_images / f"{item.image_id}{layout.image_ext}"


def _write_tables(root: Path, items: Sequence[SynthImage], layout: RawLayout) -> None:
    ham = [i for i in items if SITES[i.site].source == "ham10000"]
    isic = [i for i in items if SITES[i.site].source == "isic2017"]
    if ham:
        with open(root / layout.ham_csv, "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(HAM_COLUMNS)
            for i in ham:
                w.writerow([i.lesion_id, i.image_id, i.dx, i.dx_type, i.age, i.sex, i.localization, SITES[i.site].cohort])
    if isic:
        base = root / layout.isic_dir
        with open(base / layout.isic_csv, "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(ISIC_COLUMNS)
            for i in isic:
                w.writerow([i.image_id, f"{float(i.dx == 'mel'):.1f}", f"{float(i.dx == 'bkl'):.1f}"])
        (base / layout.msk_ids).write_text("".join(f"{i.image_id}\n" for i in isic if i.msk))


def generate_synthetic(
    out: str | Path,
    *,
    scale: float = 1.0,
    seed: int = 0,
    image_size: tuple[int, int] = DEFAULT_IMAGE_SIZE,
    workers: int = 1,
    sites: Sequence[str] = SITE_NAMES,
    heldout_min_per_class: int = HELDOUT_MIN_PER_CLASS,
    distractors: bool = True,
    metadata_dir: str | Path | None = None,
    overwrite: bool = False,
    layout: RawLayout = DEFAULT_LAYOUT,
    shift: float = 1.0,
) -> dict:
    """Write the synthetic raw layout to `out` and return the content of its synthetic.json.

    `image_size` is (width, height); `metadata_dir` (the authors' split folder) lends real ids,
    lesion ids and demographics to sites A-D; `distractors` adds the rows real data has and the
    loaders must drop (other HAM10000 diagnoses, non-MSK ISIC images); `heldout_min_per_class` (M)
    sets the per-class floor of the counts (plan.table_counts: 3M per class at a training site).
    `workers` > 1 renders in spawned processes (from 100 images per worker on), so the calling
    program's main module must be importable and guarded by `if __name__ == "__main__"`. `shift` scales
    how much the cohorts' acquisitions differ (acquisition.shifted; 1 = the site profiles as written).
    """
    check_shift(shift)  # before any work
    width, height = (int(v) for v in image_size)
    if width < 16 or height < 16:
        raise ValueError(f"image_size {image_size} is too small (at least 16x16)")
    t0 = time.perf_counter()
    items = plan_federation(
        scale,
        seed,
        sites=sites,
        heldout_min_per_class=heldout_min_per_class,
        distractors=distractors,
        metadata_dir=Path(metadata_dir) if metadata_dir else None,
    )
    out = Path(out)

    def write(tmp: Path) -> dict:
        (tmp / layout.ham_images).mkdir()
        (tmp / layout.isic_dir / layout.isic_images).mkdir(parents=True)
        _write_tables(tmp, items, layout)
        map_in_workers(_write_one, [(i, width, height, str(_image_path(tmp, i, layout)), shift) for i in items], workers)
        info = {
            "generator": "prrfl.tasks.derm.synthetic",
            "version": GENERATOR_VERSION,
            "seed": seed,
            "scale": scale,
            "image_size": [width, height],
            "heldout_min_per_class": heldout_min_per_class,
            "site_shift": shift,
            "sites": list(sites),
            "counts": {
                s: dict(zip(CLASS_INDEX, c, strict=True))
                for s, c in table_counts(scale, heldout_min_per_class=heldout_min_per_class, sites=sites).items()
            },
            "distractor_rows": sum(1 for i in items if i.kind == "other" or not i.msk),
            "images": len(items),
            "metadata_dir": str(metadata_dir) if metadata_dir else None,
        }
        (tmp / SYNTHETIC_MARKER).write_text(json.dumps(info, indent=2) + "\n")
        return info

    info = build_dir(out, write, overwrite=overwrite)
    log.info(
        "synthetic dermoscopy: %d images %dx%d written to %s in %.1f s",
        len(items),
        width,
        height,
        out,
        time.perf_counter() - t0,
    )
    return info
