"""What the synthetic federation contains, decided without drawing a pixel: counts, ids, lesions, metadata.

Counts follow Table I scaled by `scale`, raised to a per-class floor of M images for each split
the cohort has (table_counts: 3M at a training site, M at the test-only cohort; M =
heldout_min_per_class, splitting.py), so that train, valid and test each hold every class at least
M times once split with that minimum. Images are grouped into lesions (some
lesions photographed 2-3 times, at the sites where HAM10000 has such lesions) and, optionally,
take the real ids / lesion ids / demographics of the authors' split files, so that only the
pixels are synthetic. Each image carries two seeds: its lesion's (shape, colours) and its own
(framing, skin, hair, acquisition jitter).
"""

from __future__ import annotations

import logging
import math
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .author_splits import AuthorRow, read_author_splits
from .layout import CLASS_NAMES, OTHER_HAM_DX, SITE_NAMES, SPLITS, site
from .splitting import HELDOUT_MIN_PER_CLASS, check_heldout_min

log = logging.getLogger(__name__)

GENERATOR_VERSION = "2"  # 2: look-alike features (lesions.AMBIGUITY)
MULTI_IMAGE_P = {"A": 0.25, "B": 0.0, "C": 0.2, "D": 0.0, "OOD": 0.15}  # P(lesion has 2-3 images)
DISTRACTOR_FRACTION = 0.02  # extra rows the loaders must drop (HAM: other diagnoses; ISIC: non-MSK)
LOCALIZATIONS = (
    "back",
    "lower extremity",
    "trunk",
    "upper extremity",
    "abdomen",
    "face",
    "chest",
    "foot",
    "neck",
    "scalp",
    "hand",
)


def class_floor(site_name: str, heldout_min_per_class: int = HELDOUT_MIN_PER_CLASS) -> int:
    """Fewest images of a class at a cohort: M per split it has (train, valid, test; test only for
    the out-of-distribution cohort), M = heldout_min_per_class."""
    m = check_heldout_min(heldout_min_per_class)
    return m if site(site_name).test_only else len(SPLITS) * m


def table_counts(
    scale: float = 1.0,
    *,
    heldout_min_per_class: int = HELDOUT_MIN_PER_CLASS,
    sites: Sequence[str] = SITE_NAMES,
) -> dict[str, tuple[int, int, int]]:
    """Per-site (nv, bkl, mel) counts: round-half-up(Table I x scale), at least class_floor(site).

    scale=1.0 gives Table I exactly for every M <= 8 (the smallest Table I class at a training site
    is B's 24 melanomas, at the test-only cohort its 10 keratoses).
    """
    if not scale > 0:
        raise ValueError(f"scale must be > 0, got {scale}")
    out = {}
    for s in sites:
        floor = class_floor(s, heldout_min_per_class)
        out[s] = tuple(max(floor, int(math.floor(n * scale + 0.5))) for n in site(s).table)
    return out


@dataclass(frozen=True)
class SynthImage:
    """One image to synthesise, with the metadata its CSV row will carry."""

    site: str
    image_id: str
    lesion_id: str  # '' for ISIC 2017 (no lesion ids there)
    dx: str  # HAM10000 dx (nv/bkl/mel, or a diagnosis the loaders drop)
    kind: str  # lesion renderer: nv, bkl, mel or other
    lesion_seed: int
    image_seed: int
    dx_type: str = ""
    age: str = ""
    sex: str = ""
    localization: str = ""
    msk: bool = True  # ISIC 2017 rows only: listed in msk_image_ids.txt


def _seed(*keys: int) -> int:
    return int(np.random.SeedSequence([int(k) & 0xFFFFFFFF for k in keys]).generate_state(1)[0])


def _crc(text: str) -> int:
    return zlib.crc32(text.encode())


def _meta(rng: np.random.Generator, site_name: str, dx: str) -> dict[str, str]:
    mean_age = {"nv": 42, "bkl": 64, "mel": 60}.get(dx, 62)
    age = int(np.clip(5 * round(rng.normal(mean_age, 14) / 5), 5, 85))
    if dx == "nv":
        dx_type = "follow_up" if site_name == "B" else str(rng.choice(["histo", "consensus"]))
    else:
        dx_type = "histo" if dx == "mel" or rng.random() < 0.5 else "consensus"
    return {
        "dx_type": dx_type,
        "age": str(age),
        "sex": str(rng.choice(["male", "female"])),
        "localization": str(rng.choice(LOCALIZATIONS)),
    }


def _synthetic_rows(seed: int, site_idx: int, site_name: str, counts: Sequence[int], rng: np.random.Generator) -> list[dict]:
    """Rows with lesion grouping (ids assigned later)."""
    rows = []
    p_multi = MULTI_IMAGE_P[site_name]
    lesion = 0
    for label, n in enumerate(counts):
        dx = CLASS_NAMES[label]
        left = n
        while left > 0:
            k = 1 if rng.random() >= p_multi else (2 if rng.random() < 0.7 else 3)
            k = min(k, left)
            meta = _meta(rng, site_name, dx)
            for _ in range(k):
                rows.append({"dx": dx, "kind": dx, "lesion": lesion, "lesion_seed": _seed(seed, site_idx, lesion, 1), **meta})
            lesion += 1
            left -= k
    return rows


def _author_rows(
    pool: dict[int, list[AuthorRow]], counts: Sequence[int], seed: int, rng: np.random.Generator, site_name: str
) -> list[dict]:
    rows = []
    for label, n in enumerate(counts):
        avail = pool.get(label, [])
        if n > len(avail):
            log.warning(
                "site %s class %s: %d images asked, the authors' files hold %d: using all",
                site_name,
                CLASS_NAMES[label],
                n,
                len(avail),
            )
        chosen = avail if n >= len(avail) else [avail[i] for i in sorted(rng.choice(len(avail), n, replace=False))]
        dx = CLASS_NAMES[label]
        for r in chosen:
            rows.append(
                {
                    "dx": dx,
                    "kind": dx,
                    "image_id": r.image_id,
                    "lesion_id": r.lesion_id or "",
                    "lesion_seed": _seed(seed, _crc(r.lesion_id or r.image_id), 2),
                    "dx_type": r.dx_type,
                    "age": r.age,
                    "sex": r.sex,
                    "localization": r.localization,
                }
            )
    return rows


def plan_federation(
    scale: float,
    seed: int,
    *,
    sites: Sequence[str] = SITE_NAMES,
    heldout_min_per_class: int = HELDOUT_MIN_PER_CLASS,
    distractors: bool = True,
    metadata_dir: Path | None = None,
) -> list[SynthImage]:
    """Every image of the synthetic federation, in CSV order (shuffled within each site)."""
    counts = table_counts(scale, heldout_min_per_class=heldout_min_per_class, sites=sites)
    authors = {}
    if metadata_dir is not None:
        with_meta = [s for s in sites if s in ("A", "B", "C", "D")]
        authors = read_author_splits(Path(metadata_dir), with_meta)
    per_site: list[tuple[str, list[dict]]] = []
    for s in sites:
        site_idx = SITE_NAMES.index(s)
        rng = np.random.default_rng(_seed(seed, site_idx, 0))
        if s in authors:
            pool: dict[int, list[AuthorRow]] = {}
            for split in SPLITS:
                for r in authors[s][split]:
                    pool.setdefault(r.label, []).append(r)
            rows = _author_rows(pool, counts[s], seed, rng, s)
        else:
            rows = _synthetic_rows(seed, site_idx, s, counts[s], rng)
        n_extra = max(1, int(math.floor(DISTRACTOR_FRACTION * len(rows) + 0.5))) if distractors else 0
        for j in range(n_extra):
            if site(s).source == "ham10000":
                dx = OTHER_HAM_DX[int(rng.integers(len(OTHER_HAM_DX)))]
                rows.append(
                    {
                        "dx": dx,
                        "kind": "other",
                        "lesion": f"x{j}",
                        "lesion_seed": _seed(seed, site_idx, j, 3),
                        **_meta(rng, s, dx),
                    }
                )
            else:
                dx = CLASS_NAMES[int(rng.integers(len(CLASS_NAMES)))]
                rows.append({"dx": dx, "kind": dx, "msk": False, "lesion_seed": _seed(seed, site_idx, j, 4)})
        order = rng.permutation(len(rows))
        per_site.append((s, [rows[i] for i in order]))
    return _assign_ids(per_site, seed)


def _assign_ids(per_site: list[tuple[str, list[dict]]], seed: int) -> list[SynthImage]:
    """Synthetic ids ISIC_9xxxxxx / HAM_9xxxxxx, drawn as a permutation so ids reveal nothing."""
    rng = np.random.default_rng(_seed(seed, 99))
    n_img = sum(1 for _, rows in per_site for r in rows if "image_id" not in r)
    img_ids = iter(rng.permutation(n_img))
    lesion_keys = sorted({(s, r["lesion"]) for s, rows in per_site for r in rows if "lesion" in r}, key=str)
    les_ids = dict(zip(lesion_keys, rng.permutation(len(lesion_keys)), strict=True))
    out = []
    for s, rows in per_site:
        site_idx = SITE_NAMES.index(s)
        ham = site(s).source == "ham10000"
        for r in rows:
            image_id = r.get("image_id") or f"ISIC_9{next(img_ids):06d}"
            if "lesion_id" in r:
                lesion_id = r["lesion_id"]
            else:
                lesion_id = f"HAM_9{les_ids[(s, r['lesion'])]:06d}" if ham else ""
            out.append(
                SynthImage(
                    site=s,
                    image_id=image_id,
                    lesion_id=lesion_id,
                    dx=r["dx"],
                    kind=r["kind"],
                    lesion_seed=r["lesion_seed"],
                    image_seed=_seed(seed, site_idx, _crc(image_id), 5),
                    dx_type=r.get("dx_type", ""),
                    age=r.get("age", ""),
                    sex=r.get("sex", ""),
                    localization=r.get("localization", ""),
                    msk=r.get("msk", True),
                )
            )
    return out
