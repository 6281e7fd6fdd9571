"""The server's class-statistics exchange (PRR's CPA, TMI 2022 Sec. III-C; FedProto), without FLARE.

Each site sends, in its result's meta, the mean embedding of each class over its last local epoch
(`PROTOTYPES`, [C][D] lists), which classes it saw (`PROTOTYPE_PRESENT`, [C] bools) and its training-set
class counts (`CLASS_COUNTS`, [C] ints); prrfl.keys names them. `PrototypeExchange` turns a round's metas
into global statistics: the summed class counts (`GLOBAL_CLASS_COUNTS`) and a sample of the global prototype
of each class (`GLOBAL_PROTOTYPES`, `GLOBAL_PROTOTYPE_PRESENT`), drawn from N(mean, std^2) over the sites'
prototypes (`prrfl.algorithms.class_prototypes.sample_global_prototypes`). Only [C, D] means and counts travel,
never an embedding of a sample. `download_meta` writes the global prototypes into a download's meta and
`GlobalStatistics.from_meta` reads them back at a site: prrfl's methods (prrfl.methods.prototype_exchange) and
a FLARE client (prrfl.flare.components.GlobalStatistics.from_model) alike.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from prrfl.algorithms.class_prototypes import STD_KINDS, StdKind, sample_global_prototypes
from prrfl.keys import CLASS_COUNTS, GLOBAL_CLASS_COUNTS, GLOBAL_PROTOTYPE_PRESENT, GLOBAL_PROTOTYPES, PROTOTYPE_PRESENT, PROTOTYPES
from prrfl.server.checks import class_counts_problem, prototype_problem, round_value


def site_prototypes(metas: Sequence[Mapping[str, Any]]) -> tuple[torch.Tensor, torch.Tensor]:
    """The sites' prototypes [K, C, D] float64 and presence [K, C], from their results' metas."""
    protos = torch.stack([torch.as_tensor(m[PROTOTYPES], dtype=torch.float64) for m in metas])
    present = torch.stack([torch.as_tensor(m[PROTOTYPE_PRESENT], dtype=torch.bool) for m in metas])
    return protos, present


def usable_statistics(metas: Mapping[str, Mapping[str, Any]]) -> tuple[dict[str, dict[str, Any]], list[tuple[str, str]]]:
    """The sites' metas with only the class counts and prototypes an exchange can use, and (site, why something
    of it was left out) for the others: malformed ones (prrfl.server.checks), and those of another number of
    classes, or prototypes of another width, than the round's others (`round_value`, the most common)."""
    usable = {site: dict(meta) for site, meta in metas.items()}
    left_out: list[tuple[str, str]] = []

    def drop(site: str, keys: tuple[str, ...], why: str) -> None:
        sent = [key for key in keys if key in usable[site]]
        for key in sent:
            del usable[site][key]
        left_out.append((site, f"its {' and '.join(sent)} are left out of the global statistics: {why}"))

    for site, meta in usable.items():
        problem = class_counts_problem(meta)
        if problem:
            drop(site, (CLASS_COUNTS,), problem)
        problem = prototype_problem(meta, len(meta[CLASS_COUNTS]) if CLASS_COUNTS in meta else None)
        if problem:
            drop(site, (PROTOTYPES,), problem)
    classes = {
        s: len(m[CLASS_COUNTS] if CLASS_COUNTS in m else m[PROTOTYPES]) for s, m in usable.items() if CLASS_COUNTS in m or PROTOTYPES in m
    }
    common = round_value(classes)
    for site in [s for s, n in classes.items() if n != common]:
        drop(site, (CLASS_COUNTS, PROTOTYPES), f"they count {classes[site]} classes, the round's others {common}")
    widths = {s: len(m[PROTOTYPES][0]) for s, m in usable.items() if PROTOTYPES in m}
    common = round_value(widths)
    for site in [s for s, width in widths.items() if width != common]:
        drop(site, (PROTOTYPES,), f"they have {widths[site]} dimensions, the round's others {common}")
    return usable, left_out


def download_meta(global_protos: torch.Tensor, global_present: torch.Tensor) -> dict[str, Any]:
    """Global prototypes [C, D] and their presence [C] as they travel to a site (`GlobalStatistics.from_meta` reads
    them there)."""
    return {GLOBAL_PROTOTYPES: global_protos.tolist(), GLOBAL_PROTOTYPE_PRESENT: global_present.tolist()}


@dataclass
class GlobalStatistics:
    """What the server sent a site: global class counts [C] and global prototypes [C, D] with their
    presence [C]; each None when the download carries none (e.g. in the first round)."""

    class_counts: torch.Tensor | None = None
    prototypes: torch.Tensor | None = None
    present: torch.Tensor | None = None

    @classmethod
    def from_meta(cls, meta: Mapping[str, Any] | None) -> GlobalStatistics:
        """The statistics in a download's meta: counts as long, prototypes as float64, presence as bool."""
        meta = meta or {}
        counts = meta.get(GLOBAL_CLASS_COUNTS)
        protos = meta.get(GLOBAL_PROTOTYPES)
        return cls(
            class_counts=None if counts is None else torch.tensor(counts, dtype=torch.long),
            prototypes=None if protos is None else torch.tensor(protos, dtype=torch.float64),
            present=None if protos is None else torch.tensor(meta[GLOBAL_PROTOTYPE_PRESENT], dtype=torch.bool),
        )


class PrototypeExchange:
    """Global class counts and sampled global prototypes from a round's results.

    std ("biased" divides by the number of sites, the paper; "unbiased" by n - 1, the authors' code) and
    std_floor (the least std per dimension; authors: 1.0) are those of `sample_global_prototypes`.
    The draws come from one torch.Generator seeded `seed` at construction and continued over the rounds;
    `state_dict()` / `load_state_dict()` save and restore it, so a resumed server draws the same stream.
    per_client=False (default) draws ONE global set per round, shared by every site (PRR);
    per_client=True draws one set per site, in the sites' order.
    """

    def __init__(self, std: StdKind = "biased", std_floor: float = 0.0, seed: int = 0, per_client: bool = False):
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
        """`draws` samples (global prototypes [C, D], present [C]) from K sites' [K, C, D] and [K, C]."""
        return [
            sample_global_prototypes(site_protos, site_present, generator=self.generator, std=self.std, std_floor=self.std_floor)
            for _ in range(draws)
        ]

    def exchange(self, results: Mapping[str, Mapping[str, Any]], clients: Sequence[str] | None = None) -> dict[str, dict[str, Any]]:
        """site -> meta to add to its next model, for each of `clients` (default: those of `results`).

        results: site -> the meta of its result, in a fixed order (the draws follow it). Counts are summed
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
        drawn = self.sample(*site_prototypes(with_protos), draws=len(clients) if self.per_client else 1)
        if not self.per_client:
            drawn = drawn * len(clients)
        return {c: {**meta, **download_meta(*d)} for c, d in zip(clients, drawn)}
