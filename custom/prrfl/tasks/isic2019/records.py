"""FLamby's Fed-ISIC2019 as a user has it on disk: the images folder and the `train_test_split` CSV.

Every row is checked before anything is decoded, and a bad one is an error naming the file, the line and the
field: a missing column, an image listed twice, a label that is not one of the eight classes (the one-hot columns
MEL..UNK must hold exactly one 1 and agree with `target`; UNK, which no ISIC 2019 training image carries, is
refused), a centre outside 0-5, a fold other than train/test, a `fold2` that is not `<fold>_<center>`, and an
image file that is not there.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

from .layout import CENTRES, CLASS_NAMES, CSV_COLUMNS, FOLDS, IMAGES_DIR, SPLIT_CSV, UNKNOWN_CLASS

ONE_HOT = (*CLASS_NAMES, UNKNOWN_CLASS)


@dataclass(frozen=True)
class IsicRecord:
    image_id: str
    label: int  # index into CLASS_NAMES
    centre: str  # CENTRES[center]
    fold: str  # FLamby's fold: train or test
    path: Path


def _field_error(csv_path: Path, line: int, field: str, value: str, expected: str) -> ValueError:
    return ValueError(f"{csv_path}, line {line}: field '{field}' is {value!r}, expected {expected}")


def _label(csv_path: Path, line: int, row: dict[str, str]) -> int:
    """The class of a row: its `target`, which its one-hot columns must agree with."""
    try:
        hot = [float(row[c]) for c in ONE_HOT]
    except ValueError:
        bad = next(c for c in ONE_HOT if not _is_number(row[c]))
        raise _field_error(csv_path, line, bad, row[bad], "0.0 or 1.0") from None
    if sorted(hot) != [0.0] * (len(ONE_HOT) - 1) + [1.0]:
        raise ValueError(f"{csv_path}, line {line}: the one-hot columns {'/'.join(ONE_HOT)} must hold exactly one 1, got {hot}")
    hot_class = hot.index(1.0)
    if hot_class == len(CLASS_NAMES):
        raise ValueError(
            f"{csv_path}, line {line}: image {row['image']!r} is labelled {UNKNOWN_CLASS}, not one of the classes {list(CLASS_NAMES)}"
        )
    target = row["target"]
    if target != str(hot_class):
        raise _field_error(csv_path, line, "target", target, f"{hot_class} ({CLASS_NAMES[hot_class]}, as its one-hot columns say)")
    return hot_class


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _record(csv_path: Path, line: int, row: dict[str, str], images: Path) -> IsicRecord:
    label = _label(csv_path, line, row)
    center, fold = row["center"], row["fold"]
    if center not in {str(i) for i in range(len(CENTRES))}:
        raise _field_error(csv_path, line, "center", center, f"a centre index 0-{len(CENTRES) - 1}")
    if fold not in FOLDS:
        raise _field_error(csv_path, line, "fold", fold, f"one of {list(FOLDS)}")
    if row["fold2"] != f"{fold}_{center}":
        raise _field_error(csv_path, line, "fold2", row["fold2"], f"'{fold}_{center}' (fold_center)")
    return IsicRecord(row["image"], label, CENTRES[int(center)], fold, images / f"{row['image']}.jpg")


def read_flamby(raw_root: str | Path, split_csv: str | Path | None = None, check_files: bool = True) -> list[IsicRecord]:
    """Every row of FLamby's split file (default `<raw_root>/train_test_split`), its image in
    `<raw_root>/ISIC_2019_Training_Input_preprocessed/<image>.jpg`; checked as the module says."""
    raw_root = Path(raw_root)
    csv_path = Path(split_csv) if split_csv else raw_root / SPLIT_CSV
    if not csv_path.is_file():
        raise FileNotFoundError(
            f"{csv_path}: no FLamby split file; copy FLamby's flamby/datasets/fed_isic2019/dataset_creation_scripts/{SPLIT_CSV} "
            f"there or pass its path (--split-csv)"
        )
    images = raw_root / IMAGES_DIR
    if check_files and not images.is_dir():
        raise FileNotFoundError(f"{images}: no images folder; run FLamby's download and resize scripts into {raw_root}")
    records: list[IsicRecord] = []
    seen: dict[str, int] = {}
    with csv_path.open(newline="") as f:
        reader = csv.DictReader(f)
        missing = [c for c in CSV_COLUMNS if c not in (reader.fieldnames or [])]
        if missing:
            raise ValueError(f"{csv_path}: missing column(s) {missing}; FLamby's split file has {list(CSV_COLUMNS)}")
        for line, row in enumerate(reader, start=2):
            image = row["image"]
            if not image:
                raise _field_error(csv_path, line, "image", image, "an image id")
            if image in seen:
                raise ValueError(f"{csv_path}, line {line}: image {image!r} is listed twice (first on line {seen[image]})")
            seen[image] = line
            records.append(_record(csv_path, line, row, images))
    if not records:
        raise ValueError(f"{csv_path}: no image listed")
    if check_files:
        absent = [r for r in records if not r.path.is_file()]
        if absent:
            raise FileNotFoundError(f"{absent[0].path}: listed in {csv_path} (and {len(absent) - 1} more missing) but not on disk")
    return records
