"""Readers of the raw layouts (HAM10000 metadata, ISIC 2017 ground truth) into labelled image records.

Only files are read here, no pixels: the result says which image of which site has which label.
Every error names the file, the line and the field, because a user staring at 10,000 rows needs to
know where to look.
"""

from __future__ import annotations

import csv
import logging
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from .layout import (
    CLASS_INDEX,
    DEFAULT_LAYOUT,
    HAM_COLUMNS,
    ISIC_COLUMNS,
    OTHER_HAM_DX,
    SITES,
    RawLayout,
    site,
)

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ImageRecord:
    """One labelled image of one site."""

    site: str
    image_id: str
    label: int  # nv=0, bkl=1, mel=2
    path: Path
    lesion_id: str | None = None  # HAM10000 lesion; None where the source has no lesion ids (ISIC 2017)


def read_csv_rows(path: Path, required: Sequence[str]) -> Iterator[tuple[int, dict[str, str]]]:
    """(line number, row) pairs of a CSV file whose header must hold `required` columns. A file
    without rows is an error: every CSV read here lists images, and an empty list would prepare a
    federation of nothing without a word."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"CSV file not found: {path}")
    with open(path, newline="", encoding="utf-8-sig") as f:
        reader = csv.DictReader(f)
        header = reader.fieldnames or []
        if not header:
            raise ValueError(f"{path}: empty file (expected a header with the columns {list(required)} and rows)")
        missing = [c for c in required if c not in header]
        if missing:
            raise ValueError(f"{path}: missing column(s) {missing} (header: {header})")
        rows = 0
        for row in reader:
            rows += 1
            yield reader.line_num, {k: (v or "").strip() for k, v in row.items() if k is not None}
        if not rows:
            raise ValueError(f"{path}: no rows after the header")


def read_ham10000(root: Path, cohorts: Sequence[str], layout: RawLayout = DEFAULT_LAYOUT) -> dict[str, list[ImageRecord]]:
    """Records of the HAM10000 sites whose `dataset` cohort is in `cohorts`, keyed by site name.

    Rule: rows with a diagnosis outside nv/bkl/mel (bcc, akiec, vasc, df) are dropped and counted in
    the log; any other dx value is an error.
    """
    root = Path(root)
    csv_path = root / layout.ham_csv
    by_cohort = {SITES[s].cohort: s for s in SITES if SITES[s].source == "ham10000"}
    wanted = {by_cohort[c]: c for c in cohorts if c in by_cohort}
    unknown = [c for c in cohorts if c not in by_cohort]
    if unknown:
        raise ValueError(f"unknown HAM10000 cohort(s) {unknown}; expected some of {sorted(by_cohort)}")
    out: dict[str, list[ImageRecord]] = {s: [] for s in wanted}
    dropped: Counter[str] = Counter()
    other_cohorts: Counter[str] = Counter()
    for line, row in read_csv_rows(csv_path, HAM_COLUMNS):
        dx, cohort, image_id = row["dx"], row["dataset"], row["image_id"]
        if not image_id:
            raise ValueError(f"{csv_path} line {line}: empty image_id")
        if dx not in CLASS_INDEX:
            if dx in OTHER_HAM_DX:
                dropped[dx] += 1
                continue
            raise ValueError(
                f"{csv_path} line {line}: unknown dx {dx!r} for image {image_id} (expected one of {list(CLASS_INDEX) + list(OTHER_HAM_DX)})"
            )
        if cohort not in by_cohort:
            other_cohorts[cohort] += 1
            continue
        s = by_cohort[cohort]
        if s not in out:
            continue
        path = root / layout.ham_images / f"{image_id}{layout.image_ext}"
        out[s].append(ImageRecord(s, image_id, CLASS_INDEX[dx], path, row["lesion_id"] or None))
    if dropped:
        log.info("%s: dropped %d rows with diagnoses outside nv/bkl/mel: %s", csv_path, sum(dropped.values()), dict(dropped))
    if other_cohorts:
        log.warning("%s: ignored %d rows of unknown cohorts %s", csv_path, sum(other_cohorts.values()), dict(other_cohorts))
    empty = [f"site {s} (cohort '{wanted[s]}')" for s, recs in out.items() if not recs]
    if empty:
        raise ValueError(f"{csv_path}: no nv/bkl/mel image of {', '.join(empty)}")
    _check_unique(csv_path, [r for rs in out.values() for r in rs])
    return out


def _flag(csv_path: Path, line: int, field: str, value: str) -> bool:
    try:
        x = float(value)
    except ValueError:
        x = -1.0
    if x not in (0.0, 1.0):
        raise ValueError(f"{csv_path} line {line}: field {field!r} must be 0 or 1, got {value!r}")
    return x == 1.0


def isic_label(csv_path: Path, line: int, melanoma: str, keratosis: str) -> int:
    """ISIC 2017 flags -> class: melanoma -> mel, seborrheic keratosis -> bkl, neither -> nv."""
    mel = _flag(csv_path, line, "melanoma", melanoma)
    sk = _flag(csv_path, line, "seborrheic_keratosis", keratosis)
    if mel and sk:
        raise ValueError(f"{csv_path} line {line}: both melanoma and seborrheic_keratosis are set")
    return CLASS_INDEX["mel"] if mel else CLASS_INDEX["bkl"] if sk else CLASS_INDEX["nv"]


def read_isic2017(root: Path, layout: RawLayout = DEFAULT_LAYOUT, site_name: str = "D") -> list[ImageRecord]:
    """Records of the ISIC 2017 MSK site, restricted to the MSK id list when that file exists."""
    base = Path(root) / layout.isic_dir
    csv_path = base / layout.isic_csv
    ids_path = base / layout.msk_ids
    msk: set[str] | None = None
    if ids_path.is_file():
        msk = {ln.strip() for ln in ids_path.read_text().splitlines() if ln.strip()}
    else:
        log.info("%s not found: using every row of %s as site %s", ids_path, csv_path, site_name)
    records = []
    skipped = 0
    for line, row in read_csv_rows(csv_path, ISIC_COLUMNS):
        image_id = row["image_id"]
        if not image_id:
            raise ValueError(f"{csv_path} line {line}: empty image_id")
        label = isic_label(csv_path, line, row["melanoma"], row["seborrheic_keratosis"])
        if msk is not None and image_id not in msk:
            skipped += 1
            continue
        path = base / layout.isic_images / f"{image_id}{layout.image_ext}"
        records.append(ImageRecord(site_name, image_id, label, path, None))
    if msk is not None:
        found = {r.image_id for r in records}
        absent = sorted(msk - found)
        if absent:
            log.warning("%s: %d listed ids are not in %s (e.g. %s)", ids_path, len(absent), csv_path, absent[:3])
        log.info("%s: kept %d MSK rows, skipped %d others", csv_path, len(records), skipped)
    if not records:
        raise ValueError(f"{csv_path}: no image of site {site_name} (ISIC 2017 MSK) is listed in {ids_path}")
    _check_unique(csv_path, records)
    return records


def read_sites(
    raw_root: Path,
    sites: Sequence[str],
    *,
    isic_root: Path | None = None,
    layout: RawLayout = DEFAULT_LAYOUT,
) -> dict[str, list[ImageRecord]]:
    """Records of each requested site (HAM10000 under `raw_root`, ISIC 2017 under `isic_root` or `raw_root`)."""
    specs = [site(s) for s in sites]
    out: dict[str, list[ImageRecord]] = {}
    ham = [s.cohort for s in specs if s.source == "ham10000" and s.cohort]
    if ham:
        out.update(read_ham10000(Path(raw_root), ham, layout))
    for s in specs:
        if s.source == "isic2017":
            out[s.name] = read_isic2017(Path(isic_root or raw_root), layout, s.name)
    return {s: out[s] for s in sites}


def check_images_exist(records: Sequence[ImageRecord]) -> None:
    """Fail before any decoding if image files are missing, naming them."""
    missing = [r.path for r in records if not r.path.is_file()]
    if missing:
        shown = ", ".join(str(p) for p in missing[:5])
        raise FileNotFoundError(f"{len(missing)} image file(s) missing: {shown}{' ...' if len(missing) > 5 else ''}")


def _check_unique(csv_path: Path, records: Sequence[ImageRecord]) -> None:
    dup = [i for i, n in Counter(r.image_id for r in records).items() if n > 1]
    if dup:
        raise ValueError(f"{csv_path}: duplicated image_id(s) {dup[:5]}")
