"""What travels between the workflow and the sites, in one place.

Params are torch tensors (PYTORCH exchange format); meta holds only lists, numbers and strings.
A site uploads the difference between its trained weights and the download it received
(ParamsType.DIFF, a WEIGHT_DIFF DXO), as FLARE's privacy filters expect; the server, which knows
what it sent, adds it back.
"""

from __future__ import annotations

from typing import Any

import torch
from nvflare.app_common.abstract.fl_model import FLModel, ParamsType

from prrfl.keys import CONFIG, ERROR, NUM_SITES, ROUND, RUN_ID, TASK_PREPARE, TASK_SCORE, TASK_TRAIN
from prrfl.keys import GLOBAL_CLASS_COUNTS as GLOBAL_COUNTS
from prrfl.messages import Download, Upload
from prrfl.server.aggregation import as_tensors

__all__ = [  # the keys are re-exported from their table, prrfl.keys
    "CONFIG",
    "ERROR",
    "GLOBAL_COUNTS",
    "NUM_SITES",
    "ROUND",
    "RUN_ID",
    "TASK_PREPARE",
    "TASK_SCORE",
    "TASK_TRAIN",
    "TRANSPORT_KEYS",
    "download_to_model",
    "model_to_download",
    "model_to_upload",
    "upload_to_model",
]


# the workflow's keys, which a site reads from the task (not the method's: see model_to_download)
TRANSPORT_KEYS = (CONFIG, RUN_ID, ROUND, NUM_SITES, GLOBAL_COUNTS)


def download_to_model(download: Download, common: dict[str, Any], round_idx: int, num_rounds: int) -> FLModel:
    """A site's train task: the download's params and method meta, the workflow's `common` keys
    (CONFIG, RUN_ID, NUM_SITES, GLOBAL_COUNTS) and the round."""
    return FLModel(
        params_type=ParamsType.FULL,
        params=download.params,
        current_round=round_idx,
        total_rounds=num_rounds,
        meta={**common, **download.meta, ROUND: round_idx},
    )


def model_to_download(model: FLModel) -> Download:
    """A train task as the site's method sees it: the round and the global class counts as fields,
    the method's own values in meta (the workflow's other keys left out)."""
    meta = dict(model.meta or {})
    round_idx, counts = meta[ROUND], meta.get(GLOBAL_COUNTS)
    for key in TRANSPORT_KEYS:
        meta.pop(key, None)
    return Download(params=dict(model.params or {}), meta=meta, round=round_idx, global_class_counts=counts)


def streamable(params: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """`params` contiguous in the default memory order: FLARE streams tensors through safetensors, which refuses
    any other (a channels_last model's 4-D weights: prrfl.numerics)."""
    return {k: v.contiguous() for k, v in params.items()}


def upload_to_model(upload: Upload, summary: dict[str, Any], received: dict[str, torch.Tensor]) -> FLModel:
    """The site's result: its shared weights minus the `received` download, and its statistics."""
    missing = sorted(set(upload.params) - set(received))
    if missing:
        raise KeyError(f"site {upload.site}: cannot send a difference for {missing[:5]}: not in the download it received")
    return FLModel(
        params_type=ParamsType.DIFF,
        params=streamable({k: v - received[k].to(v.device, v.dtype) for k, v in upload.params.items()}),
        meta={
            "num_train": upload.num_train,
            "class_counts": upload.class_counts,
            "method": upload.meta,
            "summary": summary,
        },
    )


def model_to_upload(site: str, model: FLModel) -> Upload:
    """The site's result as an Upload whose params are still the differences (checked before use, as every
    value of it: prrfl.server.checks). Arrays a privacy filter returned as numpy become tensors again."""
    meta = model.meta or {}
    return Upload(
        site=site,
        params=as_tensors(model.params or {}),
        num_train=meta.get("num_train", -1),
        class_counts=meta.get("class_counts", []),
        meta=meta.get("method", {}),
    )
