"""Deputy-Enhanced Transfer (DET, PRR TMI 2022) for a FLARE Client API script.

A client keeps two models: a personalized model P, which is never overwritten by the server, and its
deputy D, which receives the server's model for this client. Before each local epoch DET compares the two
on the client's own validation data and picks a phase (`prrfl.algorithms.det.next_phase`):
Recover (D far behind P, or just downloaded): D distils from P; Exchange: both distil from each other;
Sublimate (D close to P): P distils from D. Only D's shared weights leave the client; P is what the client
uses. `PersonalizedPair` holds P, D and the phase around `flare.receive()` / `flare.send()`:

    pair = PersonalizedPair(Net(), Net())
    while flare.is_running():
        pair.receive(flare.receive())
        for epoch in range(epochs):
            pair.phase(score(pair.personal), score(pair.deputy), just_downloaded=epoch == 0)
            for x, y in loader:
                z_p, z_d = pair.personal(x), pair.deputy(x)
                extra_p, extra_d = pair.distillation(z_p, z_d)
                (ce(z_p, y) + extra_p + ce(z_d, y) + extra_d).backward()
                ...
        flare.send(pair.to_send(metrics={"accuracy": score(pair.personal)}))
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import torch
from nvflare.app_common.abstract.fl_model import FLModel, ParamsType
from torch import nn

from prrfl.algorithms import det, pfa
from prrfl.server.aggregation import as_tensors
from prrfl.storage import load_torch, save_torch


class PersonalizedPair:
    """A personalized model and its deputy (DET).

    l1 <= l2: the phase thresholds on deputy_score / personal_score (`det.next_phase`; higher scores are
    better). local_keys: state-dict keys that never leave the client and are never overwritten by a
    download (default: the deputy's BatchNorm parameters and buffers, FedBN style).
    """

    def __init__(self, personal: nn.Module, deputy: nn.Module, l1: float = 0.7, l2: float = 0.9, local_keys: Iterable[str] | None = None):
        if not 0 < l1 <= l2 <= 1:
            raise ValueError(f"need 0 < l1 <= l2 <= 1, got l1={l1}, l2={l2}")
        if personal is deputy:
            raise ValueError("the personalized model and its deputy must be two different modules")
        self.personal, self.deputy = personal, deputy
        self.l1, self.l2 = l1, l2
        self.local_keys = set(pfa.batchnorm_keys(deputy) if local_keys is None else local_keys)
        self.downloads = 0  # models received so far; the first one initialises both P and D
        self.current_phase: det.Phase | None = None
        self.just_downloaded = False

    def shared_keys(self) -> list[str]:
        return [k for k in self.deputy.state_dict() if k not in self.local_keys]

    def receive(self, input_model: FLModel) -> bool:
        """Take the server's model. The first one initialises both P and D (all keys must match); later
        ones go to the deputy only, without its local keys (strict=False: a model that carries only the
        shared keys is fine). DET restarts in Recover. Returns True for the first model."""
        params = as_tensors(input_model.params or {})
        first = self.downloads == 0
        if first:
            self.personal.load_state_dict(params)
            self.deputy.load_state_dict(params)
        else:
            self.deputy.load_state_dict({k: v for k, v in params.items() if k not in self.local_keys}, strict=False)
        self.downloads += 1
        self.current_phase = None
        self.just_downloaded = True
        return first

    def phase(self, personal_score: float, deputy_score: float, just_downloaded: bool | None = None) -> det.Phase:
        """The DET phase of the coming epoch from P's and D's scores (higher is better). just_downloaded:
        whether D was replaced since the last epoch (default: no epoch ran since `receive`)."""
        if just_downloaded is None:
            just_downloaded = self.just_downloaded
        self.current_phase = det.next_phase(
            self.current_phase, deputy_score, personal_score, l1=self.l1, l2=self.l2, just_downloaded=just_downloaded
        )
        self.just_downloaded = False
        return self.current_phase

    def distillation(self, z_personal: torch.Tensor, z_deputy: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(extra loss of P, extra loss of D) in the current phase: KL(teacher || student) with the teacher
        detached (`det.kl_distillation`) for the model that learns from the other, 0 for the one that does not."""
        if self.current_phase is None:
            raise RuntimeError("no DET phase yet: call phase() before the epoch's batches")
        p_learns, d_learns = det.distillation_targets(self.current_phase)
        zero = z_personal.new_zeros(())
        return (
            det.kl_distillation(z_personal, z_deputy) if p_learns else zero,
            det.kl_distillation(z_deputy, z_personal) if d_learns else zero,
        )

    def to_send(self, metrics: Mapping[str, Any] | None = None, meta: Mapping[str, Any] | None = None) -> FLModel:
        """The result: the deputy's shared weights (FULL, on the CPU; a ScriptRunner with
        params_transfer_type=DIFF turns them into a difference), with `metrics` and `meta`."""
        state = self.deputy.state_dict()
        params = {k: state[k].detach().cpu().clone() for k in self.shared_keys()}
        return FLModel(params_type=ParamsType.FULL, params=params, metrics=dict(metrics or {}), meta=dict(meta or {}))

    def state_dict(self) -> dict[str, Any]:
        phase = None if self.current_phase is None else int(self.current_phase)
        return {
            "personal": self.personal.state_dict(),
            "deputy": self.deputy.state_dict(),
            "phase": phase,
            "downloads": self.downloads,
            "just_downloaded": self.just_downloaded,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.personal.load_state_dict(state["personal"])
        self.deputy.load_state_dict(state["deputy"])
        self.current_phase = None if state["phase"] is None else det.Phase(state["phase"])
        self.downloads = int(state["downloads"])
        self.just_downloaded = bool(state["just_downloaded"])

    def save(self, path: str | Path) -> Path:
        """Write P, D and the DET state to `path` atomically (for a client process restarted per task)."""
        return save_torch(self.state_dict(), path)

    def load(self, path: str | Path) -> bool:
        """Restore what `save` wrote; False (nothing changed) when `path` does not exist."""
        if not Path(path).exists():
            return False
        self.load_state_dict(load_torch(path))
        return True
