"""Class prototypes and class counts exchanged through FLModel meta (PRR's CPA loss, TMI 2022 Sec. III-C).

A client sends, in its result's meta, the mean embedding of each class over its last local epoch
(`PROTOTYPES`, [C][D] lists), which classes it saw (`PROTOTYPE_PRESENT`, [C] bools) and its training-set
class counts (`CLASS_COUNTS`, [C] ints). The server's `PrototypeExchange` turns a round's results into
global statistics: the summed class counts (`GLOBAL_CLASS_COUNTS`) and a sample of the global prototype of
each class (`GLOBAL_PROTOTYPES`, `GLOBAL_PROTOTYPE_PRESENT`), drawn from N(mean, std^2) over the clients'
prototypes (`prrfl.algorithms.class_prototypes.sample_global_prototypes`). These go into the meta of every
client's next model. Only [C, D] means and counts travel, never an embedding of a sample.

Client side: `PrototypeTracker` accumulates the prototypes and attaches them to the result;
`GlobalStatistics.from_model` reads what the server sent (None where it sent nothing, e.g. round 0).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from nvflare.apis.fl_component import FLComponent
from nvflare.app_common.abstract.fl_model import FLModel

from prrfl.algorithms import class_prototypes
from prrfl.algorithms.class_prototypes import StdKind
from prrfl.keys import CLASS_COUNTS, GLOBAL_CLASS_COUNTS, GLOBAL_PROTOTYPE_PRESENT, GLOBAL_PROTOTYPES, PROTOTYPE_PRESENT, PROTOTYPES
from prrfl.server import class_statistics

__all__ = [  # the keys are re-exported from their table, prrfl.keys
    "CLASS_COUNTS",
    "GLOBAL_CLASS_COUNTS",
    "GLOBAL_PROTOTYPES",
    "GLOBAL_PROTOTYPE_PRESENT",
    "PROTOTYPES",
    "PROTOTYPE_PRESENT",
    "GlobalStatistics",
    "PrototypeExchange",
    "PrototypeTracker",
]


class PrototypeExchange(FLComponent, class_statistics.PrototypeExchange):
    """Server side: global class counts and sampled global prototypes from a round's client results, as a
    FLARE component (the exchange itself is prrfl.server.class_statistics.PrototypeExchange, which prrfl's PRR
    runs). std, std_floor, seed and per_client: see there."""

    def __init__(self, std: StdKind = "biased", std_floor: float = 0.0, seed: int = 0, per_client: bool = False):
        FLComponent.__init__(self)
        class_statistics.PrototypeExchange.__init__(self, std, std_floor, seed, per_client)


class PrototypeTracker(class_prototypes.PrototypeTracker):
    """Client side: per-class mean embeddings (`prrfl.algorithms.class_prototypes.PrototypeTracker`: reset each local
    epoch, update per training batch), attached to the result's meta before `flare.send`."""

    def attach(self, model: FLModel, class_counts: Sequence[int] | torch.Tensor) -> FLModel:
        """Put PROTOTYPES, PROTOTYPE_PRESENT and CLASS_COUNTS into `model.meta`; returns `model`."""
        model.meta = {**(model.meta or {}), **self.meta(class_counts)}
        return model


class GlobalStatistics(class_statistics.GlobalStatistics):
    """Client side: what the server sent a client (`prrfl.server.class_statistics.GlobalStatistics`, the reader prrfl's
    own sites use): global class counts [C] and global prototypes [C, D] with their presence [C]; each None when
    the received model carries none (e.g. in the first round)."""

    @classmethod
    def from_model(cls, model: FLModel) -> GlobalStatistics:
        return cls.from_meta(model.meta)
