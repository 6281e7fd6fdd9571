"""Fed-ISIC2019 (FCA's task): eight-class dermoscopy over FLamby's six centres, some classes absent at some centres.

Sites by centre, in FLamby's order: BCN, HAM_vidir_molemax, HAM_vidir_modern, HAM_rosendahl, MSK, HAM_vienna_dias
(FLARE's site-1..site-6). A site's data is a prepared folder (`python -m prrfl.tasks.isic2019 prepare` from FLamby's
layout); with no data root the embedded synthetic Fed-ISIC2019 is generated in that layout and prepared on first use.
The metrics lead with FCA's: balanced accuracy (model selection and DET's phi) and the mean one-vs-rest AUC over the
classes a test split holds (FCA's bAUC); a class absent from a split is left out of both, as FLamby's and FCA's code
do (scikit-learn's balanced accuracy averages the recall of the classes present).
"""

from __future__ import annotations

import math
import typing
from pathlib import Path
from typing import Any, TypedDict

from prrfl.config import check_options
from prrfl.data.publish import default_cache_dir
from prrfl.tasks.dermoscopy import DermoscopyTask

from .cache import ensure_synthetic_isic2019
from .layout import CENTRES, CLASS_LONG_NAMES, CLASS_NAMES
from .prepare import VALID_FRACTION
from .store import IsicSplit, load_split, split_path


class Isic2019Data(TypedDict):
    """The `data` options of an isic2019 job; validation checks each value against its annotation."""

    image_size: int
    synthetic_scale: float
    synthetic_seed: int
    synthetic_shift: float
    split_seed: int
    valid_fraction: float


DEFAULT_DATA: dict[str, Any] = {
    "image_size": 64,  # FCA: 224
    "synthetic_scale": 0.03,  # fraction of FLamby's counts per centre, class and fold; 1.0 = 23,247 images
    "synthetic_seed": 0,
    # how much the centres' acquisitions differ (prrfl.tasks.isic2019.render): 2, calibrated on FCA's Table 4 baselines
    # alone (docs/calibration.md, "Fed-ISIC2019"; 1 is the acquisitions as written)
    "synthetic_shift": 2.0,
    "split_seed": 0,
    "valid_fraction": VALID_FRACTION,  # of each class's training-fold images (prrfl.tasks.isic2019.prepare)
}

# Job settings per profile (Task.profiles). Every profile trains as FCA's code does (Adam 1e-3, weight decay 5e-4);
# FCA's EfficientNet-B0 starts from ImageNet weights, which no site here can download: every method trains the task's
# slim VGG-16BN from scratch.
# quick: the synthetic federation at 3 % of FLamby's counts (735 images), 40 px, 5 rounds x 2 epochs, batch 32: a few
# minutes on 2 CPU cores (benchmarks/default_job.py isic2019_prr), where the round's time is BCN's training alone (at
# 64 px the job took 7 min 52 s on an idle 2-core machine; 40 px trains about twice as fast there).
QUICK: dict[str, Any] = {
    "num_rounds": 5,
    "local_epochs": 2,
    "batch_size": 32,
    "optimizer": "adam",
    "lr": 1e-3,
    "weight_decay": 5e-4,
    "lr_step_epochs": 25,
    "lr_gamma": 0.1,
    "data": {"image_size": 40},
}
# paper (FCA, Sec. 4): 224 px, FLamby's full counts, 80 rounds x 1 epoch, batch 64, lr divided by 10 after round 60
# (FCA's second decay, after round 70, has no counterpart in the periodic schedule: the next one would come at 120).
PAPER: dict[str, Any] = {
    **QUICK,
    "num_rounds": 80,
    "local_epochs": 1,
    "batch_size": 64,
    "lr_step_epochs": 60,
    "data": {"image_size": 224, "synthetic_scale": 1.0},
}
# bench: what two CPU cores afford for FCA's Table 4 over its methods and 3 seeds (about 60 runs): 5 % of FLamby's
# counts (1,192 images; a class a centre holds keeps at least 3 training and 1 test image where its fold has one), 40 px, 10 rounds x
# 2 epochs, the learning rate divided by 10 after three quarters of the epochs as FCA's after round 60 of 80. Set by
# the cost of a run alone (about 5 min on 2 cores), before any method ran on it; the paper profile is FCA's scale.
BENCH: dict[str, Any] = {
    **QUICK,
    "num_rounds": 10,
    "local_epochs": 2,
    "lr_step_epochs": 15,
    "data": {"image_size": 40, "synthetic_scale": 0.05},
}


class Isic2019Task(DermoscopyTask):
    name = "isic2019"
    num_classes = len(CLASS_NAMES)
    class_names = CLASS_NAMES
    class_long_names = CLASS_LONG_NAMES
    site_names = CENTRES
    paper_table = "FCA Table 4"
    metric_names = ("bacc", "auc", "f1", "acc")  # FCA's bACC first: it selects each site's model and is DET's phi
    table_metrics = ("bacc", "auc")  # FCA's bACC and bAUC
    table_note = "bACC: mean recall over the classes a test split holds; bAUC (AUC): mean one-vs-rest AUC over them"
    profiles = {"quick": QUICK, "bench": BENCH, "paper": PAPER}

    def __init__(self, data_cfg: dict[str, Any]):
        check_options(data_cfg, typing.get_type_hints(Isic2019Data), owner="isic2019 data", path="data")
        super().__init__({**DEFAULT_DATA, **data_cfg})
        d = self.data_cfg
        rules = {
            "image_size": (d["image_size"] >= 8, "an integer >= 8"),
            "synthetic_scale": (0 < d["synthetic_scale"] < math.inf, "a number > 0"),
            "synthetic_seed": (d["synthetic_seed"] >= 0, "an integer >= 0"),
            "synthetic_shift": (0 <= d["synthetic_shift"] < math.inf, "a number >= 0"),
            "split_seed": (d["split_seed"] >= 0, "an integer >= 0"),
            "valid_fraction": (0 < d["valid_fraction"] < 1, "a number in (0, 1)"),
        }
        self.check_data_ranges(rules)

    def prepared_root(self, data_root: str | None, workers: int = 1) -> Path:
        if data_root:
            return self.given_root(data_root)
        d = self.data_cfg
        return ensure_synthetic_isic2019(
            default_cache_dir(),
            scale=d["synthetic_scale"],
            seed=d["synthetic_seed"],
            shift=d["synthetic_shift"],
            size=d["image_size"],
            split_seed=d["split_seed"],
            valid_fraction=d["valid_fraction"],
            workers=workers,
        )

    def read_split(self, root: Path, cohort: str, split: str) -> IsicSplit:
        return load_split(root, cohort, split)

    def split_file(self, root: Path, cohort: str, split: str) -> Path:
        return split_path(root, cohort, split)
