"""Per-client aggregators as FLARE components: every client gets a model of its own, computed from all
clients' results.

FLARE's `ModelAggregator` reduces a round's results to ONE model. A personalized method needs one output
per client, so `PerClientAggregator` keeps FLARE's accept / aggregate / reset cycle but returns a dict
client -> FLModel. The math is prrfl's own server core (prrfl.server.aggregation, on state dicts, the same
code prrfl's jobs run); each component here is that core plus the cycle.

What an aggregator expects from `accept_model`: FULL weights (`ParamsType.FULL`) of the keys the client
shares, as torch tensors (numpy arrays are turned into tensors), `meta["client_name"]` (FLARE sets it on
every result), and, for `weighting="samples"`, how much the client trained: its training-set size in
`meta[NUM_SAMPLES]` or, as FLARE's FedAvg reads it, its local steps in `meta[NUM_STEPS]`
("NUM_STEPS_CURRENT_ROUND"). A result is checked before it is kept (`prrfl.server.checks.params_problem`:
finite, the keys, shapes and kinds of values (float, integer) of the first result of the round, or of the
`reference` the controller set); a DIFF is refused, since adding it to the wrong base would corrupt the
model silently (`PersonalizedFedAvg` turns DIFFs into full weights first). Every refusal is a ValueError
naming the client. Once the round's results are in, `refuse_disagreeing` refuses those that do not send the
keys the round's others send, or (weighting="samples") count their weight in the other unit: a client that
sends its local steps among clients that send their training-set size would weigh ~steps/samples as much
as it should.

* `FedAvgAggregator`: the same weighted average for every client.
* `FedBNAggregator`: FedAvg, with each client's BatchNorm layers (or any `local_keys`) kept at the client.
* `FourierAggregator`: Progressive Fourier Aggregation (PRR), one output per client.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, ClassVar

import torch
from nvflare.apis.fl_component import FLComponent
from nvflare.app_common.abstract.fl_model import FLModel, ParamsType
from torch import nn

from prrfl.algorithms import pfa
from prrfl.keys import NUM_SAMPLES, NUM_STEPS, PFA_R
from prrfl.server import aggregation
from prrfl.server.aggregation import Weighting, add_difference, as_tensors, local_batchnorm_keys
from prrfl.server.checks import is_count, params_problem, round_value

__all__ = [
    "NUM_SAMPLES",
    "NUM_STEPS",
    "PFA_R",
    "FedAvgAggregator",
    "FedBNAggregator",
    "FourierAggregator",
    "PerClientAggregator",
    "add_difference",
    "as_tensors",
]
StateDict = Mapping[str, torch.Tensor]


WEIGHT_UNITS = {NUM_SAMPLES: "training-set size", NUM_STEPS: "local steps"}  # meta key -> what it counts


def training_amount(meta: Mapping[str, Any]) -> tuple[str, int] | None:
    """How much a client trained, for weighting="samples", and the meta key it was read from: meta[NUM_SAMPLES],
    else meta[NUM_STEPS]; the amount is -1 when it is not a positive integer."""
    for key in WEIGHT_UNITS:
        n = meta.get(key)
        if n is not None:
            return key, n if is_count(n) and n > 0 else -1
    return None


class PerClientAggregator(FLComponent, aggregation.Aggregator):
    """Base of the per-client aggregators (FLARE `ModelAggregator` style, one output per client).

    accept_model(model) once per client result, then aggregate_models(round_idx, num_rounds) -> {client:
    FLModel}, then reset_stats() before the next round. The math (`aggregate_states`, `weights`,
    `output_meta`) is a prrfl.server.aggregation.Aggregator's; a new aggregator implements `aggregate_states`.
    `weighting`: "samples" weights client k by n_k / sum n; "uniform" by 1/K.
    """

    def __init__(self, weighting: Weighting = "samples"):
        FLComponent.__init__(self)
        aggregation.Aggregator.__init__(self, weighting)
        self._states: dict[str, dict[str, torch.Tensor]] = {}
        self._num_samples: dict[str, int] = {}
        self._units: dict[str, str] = {}  # client -> the meta key its weight was read from (WEIGHT_UNITS)
        self.reference: dict[str, torch.Tensor] | None = None  # keys and shapes a result must have (set by the controller)

    kept_argument: ClassVar[str | None] = None  # the constructor argument naming the keys kept at each client

    def keep(self, keys: Iterable[str] | None) -> None:
        """The keys kept at each client, as given to the constructor (None: the model's BatchNorm layers, once
        `use_model` has seen it); the argument keeps its given value, which FLARE's job export reads back."""
        setattr(self, self.kept_argument, None if keys is None else sorted(keys))
        self.kept_keys = None if keys is None else set(keys)

    def use_model(self, model: nn.Module | None) -> None:
        """What the controller's model tells: the BatchNorm layers kept at each client, found by layer type
        (`local_batchnorm_keys`, the rule prrfl's FedBN uses), unless the keys were given."""
        if self.kept_argument is None or getattr(self, self.kept_argument) is not None:
            return
        if model is None:
            raise ValueError(
                f"{type(self).__name__} finds the BatchNorm layers it keeps local in the controller's model (an nn.Module); "
                f"with a state dict as the model, give {self.kept_argument} (() when there is no BatchNorm)"
            )
        self.kept_keys = local_batchnorm_keys(model)

    def set_reference(self, state: StateDict) -> None:
        self.reference = {k: v for k, v in state.items()}

    # ----- FLARE's accept / aggregate / reset cycle ---------------------------------------------
    def accept_model(self, model: FLModel) -> None:
        """Keep one client's result (FULL weights; see the module docstring). ValueError naming the client
        when it is unusable."""
        meta = model.meta or {}
        client = meta.get("client_name")
        if not client:
            raise ValueError("the result has no meta['client_name']")
        if model.params_type not in (None, ParamsType.FULL):
            raise ValueError(
                f"{client}: the aggregator needs FULL weights, got {model.params_type}; add the difference to what was sent first"
            )
        if not model.params:
            raise ValueError(f"{client}: the result has no params")
        if client in self._states:
            raise ValueError(f"{client}: a result of this client was already accepted this round")
        params = as_tensors(model.params)
        reference = self.reference if self.reference is not None else next(iter(self._states.values()), None)
        problem = params_problem(params, reference if reference is not None else params, subset=self.reference is not None)
        if problem:
            raise ValueError(f"{client}: {problem}")
        if self.weighting == "samples":
            unit, n = training_amount(meta) or (None, -1)
            if n < 0:
                raise ValueError(
                    f"{client}: weighting='samples' needs meta[{NUM_SAMPLES!r}] (training-set size) or meta[{NUM_STEPS!r}] "
                    f"(local steps), a positive integer; got {meta.get(NUM_SAMPLES, meta.get(NUM_STEPS))!r:.60}"
                )
            self._num_samples[client], self._units[client] = n, unit
        self._states[client] = params

    def refuse_disagreeing(self) -> dict[str, str]:
        """Refuse the accepted results that disagree with the round's others (`prrfl.server.checks.round_value`,
        the most common value): their keys (a tie goes to the larger set) and, for weighting="samples", the unit
        of their weight (a tie goes to NUM_SAMPLES). Returns client -> the reason; those clients are dropped."""
        keys = {c: frozenset(s) for c, s in self._states.items()}
        common_keys = round_value(keys, rank=len)
        common_unit = round_value(self._units, rank=lambda unit: unit == NUM_SAMPLES)
        agreeing = sum(k == common_keys for k in keys.values())
        reasons = {}
        for client, sent in keys.items():
            if sent != common_keys:
                lacking, more = sorted(common_keys - sent, key=str), sorted(sent - common_keys, key=str)
                parts = ([f"it lacks {lacking[:5]}"] if lacking else []) + ([f"it also sends {more[:5]}"] if more else [])
                reasons[client] = f"{client}: its keys differ from those of the round's other {agreeing} result(s): " + "; ".join(parts)
        for client, unit in self._units.items():
            if unit != common_unit and client not in reasons:
                others = sum(u == common_unit for u in self._units.values())
                reasons[client] = (
                    f"{client}: its weight is meta[{unit!r}] ({WEIGHT_UNITS[unit]}) while the round's other {others} result(s) "
                    f"send meta[{common_unit!r}] ({WEIGHT_UNITS[common_unit]}): counts of two units cannot weigh one average; "
                    f"send {common_unit!r} as they do"
                )
        for client in reasons:
            self._states.pop(client)
            self._num_samples.pop(client, None)
            self._units.pop(client, None)
        return reasons

    def aggregate_models(self, round_idx: int, num_rounds: int) -> dict[str, FLModel]:
        """client -> FLModel (FULL) for every accepted client, in the order they were accepted."""
        if not self._states:
            raise ValueError("no result was accepted: nothing to aggregate")
        keys = [set(s) for s in self._states.values()]
        if any(k != keys[0] for k in keys[1:]):
            differ = {c: sorted(set(s) ^ keys[0])[:3] for c, s in self._states.items() if set(s) != keys[0]}
            raise ValueError(f"the clients sent different keys: {differ}")
        outputs = self.aggregate_states(self._states, self._num_samples, round_idx, num_rounds)
        meta = self.output_meta(round_idx, num_rounds)
        return {
            c: FLModel(params_type=ParamsType.FULL, params=p, current_round=round_idx, total_rounds=num_rounds, meta=dict(meta))
            for c, p in outputs.items()
        }

    def reset_stats(self) -> None:
        self._states.clear()
        self._num_samples.clear()
        self._units.clear()


class FedAvgAggregator(PerClientAggregator, aggregation.FedAvg):
    """Every client gets the same weighted average (prrfl.server.aggregation.FedAvg)."""


class FedBNAggregator(PerClientAggregator, aggregation.FedBN):
    """FedAvg with some keys kept at each client (prrfl.server.aggregation.FedBN): `local_keys` (names), by
    default the BatchNorm layers of the controller's model, found by layer type (`local_batchnorm_keys`,
    the rule prrfl's FedBN uses). Without a model (a controller given only a state dict) name the keys."""

    kept_argument = "local_keys"

    def __init__(self, weighting: Weighting = "samples", local_keys: Iterable[str] | None = None):
        PerClientAggregator.__init__(self, weighting)
        aggregation.FedBN.__init__(self, weighting, () if local_keys is None else local_keys)
        self.keep(local_keys)


class FourierAggregator(PerClientAggregator, aggregation.Fourier):
    """Progressive Fourier Aggregation (PRR, TMI 2022; prrfl.server.aggregation.Fourier), one output per
    client, each carrying the round's r as meta[PFA_R]. `bn_keys` (default: the BatchNorm layers of the
    controller's model, by layer type, as `FedBNAggregator`) and `skip` patterns stay at the client."""

    kept_argument = "bn_keys"

    def __init__(
        self,
        r0: float = 0.35,
        r1: float = 0.48,
        schedule: pfa.Schedule = "paper",
        components: pfa.Components = "amplitude_phase",
        conv_layout: pfa.ConvLayout = "paper",
        classifier_key: str | Sequence[str] | None = None,
        classifier_rowwise: bool = True,
        weighting: Weighting = "uniform",
        bn_keys: Iterable[str] | None = None,
        skip: Iterable[str] | None = None,
    ):
        PerClientAggregator.__init__(self, weighting)
        aggregation.Fourier.__init__(
            self, r0, r1, schedule, components, conv_layout, classifier_key, classifier_rowwise, weighting, bn_keys or (), skip
        )
        self.keep(bn_keys)
