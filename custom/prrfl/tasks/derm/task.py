"""Dermoscopy classification (nv / bkl / mel) over 4 cohorts + an out-of-distribution cohort.

Sites by cohort: A ViDIR Modern, B ViDIR MoleMax, C Rosendahl (HAM10000), D MSK (ISIC 2017); OOD
ViDIR Legacy. The data of a site is a prepared folder (prrfl.tasks.derm.prepare_dermoscopy); when
no data root is given the embedded synthetic federation is generated and prepared on first use,
cached and shared by all sites of the machine.
"""

from __future__ import annotations

import math
import typing
from pathlib import Path
from typing import Any, Literal, TypedDict

from prrfl.config import check_options
from prrfl.data.publish import default_cache_dir
from prrfl.tasks.derm.cache import ensure_synthetic_federation
from prrfl.tasks.derm.splitting import HELDOUT_MIN_PER_CLASS
from prrfl.tasks.derm.store import DermSplit, load_split, split_path
from prrfl.tasks.dermoscopy import DermoscopyTask


class DermData(TypedDict):
    """The `data` options of a derm job; validation checks each value against its annotation."""

    image_size: int
    synthetic_scale: float
    synthetic_seed: int
    synthetic_raw_size: tuple[int, int]
    synthetic_shift: float
    split_seed: int
    group_by: Literal["image", "lesion"]
    heldout_min_per_class: int


DEFAULT_DATA: dict[str, Any] = {
    "image_size": 64,  # the paper: 128
    "synthetic_scale": 0.08,  # fraction of the Table I sizes; 1.0 = full size
    "synthetic_seed": 0,
    "synthetic_raw_size": [300, 225],  # JPEG size written by the generator (HAM10000: 600x450)
    "synthetic_shift": 1.0,  # how much the cohorts' acquisitions differ (prrfl.tasks.derm.acquisition.shifted)
    "split_seed": 0,
    "group_by": "image",  # "lesion": keep all images of a lesion in one split
    # M: every class has >= M images in each site's valid and test split (and in train): one image
    # then moves macro F1 by ~1/(3M) at most; prrfl.tasks.derm.splitting says why 8
    "heldout_min_per_class": HELDOUT_MIN_PER_CLASS,
}


# Job settings per profile (Task.profiles; prrfl.flare.jobs builds every derm_<method> job from them).
# quick (README's first command, the jobs/derm_* folders): the embedded synthetic federation at 4 % of Table I (273
# training images, every class still >= 8 times in each site's valid and test split), 40 px, 5 rounds x 2 epochs,
# drawn at 160 x 120 before the resize to 40 px (the generator's 300 x 225 tripled the first run's data generation for
# no pixel the 40 px images keep). The 8 %, 64 px job before it needed more training than 2 cores' bare-loop speed
# allows in 2.5 minutes (benchmarks/site_throughput.py, benchmarks/default_job.py; docs/running.md, "Where the time goes").
QUICK: dict[str, Any] = {
    "num_rounds": 5,
    "local_epochs": 2,
    "data": {"image_size": 40, "synthetic_scale": 0.04, "synthetic_raw_size": [160, 120]},
}

# paper (TMI 2022, Sec. IV): 128 px, 50 rounds x 5 epochs, lr 1e-2 halved every 25 epochs, batch 16; full Table I
# sizes for the synthetic federation (or set data_root per site).
PAPER: dict[str, Any] = {
    "num_rounds": 50,
    "local_epochs": 5,
    "data": {"image_size": 128, "synthetic_scale": 1.0, "synthetic_raw_size": [600, 450]},
}

# bench (`prrfl sweep --profile bench`), at the paper's E = 5 local epochs per round, so that PRR's DET can reach
# its Sublimate phase (a round's third epoch on; prrfl.algorithms.det.next_phase). 12 rounds: where FedAvg's global
# model stops climbing, by the rule of docs/calibration.md ("The schedule") read from a long FedAvg run (60 epochs;
# its global model predicts one class for the first rounds). 25 % of the Table I sizes (4x the quick jobs' images,
# so every site holds every class), 64 px, at the paper's lr 1e-2 halved every 25 epochs. Every method runs the
# same schedule.
BENCH: dict[str, Any] = {"num_rounds": 12, "local_epochs": 5, "data": {"synthetic_scale": 0.25}}


class DermTask(DermoscopyTask):
    name = "derm"
    num_classes = 3
    class_names = ("nv", "bkl", "mel")
    class_long_names = ("melanocytic nevus", "benign keratosis-like lesion", "melanoma")  # HAM10000's dx codes
    site_names = ("A", "B", "C", "D")
    ood_cohort = "OOD"
    ood_scored_by = "A"  # TMI Table X: site A's model on ViDIR Legacy
    paper_table = "Table II"
    profiles = {"quick": QUICK, "bench": BENCH, "paper": PAPER}

    def __init__(self, data_cfg: dict[str, Any]):
        check_options(data_cfg, typing.get_type_hints(DermData), owner="derm data", path="data")
        super().__init__({**DEFAULT_DATA, **data_cfg})
        self._check_ranges()

    def _check_ranges(self) -> None:
        """Values of the right type that would still fail, but only once a site builds its data."""
        d = self.data_cfg
        rules = {
            "image_size": (d["image_size"] >= 8, "an integer >= 8"),  # prepare_dermoscopy's minimum
            "synthetic_scale": (0 < d["synthetic_scale"] < math.inf, "a number > 0"),
            "synthetic_raw_size": (min(d["synthetic_raw_size"]) >= 1, "a list of 2 positive integers (width, height)"),
            "synthetic_seed": (d["synthetic_seed"] >= 0, "an integer >= 0"),  # numpy seeds are non-negative
            "synthetic_shift": (0 <= d["synthetic_shift"] < math.inf, "a number >= 0"),
            "split_seed": (d["split_seed"] >= 0, "an integer >= 0"),
            "heldout_min_per_class": (d["heldout_min_per_class"] >= 1, "an integer >= 1"),
        }
        self.check_data_ranges(rules)

    def prepared_root(self, data_root: str | None, workers: int = 1) -> Path:
        """A site's prepared data: its own root, or the shared synthetic federation (built on first
        use; `workers` > 1 only from a plain command line, not inside a FLARE site process)."""
        if data_root:
            return self.given_root(data_root)
        d = self.data_cfg
        return Path(
            ensure_synthetic_federation(
                default_cache_dir(),
                scale=d["synthetic_scale"],
                seed=d["synthetic_seed"],
                raw_size=tuple(d["synthetic_raw_size"]),
                shift=d["synthetic_shift"],
                size=d["image_size"],
                split_seed=d["split_seed"],
                group_by=d["group_by"],
                heldout_min_per_class=d["heldout_min_per_class"],
                workers=workers,
            )
        )

    def read_split(self, root: Path, cohort: str, split: str) -> DermSplit:
        return load_split(root, cohort, split)

    def split_file(self, root: Path, cohort: str, split: str) -> Path:
        return split_path(root, cohort, split)
