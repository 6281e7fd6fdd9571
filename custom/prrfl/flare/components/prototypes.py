"""Class prototypes and class counts exchanged through FLModel meta (PRR's CPA loss, TMI 2022 Sec. III-C).

A client sends, in its result's meta, the mean embedding of each class over its last local epoch
(`PROTOTYPES`, [C][D] lists), which classes it saw (`PROTOTYPE_PRESENT`, [C] bools) and its training-set
class counts (`CLASS_COUNTS`, [C] ints). The server's `PrototypeExchange` turns a round's results into
global statistics: the summed class counts (`GLOBAL_CLASS_COUNTS`) and a sample of the global prototype of
each class (`GLOBAL_PROTOTYPES`, `GLOBAL_PROTOTYPE_PRESENT`), drawn from N(mean, std^2) over the clients'
prototypes (`prrfl.algorithms.prototypes.sample_global_prototypes`). These go into the meta of every
client's next model. Only [C, D] means and counts travel, never an embedding of a sample.

Client side: `PrototypeTracker` accumulates the prototypes and attaches them to the result;
`GlobalStatistics.from_model` reads what the server sent (None where it sent nothing, e.g. round 0).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from nvflare.apis.fl_component import FLComponent
from nvflare.app_common.abstract.fl_model import FLModel

from prrfl.algorithms.prototypes import STD_KINDS, PrototypeAccumulator, StdKind, sample_global_prototypes
from prrfl.methods.prototype_exchange import download_meta

# client -> server (a result's meta)
PROTOTYPES = "prototypes"
PROTOTYPE_PRESENT = "prototype_present"
CLASS_COUNTS = "class_counts"
# server -> client (the meta of the next model)
GLOBAL_PROTOTYPES = "global_prototypes"
GLOBAL_PROTOTYPE_PRESENT = "global_prototype_present"
GLOBAL_CLASS_COUNTS = "global_class_counts"


class PrototypeExchange(FLComponent):
    """Server side: global class counts and sampled global prototypes from a round's client results.

    std ("biased" divides by the number of clients, the paper; "unbiased" by n - 1, the authors' code) and
    std_floor (the least std per dimension; authors: 1.0) are those of `sample_global_prototypes`.
    The draws come from one torch.Generator seeded `seed` at construction and continued over the rounds;
    `state_dict()` / `load_state_dict()` save and restore it, so a resumed server draws the same stream.
    per_client=False (default) draws ONE global set per round, shared by every client (PRR);
    per_client=True draws one set per client, in the clients' order.
    """

    def __init__(self, std: StdKind = "biased", std_floor: float = 0.0, seed: int = 0, per_client: bool = False):
        super().__init__()
        if std not in STD_KINDS:
            raise ValueError(f"std must be one of {STD_KINDS}, got {std!r}")
        if not std_floor >= 0:
            raise ValueError(f"std_floor must be non-negative, got {std_floor}")
        self.std, self.std_floor, self.seed, self.per_client = std, std_floor, seed, per_client
        self.generator = torch.Generator().manual_seed(seed)

    def state_dict(self) -> dict[str, Any]:
        return {"generator": self.generator.get_state()}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.generator.set_state(state["generator"])

    def sample(self, site_protos: torch.Tensor, site_present: torch.Tensor, draws: int = 1) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """`draws` samples (global prototypes [C, D], present [C]) from K clients' [K, C, D] and [K, C]."""
        return [
            sample_global_prototypes(site_protos, site_present, generator=self.generator, std=self.std, std_floor=self.std_floor)
            for _ in range(draws)
        ]

    def exchange(self, results: Mapping[str, Mapping[str, Any]], clients: Sequence[str] | None = None) -> dict[str, dict[str, Any]]:
        """client -> meta to add to its next model, for each of `clients` (default: those of `results`).

        results: client -> the meta of its result, in a fixed order (the draws follow it). Counts are summed
        over the results that carry CLASS_COUNTS; prototypes are sampled from those that carry PROTOTYPES
        (nothing is drawn when none does). A key is left out when no result brought what it needs.
        """
        clients = list(results) if clients is None else list(clients)
        meta: dict[str, Any] = {}
        counts = [torch.as_tensor(m[CLASS_COUNTS], dtype=torch.long) for m in results.values() if CLASS_COUNTS in m]
        if counts:
            meta[GLOBAL_CLASS_COUNTS] = torch.stack(counts).sum(dim=0).tolist()
        with_protos = [m for m in results.values() if PROTOTYPES in m]
        if not with_protos:
            return {c: dict(meta) for c in clients}
        site_protos = torch.stack([torch.as_tensor(m[PROTOTYPES], dtype=torch.float64) for m in with_protos])
        present = torch.stack([torch.as_tensor(m[PROTOTYPE_PRESENT], dtype=torch.bool) for m in with_protos])
        drawn = self.sample(site_protos, present, draws=len(clients) if self.per_client else 1)
        if not self.per_client:
            drawn = drawn * len(clients)
        return {c: {**meta, **download_meta(*d)} for c, d in zip(clients, drawn)}


class PrototypeTracker:
    """Client side: per-class mean embeddings, fed batch by batch, attached to the result's meta.

    Call `reset()` at the start of each local epoch so the prototypes sent are those of the last epoch (PRR's
    choice), `update(embeddings [N, D], labels [N])` for every training batch, then
    `attach(fl_model, class_counts)` before `flare.send`.
    """

    def __init__(self, num_classes: int):
        if num_classes < 1:
            raise ValueError(f"num_classes must be at least 1, got {num_classes}")
        self.num_classes = num_classes
        self.accumulator: PrototypeAccumulator | None = None

    def reset(self) -> None:
        self.accumulator = None

    def update(self, embeddings: torch.Tensor, labels: torch.Tensor) -> None:
        if self.accumulator is None:
            self.accumulator = PrototypeAccumulator(self.num_classes, embeddings.shape[-1])
        self.accumulator.update(embeddings.detach(), labels)

    def prototypes(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(prototypes [C, D] float64 on the CPU, present [C] bool) of what was seen since the last reset."""
        if self.accumulator is None:
            raise RuntimeError("no embeddings were tracked: call update() for the training batches first")
        protos, counts = self.accumulator.compute()
        return protos.cpu(), (counts > 0).cpu()

    def attach(self, model: FLModel, class_counts: Sequence[int] | torch.Tensor) -> FLModel:
        """Put PROTOTYPES, PROTOTYPE_PRESENT and CLASS_COUNTS into `model.meta`; returns `model`."""
        counts = torch.as_tensor(class_counts, dtype=torch.long).flatten()
        if counts.numel() != self.num_classes or (counts < 0).any():
            raise ValueError(f"class_counts must be {self.num_classes} non-negative integers, got {counts.tolist()}")
        protos, present = self.prototypes()
        model.meta = {
            **(model.meta or {}),
            PROTOTYPES: protos.tolist(),
            PROTOTYPE_PRESENT: present.tolist(),
            CLASS_COUNTS: counts.tolist(),
        }
        return model


@dataclass
class GlobalStatistics:
    """What the server sent a client: global class counts [C] and global prototypes [C, D] with their
    presence [C]; each None when the received model carries none (e.g. in the first round)."""

    class_counts: torch.Tensor | None = None
    prototypes: torch.Tensor | None = None
    present: torch.Tensor | None = None

    @classmethod
    def from_meta(cls, meta: Mapping[str, Any] | None) -> GlobalStatistics:
        meta = meta or {}
        counts = meta.get(GLOBAL_CLASS_COUNTS)
        protos = meta.get(GLOBAL_PROTOTYPES)
        return cls(
            class_counts=None if counts is None else torch.tensor(counts, dtype=torch.long),
            prototypes=None if protos is None else torch.tensor(protos, dtype=torch.float64),
            present=None if protos is None else torch.tensor(meta[GLOBAL_PROTOTYPE_PRESENT], dtype=torch.bool),
        )

    @classmethod
    def from_model(cls, model: FLModel) -> GlobalStatistics:
        return cls.from_meta(model.meta)
