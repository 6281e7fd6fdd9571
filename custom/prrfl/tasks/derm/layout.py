"""The facts of the dermoscopy task in one place: classes, sites, Table I, on-disk file names.

Everything else (readers, generator, preparation) imports these names, so a renamed file or a
changed cohort is a one-line edit here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from prrfl.data.manifest import MANIFEST_NAME  # noqa: F401 - re-exported (prepared layout)

CLASS_NAMES: tuple[str, ...] = ("nv", "bkl", "mel")
CLASS_INDEX: dict[str, int] = {name: i for i, name in enumerate(CLASS_NAMES)}
NUM_CLASSES = len(CLASS_NAMES)

# HAM10000 diagnoses outside the task: rows with these are dropped (and counted in the log).
OTHER_HAM_DX: tuple[str, ...] = ("bcc", "akiec", "vasc", "df")

SPLITS: tuple[str, ...] = ("train", "valid", "test")


@dataclass(frozen=True)
class Site:
    """One cohort of the federation: where its rows come from and its Table I size."""

    name: str
    source: Literal["ham10000", "isic2017"]
    cohort: str | None  # HAM10000 `dataset` value; None for ISIC 2017
    table: tuple[int, int, int]  # Table I counts nv / bkl / mel
    test_only: bool = False  # out-of-distribution cohort: evaluated, never trained on


SITES: dict[str, Site] = {
    s.name: s
    for s in (
        Site("A", "ham10000", "vidir_modern", (1832, 475, 680)),
        Site("B", "ham10000", "vidir_molemax", (3720, 124, 24)),
        Site("C", "ham10000", "rosendahl", (803, 490, 342)),
        Site("D", "isic2017", None, (1372, 254, 374)),
        Site("OOD", "ham10000", "vienna_dias", (350, 10, 67), test_only=True),
    )
}
SITE_NAMES: tuple[str, ...] = tuple(SITES)
TRAIN_SITES: tuple[str, ...] = tuple(n for n, s in SITES.items() if not s.test_only)


@dataclass(frozen=True)
class RawLayout:
    """File names of the raw data sets, relative to their roots (override for a differently named copy)."""

    ham_csv: str = "HAM10000_metadata.csv"
    ham_images: str = "HAM10000_images"
    isic_dir: str = "ISIC-2017"
    isic_csv: str = "ISIC-2017_Training_Part3_GroundTruth.csv"
    isic_images: str = "images"
    msk_ids: str = "msk_image_ids.txt"
    image_ext: str = ".jpg"


DEFAULT_LAYOUT = RawLayout()

HAM_COLUMNS: tuple[str, ...] = ("lesion_id", "image_id", "dx", "dx_type", "age", "sex", "localization", "dataset")
ISIC_COLUMNS: tuple[str, ...] = ("image_id", "melanoma", "seborrheic_keratosis")

# Prepared layout: <out_root>/<site>/<split>.npz and <out_root>/manifest.json.
SYNTHETIC_MARKER = "synthetic.json"


def site(name: str) -> Site:
    """The Site called `name`, with an error listing the valid names."""
    try:
        return SITES[name]
    except KeyError:
        raise ValueError(f"unknown dermoscopy site {name!r}; expected one of {list(SITES)}") from None
