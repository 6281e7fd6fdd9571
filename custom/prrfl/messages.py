"""What travels between a site and the server, as plain data: no import of methods, tasks or the
site runtime, so that each of them can import it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

StateDict = dict[str, torch.Tensor]


@dataclass
class Upload:
    """What one site sends after its local round: shared parameters plus small statistics.

    num_train counts the site's training samples (images, or slices for a slice-wise segmentation
    task); class_counts are the task's per-class statistics of the training split (images per class
    for classification, voxels per class for segmentation), checked by the task on the server."""

    site: str
    params: StateDict
    num_train: int
    class_counts: list[int]
    meta: dict[str, Any] = field(default_factory=dict)


@dataclass
class Download:
    """What the server sends one site for the next round.

    params and meta are the method's (`Method.aggregate`); round and global_class_counts are the
    federation's, filled by the transport when the download reaches the site
    (`prrfl.flare.task_protocol.model_to_download`): a download the server has not sent yet keeps their
    defaults."""

    params: StateDict
    meta: dict[str, Any] = field(default_factory=dict)  # the method's own values (e.g. global prototypes)
    round: int = 0  # the round the site trains with this download (0-based)
    global_class_counts: list[int] | None = None  # the federation's training statistics per class (Upload.class_counts summed)


@dataclass
class PrepareReply:
    """A site's answer to `prepare`: its cohort and training statistics, where its data and state are, the
    settings it read, and its own estimate of a round's seconds (for the first round's deadline)."""

    cohort: str
    num_train: int
    class_counts: list[int]
    state_dir: str
    data_root: str | None = None  # None: the embedded synthetic federation
    settings: dict[str, Any] = field(default_factory=dict)  # prrfl.flare.site_config.SettingsReport.to_meta()
    round_estimate_s: float | None = None

    def to_meta(self) -> dict[str, Any]:
        return {
            "cohort": self.cohort,
            "num_train": self.num_train,
            "class_counts": self.class_counts,
            "data_root": self.data_root,
            "state_dir": self.state_dir,
            "settings": self.settings,
            "round_estimate_s": self.round_estimate_s,
        }

    @classmethod
    def from_meta(cls, meta: dict[str, Any]) -> PrepareReply:
        """From a result's meta as it arrived; values the server must check (counts) are taken as they are,
        and an estimate that is not a positive finite number is dropped."""
        estimate = meta.get("round_estimate_s")
        usable = isinstance(estimate, (int, float)) and not isinstance(estimate, bool) and 0 < estimate < float("inf")
        return cls(
            cohort=str(meta.get("cohort") or ""),
            num_train=meta.get("num_train"),
            class_counts=meta.get("class_counts"),
            state_dir=str(meta.get("state_dir")),
            data_root=meta.get("data_root") or None,
            settings=meta.get("settings") or {},
            round_estimate_s=float(estimate) if usable else None,
        )
