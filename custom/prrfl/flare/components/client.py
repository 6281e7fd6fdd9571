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

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from nvflare.app_common.abstract.fl_model import FLModel, ParamsType

from prrfl.algorithms import det
from prrfl.server.aggregation import as_tensors
from prrfl.storage import load_torch, save_torch


class PersonalizedPair(det.DeputyPair):
    """A personalized model and its deputy (DET) around FLARE's Client API: `prrfl.algorithms.det.DeputyPair`
    (the phase, the distillation, the weights that travel), taking and giving FLModels.

    l1 <= l2: the phase thresholds on deputy_score / personal_score (`det.next_phase`; higher scores are
    better). local_keys: state-dict keys that never leave the client and are never overwritten by a
    download (default: the deputy's BatchNorm parameters and buffers, FedBN style). phases: the DET phases
    allowed (default all three; `det.allowed_phase`).
    """

    def receive(self, input_model: FLModel) -> bool:
        """Take the server's model (`DeputyPair.receive_state`): the first one initialises both P and D, later
        ones go to the deputy only, without its local keys. Returns True for the first model."""
        return self.receive_state(as_tensors(input_model.params or {}))

    def to_send(self, metrics: Mapping[str, Any] | None = None, meta: Mapping[str, Any] | None = None) -> FLModel:
        """The result: the deputy's shared weights (FULL, on the CPU; a ScriptRunner with
        params_transfer_type=DIFF turns them into a difference), with `metrics` and `meta`."""
        return FLModel(params_type=ParamsType.FULL, params=self.shared_state(), metrics=dict(metrics or {}), meta=dict(meta or {}))

    def save(self, path: str | Path) -> Path:
        """Write P, D and the DET state to `path` atomically (for a client process restarted per task)."""
        return save_torch(self.state_dict(), path)

    def load(self, path: str | Path) -> bool:
        """Restore what `save` wrote; False (nothing changed) when `path` does not exist."""
        if not Path(path).exists():
            return False
        self.load_state_dict(load_torch(path))
        return True
