"""What travels in FLModel.meta between the workflow and the sites, in one place.

Params are torch tensors (PYTORCH exchange format); meta holds only lists, numbers and strings.
"""

from __future__ import annotations

from typing import Any

from nvflare.app_common.abstract.fl_model import FLModel, ParamsType

from prrfl.methods.base import Download, Upload

TASK_PREPARE = "prepare"  # sites load (or generate) their data and report class counts
TASK_TRAIN = "train"

# keys the workflow puts into every task's meta
CONFIG = "prrfl_config"
RUN_ID = "run_id"
ROUND = "round"
NUM_SITES = "num_sites"
GLOBAL_COUNTS = "global_class_counts"
# key a site puts into its result's meta when it could not do the task (the reason, naming the file)
ERROR = "error"


def download_to_model(download: Download, common: dict[str, Any], round_idx: int, num_rounds: int) -> FLModel:
    return FLModel(
        params_type=ParamsType.FULL,
        params=download.params,
        current_round=round_idx,
        total_rounds=num_rounds,
        meta={**common, **download.meta, ROUND: round_idx},
    )


def model_to_download(model: FLModel) -> Download:
    return Download(params=dict(model.params or {}), meta=dict(model.meta or {}))


def upload_to_model(upload: Upload, summary: dict[str, Any]) -> FLModel:
    return FLModel(
        params_type=ParamsType.FULL,
        params=upload.params,
        meta={
            "num_train": upload.num_train,
            "class_counts": upload.class_counts,
            "method": upload.meta,
            "summary": summary,
        },
    )


def model_to_upload(site: str, model: FLModel) -> Upload:
    meta = model.meta or {}
    return Upload(
        site=site,
        params=dict(model.params or {}),
        num_train=meta.get("num_train", -1),
        class_counts=meta.get("class_counts", []),
        meta=meta.get("method", {}),
    )
