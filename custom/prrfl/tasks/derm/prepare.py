"""Raw layouts -> prepared per-site splits (<out>/<site>/{train,valid,test}.npz) and manifest.json.

Images: RGB, centre square crop on the shorter side, bicubic resize to `size` (the paper: 128).
Splits: stratified 7:1:2 per site and class (splitting.py), by image or by lesion, or the authors'
assignment of ids to splits. A held-out split (valid, test) that holds images but fewer than M =
`heldout_min_per_class` (splitting.HELDOUT_MIN_PER_CLASS) of a class is warned about, naming site,
split and class: its macro F1 then turns on one or two images. The split itself changes only with
`enforce_heldout_min` (the stratified rule then takes at least M per held-out split from train, as
for the embedded synthetic federation). The out-of-distribution cohort (test_only) is never split: all its
images are its test split, and its train/valid files exist but are empty, so every site has the
same three files. Each file is written atomically and manifest.json last, after removing any old
one first: a folder with a manifest is complete.
"""

from __future__ import annotations

import hashlib
import json
import logging
import multiprocessing as mp
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import Any, Literal

import numpy as np

from prrfl.data.manifest import PreparedManifest, config_hash, write_manifest

from .author_splits import author_split_path, read_author_splits
from .images import load_square
from .layout import (
    CLASS_NAMES,
    DEFAULT_LAYOUT,
    MANIFEST_NAME,
    NUM_CLASSES,
    SITE_NAMES,
    SPLITS,
    SYNTHETIC_MARKER,
    RawLayout,
    site,
)
from .records import ImageRecord, check_images_exist, read_sites
from .splitting import HELDOUT_MIN_PER_CLASS, check_fractions, check_heldout_min, stratified_assignment
from .store import save_split, split_path

log = logging.getLogger(__name__)

FORMAT = "prrfl.derm.prepared/1"
RULES = {
    "stratified": "per site and class: shuffled units fill test to max(m, round(f_test*n)), then valid likewise, "
    "rest train (>= 1 unit); m = heldout_min_per_class if enforce_heldout_min else 1; all in train when the class "
    "has < 3 units (splitting.py)",
    "authors": "the authors' per-client split files assign each image id to a split; raw images they do not list are dropped",
    "test_only": "out-of-distribution cohort: every image in test, empty train and valid",
}


class Manifest(PreparedManifest):
    """The content of <root>/manifest.json, with accessors."""

    FORMAT = FORMAT
    KIND = "dermoscopy"

    def counts(self, site_name: str, split: str) -> tuple[int, ...]:
        c = self.data["sites"][site_name]["splits"][split]["counts"]
        return tuple(int(c[k]) for k in CLASS_NAMES)

    def table(self) -> str:
        """Per-site, per-split class counts as a fixed-width text table (nv/bkl/mel = total)."""
        lines = [f"{'site':<5}{'cohort':<15}" + "".join(f"{s:>22}" for s in SPLITS)]
        for s, info in self.data["sites"].items():
            cells = []
            for split in SPLITS:
                c = self.counts(s, split)
                cells.append(f"{'/'.join(map(str, c))} = {sum(c)}")
            lines.append(f"{s:<5}{(info['cohort'] or 'isic2017'):<15}" + "".join(f"{c:>22}" for c in cells))
        return "\n".join(lines)


def _file_digest(paths: Sequence[Path]) -> str:
    h = hashlib.sha256()
    for p in paths:
        h.update(p.read_bytes())
    return h.hexdigest()[:16]


def _author_assignment(
    records: list[ImageRecord], directory: Path, site_name: str, rows: dict, allow_missing: bool
) -> tuple[list[ImageRecord], list[str], list[str]]:
    """Records listed in the authors' files, their splits, and warnings."""
    by_id = {r.image_id: r for r in records}
    kept, splits, warnings = [], [], []
    listed = set()
    for split in SPLITS:
        path = author_split_path(directory, site_name, split)
        absent = []
        for row in rows[split]:
            listed.add(row.image_id)
            rec = by_id.get(row.image_id)
            if rec is None:
                absent.append(row.image_id)
                continue
            if rec.label != row.label:
                raise ValueError(
                    f"{path} line {row.line}: label {row.label} of {row.image_id} disagrees with the raw data's "
                    f"{CLASS_NAMES[rec.label]} ({rec.path.parent.parent})"
                )
            kept.append(rec)
            splits.append(split)
        if absent:
            msg = f"{path}: {len(absent)} listed image(s) are not in the raw data of site {site_name} (e.g. {absent[:3]})"
            if not allow_missing:
                raise ValueError(msg + "; pass allow_missing=True to prepare without them")
            log.warning(msg)
            warnings.append(msg)
    extra = len(records) - len(kept)
    if extra:
        msg = f"site {site_name}: {extra} raw image(s) are in none of the authors' split files: dropped"
        log.info(msg)
        warnings.append(msg)
    return kept, splits, warnings


@contextmanager
def _image_loader(size: int, workers: int, total: int) -> Iterator[Callable[[list[Path]], np.ndarray]]:
    """A function paths -> uint8 [N,3,S,S], backed by one process pool for the whole preparation."""
    if workers <= 1 or total < 500 * workers:  # below this, starting the pool costs more than it saves
        yield lambda paths: _stack([load_square(p, size) for p in paths], size)
        return
    # spawn: safe when the caller has threads; the workers import images.py only (no torch).
    with mp.get_context("spawn").Pool(workers) as pool:
        load = partial(load_square, size=size)
        yield lambda paths: _stack(pool.map(load, paths, chunksize=max(1, min(64, len(paths) // (8 * workers)))), size)


def _stack(arrays: list[np.ndarray], size: int) -> np.ndarray:
    return np.stack(arrays) if arrays else np.zeros((0, 3, size, size), np.uint8)


def _assign(
    records: dict[str, list[ImageRecord]],
    fractions: tuple[float, float, float],
    seed: int,
    group_by: str,
    authors_dir: Path | None,
    authors: dict,
    allow_missing: bool,
    heldout_min: int,
) -> tuple[dict[str, tuple[list[ImageRecord], list[str], str]], list[str]]:
    """Per site: the records kept, the split of each, the rule used; and the warnings."""
    warnings: list[str] = []
    plan: dict[str, tuple[list[ImageRecord], list[str], str]] = {}
    for s, recs in records.items():
        if site(s).test_only:
            plan[s] = (recs, ["test"] * len(recs), "test_only")
        elif s in authors:
            kept, assigned, w = _author_assignment(recs, authors_dir, s, authors[s], allow_missing)
            if "train" not in assigned:  # allow_missing dropped every listed training image
                path = author_split_path(authors_dir, s, "train")
                cohort = site(s).cohort or site(s).source
                raise ValueError(f"{path}: no listed image is in the raw data of site {s} ({cohort}): nothing to train on")
            warnings += w
            plan[s] = (kept, assigned, "authors")
        else:
            groups = [r.lesion_id or r.image_id for r in recs] if group_by == "lesion" else None
            sub_seed = int(np.random.SeedSequence([seed, SITE_NAMES.index(s)]).generate_state(1)[0])
            labels = [r.label for r in recs]
            # train is never empty here: the readers refuse a site without images, and every class
            # keeps at least one unit in train
            assigned, w = stratified_assignment(labels, fractions, sub_seed, groups, context=f"site {s}", heldout_min_per_class=heldout_min)
            warnings += w
            plan[s] = (recs, assigned, "stratified")
    return plan, warnings


def _write_splits(
    plan: dict[str, tuple[list[ImageRecord], list[str], str]], out_root: Path, size: int, workers: int, heldout_min: int
) -> tuple[dict[str, Any], list[str]]:
    """Decode, write every <site>/<split>.npz; return the manifest's per-site section and warnings."""
    warnings: list[str] = []
    info: dict[str, Any] = {}
    total = sum(len(recs) for recs, _, _ in plan.values())
    with _image_loader(size, workers, total) as load:
        for s, (recs, assigned, rule) in plan.items():
            spec = site(s)
            info[s] = {"cohort": spec.cohort, "source": spec.source, "test_only": spec.test_only, "split_rule": rule}
            info[s]["splits"] = {}
            for name in SPLITS:
                chosen = sorted((r for r, a in zip(recs, assigned, strict=True) if a == name), key=lambda r: r.image_id)
                labels = np.array([r.label for r in chosen], np.int64)
                ids, lesions = [r.image_id for r in chosen], [r.lesion_id or "" for r in chosen]
                save_split(split_path(out_root, s, name), load([r.path for r in chosen]), labels, ids, lesions)
                counts = np.bincount(labels, minlength=NUM_CLASSES)
                info[s]["splits"][name] = {
                    "n": len(chosen),
                    "counts": dict(zip(CLASS_NAMES, map(int, counts), strict=True)),
                }
                if name == "train" and not spec.test_only:
                    for c in np.flatnonzero(counts == 0):
                        msg = f"site {s}: class {CLASS_NAMES[c]} is absent from train"
                        log.warning(msg)
                        warnings.append(msg)
                elif chosen:  # a held-out split in use (empty: its fraction is 0, or the test-only cohort's valid)
                    for c in np.flatnonzero(counts < heldout_min):
                        msg = (
                            f"site {s}: {name} holds {counts[c]} {CLASS_NAMES[c]} image(s), fewer than "
                            f"heldout_min_per_class={heldout_min}: its macro F1 turns on very few images"
                        )
                        log.warning(msg)
                        warnings.append(msg)
    return info, warnings


def prepare_dermoscopy(
    raw_root: str | Path,
    out_root: str | Path,
    *,
    size: int = 128,
    seed: int = 0,
    split: Sequence[float] = (0.7, 0.1, 0.2),
    group_by: Literal["image", "lesion"] = "image",
    author_splits_dir: str | Path | None = None,
    sites: Sequence[str] = SITE_NAMES,
    isic_root: str | Path | None = None,
    workers: int = 1,
    layout: RawLayout = DEFAULT_LAYOUT,
    allow_missing: bool = False,
    heldout_min_per_class: int = HELDOUT_MIN_PER_CLASS,
    enforce_heldout_min: bool = False,
) -> Manifest:
    """Prepare the requested sites from the raw layouts under `raw_root` (ISIC 2017 under `isic_root` or `raw_root`).

    `author_splits_dir` replaces the stratified split of sites A-D with the authors' assignment;
    ids they list that the raw data lacks are an error unless `allow_missing`. `workers` > 1
    decodes in spawned processes (from 500 images per worker on). A held-out split with fewer than
    `heldout_min_per_class` images of a class is warned about; `enforce_heldout_min` makes the
    stratified rule give valid and test at least that many (taken from train; not the authors' splits).
    """
    t0 = time.perf_counter()
    if not isinstance(size, int) or size < 8:
        raise ValueError(f"size must be an integer >= 8, got {size!r}")
    if group_by not in ("image", "lesion"):
        raise ValueError(f"group_by must be 'image' or 'lesion', got {group_by!r}")
    fractions = check_fractions(split)
    heldout_min = check_heldout_min(heldout_min_per_class)
    sites = [site(s).name for s in sites]
    raw_root, out_root = Path(raw_root), Path(out_root)
    authors_dir = Path(author_splits_dir) if author_splits_dir else None
    (out_root / MANIFEST_NAME).unlink(missing_ok=True)  # from here on the folder is not complete

    records = read_sites(raw_root, sites, isic_root=Path(isic_root) if isic_root else None, layout=layout)
    author_sites = [s for s in sites if authors_dir and not site(s).test_only]
    authors = read_author_splits(authors_dir, author_sites) if author_sites else {}
    enforced = heldout_min if enforce_heldout_min else 1
    plan, warnings = _assign(records, fractions, seed, group_by, authors_dir, authors, allow_missing, enforced)
    check_images_exist([r for recs, _, _ in plan.values() for r in recs])
    sites_info, more = _write_splits(plan, out_root, size, workers, heldout_min)

    synthetic = raw_root / SYNTHETIC_MARKER
    author_files = [author_split_path(authors_dir, s, sp) for s in author_sites for sp in SPLITS]
    config = {
        "format": FORMAT,
        "size": size,
        "seed": seed,
        "split": list(fractions),
        "group_by": group_by,
        "heldout_min_per_class": heldout_min,
        "enforce_heldout_min": bool(enforce_heldout_min),
        "sites": sites,
        "author_splits": _file_digest(author_files) if author_files else None,
        "synthetic": json.loads(synthetic.read_text()) if synthetic.is_file() else None,
    }
    manifest = {
        "format": FORMAT,
        "config": config,
        "config_hash": config_hash(config),
        "classes": list(CLASS_NAMES),
        "image_layout": "uint8 [N,3,S,S] RGB, centre square crop of the shorter side, bicubic resize",
        "split_rules": {k: RULES[k] for k in sorted({v[2] for v in plan.values()})},
        "sources": {
            "raw_root": str(raw_root.resolve()),
            "isic_root": str(Path(isic_root or raw_root).resolve()),
            "author_splits_dir": str(authors_dir.resolve()) if authors_dir else None,
        },
        "sites": sites_info,
        "warnings": warnings + more,
    }
    write_manifest(out_root, manifest)
    log.info("prepared %d site(s) at %d px into %s in %.1f s", len(sites), size, out_root, time.perf_counter() - t0)
    return Manifest(out_root, manifest)
