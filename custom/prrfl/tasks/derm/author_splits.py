"""Importer of the authors' per-client split files (PRR-Imbalance, csv_folder/client{X}/{split}_client{X}.csv).

Only image_id and label are authoritative (docs/authors_code.md §5.1). The other columns are used as
cross-checks where they carry meaning: a dx of nv/bkl/mel must agree with the label, the HAM
`dataset` column must name the site's cohort, and ISIC 2017 flags (under their own names in D's
test file, under the wrong names lesion_id/dx in D's train and valid files) must agree too.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from .layout import CLASS_INDEX, NUM_CLASSES, SPLITS, TRAIN_SITES, site
from .records import isic_label, read_csv_rows

log = logging.getLogger(__name__)

_FLAG_VALUES = {"0", "1", "0.0", "1.0"}


@dataclass(frozen=True)
class AuthorRow:
    """One row of an authors' split file; metadata fields are '' where the file has none."""

    image_id: str
    label: int
    line: int
    lesion_id: str | None = None
    dx_type: str = ""
    age: str = ""
    sex: str = ""
    localization: str = ""


def author_split_path(directory: Path, site_name: str, split: str) -> Path:
    return Path(directory) / f"client{site_name}" / f"{split}_client{site_name}.csv"


def _is_isic_quirk(rows: list[tuple[int, dict[str, str]]]) -> bool:
    """D's train/valid files: HAM header, ISIC flags under lesion_id (melanoma) and dx (keratosis)."""
    return bool(rows) and all(not r.get("dataset") and r.get("lesion_id") in _FLAG_VALUES and r.get("dx") in _FLAG_VALUES for _, r in rows)


def read_author_split_file(path: Path, site_name: str | None = None) -> list[AuthorRow]:
    """Rows of one split file, validated (label in {0,1,2}, agreement with dx / ISIC flags / cohort)."""
    path = Path(path)
    rows = list(read_csv_rows(path, ("image_id", "label")))
    quirk = _is_isic_quirk(rows)
    cohort = site(site_name).cohort if site_name else None
    out: list[AuthorRow] = []
    seen: set[str] = set()
    for line, r in rows:
        image_id, raw = r["image_id"], r["label"]
        if not image_id:
            raise ValueError(f"{path} line {line}: empty image_id")
        if image_id in seen:
            raise ValueError(f"{path} line {line}: duplicated image_id {image_id}")
        seen.add(image_id)
        if not raw.isdigit() or int(raw) >= NUM_CLASSES:
            raise ValueError(f"{path} line {line}: field 'label' must be one of 0 (nv), 1 (bkl), 2 (mel), got {raw!r}")
        label = int(raw)
        if quirk:
            flags_label = isic_label(path, line, r["lesion_id"], r["dx"])
        elif "melanoma" in r and "seborrheic_keratosis" in r:
            flags_label = isic_label(path, line, r["melanoma"], r["seborrheic_keratosis"])
        else:
            flags_label = None
        if flags_label is not None and flags_label != label:
            raise ValueError(f"{path} line {line}: label {label} disagrees with the ISIC flags of {image_id}")
        dx = r.get("dx", "")
        if not quirk and dx in CLASS_INDEX and CLASS_INDEX[dx] != label:
            raise ValueError(f"{path} line {line}: label {label} disagrees with field 'dx' = {dx!r} for {image_id}")
        ds = r.get("dataset", "")
        if cohort and ds and ds != cohort:
            raise ValueError(f"{path} line {line}: field 'dataset' = {ds!r}, expected {cohort!r} for site {site_name}")
        out.append(
            AuthorRow(
                image_id,
                label,
                line,
                lesion_id=None if quirk else (r.get("lesion_id") or None),
                dx_type="" if quirk else r.get("dx_type", ""),
                age="" if quirk else r.get("age", ""),
                sex="" if quirk else r.get("sex", ""),
                localization="" if quirk else r.get("localization", ""),
            )
        )
    if quirk:
        log.info("%s: ISIC 2017 flags found under the columns lesion_id/dx (authors' quirk), checked against label", path)
    return out


def read_author_splits(directory: Path, sites: Sequence[str] = TRAIN_SITES) -> dict[str, dict[str, list[AuthorRow]]]:
    """{site: {split: rows}} for every requested site; an image in two splits of a site is an error."""
    directory = Path(directory)
    out: dict[str, dict[str, list[AuthorRow]]] = {}
    for s in sites:
        where: dict[str, str] = {}
        out[s] = {}
        for split in SPLITS:
            path = author_split_path(directory, s, split)
            rows = read_author_split_file(path, s)
            for row in rows:
                if row.image_id in where:
                    raise ValueError(f"{path} line {row.line}: image {row.image_id} is also in split {where[row.image_id]!r}")
                where[row.image_id] = split
            out[s][split] = rows
    return out


def author_split_counts(splits: dict[str, dict[str, list[AuthorRow]]]) -> dict[str, dict[str, tuple[int, ...]]]:
    """Per-site, per-split class counts (nv, bkl, mel)."""
    counts: dict[str, dict[str, tuple[int, ...]]] = {}
    for s, by_split in splits.items():
        counts[s] = {}
        for split, rows in by_split.items():
            c = [0] * NUM_CLASSES
            for r in rows:
                c[r.label] += 1
            counts[s][split] = tuple(c)
    return counts
