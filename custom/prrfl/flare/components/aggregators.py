"""Per-client aggregators: every client gets a model of its own, computed from all clients' results.

FLARE's `ModelAggregator` reduces a round's results to ONE model. A personalized method needs one output
per client, so `PerClientAggregator` keeps FLARE's accept / aggregate / reset cycle but returns a dict
client -> FLModel. Each aggregator also has a pure core, `aggregate_states`, that works on state dicts
and knows nothing about FLARE (deterministic; outputs in the clients' order as given).

What an aggregator expects from `accept_model`: FULL weights (`ParamsType.FULL`) of the keys the client
shares, as torch tensors, `meta["client_name"]` (FLARE sets it on every result), and, for
`weighting="samples"`, the client's training-set size in `meta[NUM_SAMPLES]`. A DIFF result must be
turned into full weights first by whoever knows what was sent (`PersonalizedFedAvg` does); a DIFF given
here is refused, since adding it to the wrong base would corrupt the model silently.

* `FedAvgAggregator`: the same weighted average for every client (`prrfl.methods.aggregation`).
* `FedBNAggregator`: FedAvg, with BatchNorm keys (or any `local_keys`) kept at each client.
* `FourierAggregator`: Progressive Fourier Aggregation (`prrfl.algorithms.pfa`), one output per client.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import torch
from nvflare.apis.fl_component import FLComponent
from nvflare.app_common.abstract.fl_model import FLModel, ParamsType

from prrfl.algorithms import pfa
from prrfl.messages import Upload
from prrfl.methods.aggregation import WEIGHTINGS, Weighting, site_weights, weighted_average

StateDict = Mapping[str, torch.Tensor]

NUM_SAMPLES = "num_samples"  # meta key of a result: the client's training-set size (weighting="samples")
PFA_R = "pfa_r"  # meta key of a FourierAggregator output: the round's box half-width r


def as_tensors(params: Mapping[str, Any]) -> dict[str, torch.Tensor]:
    """Params as torch tensors (a result that went through numpy, e.g. a privacy filter, comes back as arrays)."""
    return {k: torch.from_numpy(np.ascontiguousarray(v)) if isinstance(v, np.ndarray) else torch.as_tensor(v) for k, v in params.items()}


def add_difference(difference: Mapping[str, torch.Tensor], sent: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Full weights from a client's difference to what it was `sent`, in the sent tensors' dtype and device."""
    return {k: (sent[k] + d.to(sent[k].device)).to(sent[k].dtype) for k, d in difference.items()}


def uploads(states: Mapping[str, StateDict], num_samples: Mapping[str, int]) -> list[Upload]:
    """The clients as prrfl `Upload`s, in the given order, for `site_weights` (a missing count is 0)."""
    return [Upload(site=c, params=dict(s), num_train=int(num_samples.get(c, 0)), class_counts=[]) for c, s in states.items()]


class PerClientAggregator(FLComponent):
    """Base of the per-client aggregators (FLARE `ModelAggregator` style, one output per client).

    accept_model(model) once per client result, then aggregate_models(round_idx, num_rounds) -> {client:
    FLModel}, then reset_stats() before the next round. Subclasses implement `aggregate_states`.
    `weighting`: "samples" weights client k by n_k / sum n (n_k from meta[NUM_SAMPLES]); "uniform" by 1/K.
    """

    def __init__(self, weighting: Weighting = "samples"):
        super().__init__()
        if weighting not in WEIGHTINGS:
            raise ValueError(f"weighting must be one of {WEIGHTINGS}, got {weighting!r}")
        self.weighting = weighting
        self._states: dict[str, dict[str, torch.Tensor]] = {}
        self._num_samples: dict[str, int] = {}

    def aggregate_states(
        self, states: Mapping[str, StateDict], num_samples: Mapping[str, int], round_idx: int, num_rounds: int
    ) -> dict[str, dict[str, torch.Tensor]]:
        """client -> its new state dict, from every client's state dict (same keys) and training-set size."""
        raise NotImplementedError

    def output_meta(self, round_idx: int, num_rounds: int) -> dict[str, Any]:
        """Meta added to every output model of the round (none by default)."""
        return {}

    def weights(self, states: Mapping[str, StateDict], num_samples: Mapping[str, int]) -> torch.Tensor:
        """Normalised float64 client weights, in the order of `states` (`site_weights`)."""
        if self.weighting == "samples":
            missing = [c for c in states if c not in num_samples]
            if missing:
                raise ValueError(f"weighting='samples' needs the training-set size of {missing}")
        return site_weights(uploads(states, num_samples), self.weighting)

    # ----- FLARE's accept / aggregate / reset cycle ---------------------------------------------
    def accept_model(self, model: FLModel) -> None:
        """Keep one client's result (FULL weights; see the module docstring). ValueError when unusable."""
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
        if self.weighting == "samples":
            n = meta.get(NUM_SAMPLES)
            if not isinstance(n, int) or isinstance(n, bool) or n <= 0:
                raise ValueError(f"{client}: weighting='samples' needs meta[{NUM_SAMPLES!r}], a positive integer; got {n!r}")
            self._num_samples[client] = n
        if client in self._states:
            raise ValueError(f"{client}: a result of this client was already accepted this round")
        self._states[client] = as_tensors(model.params)

    def aggregate_models(self, round_idx: int, num_rounds: int) -> dict[str, FLModel]:
        """client -> FLModel (FULL) for every accepted client, in the order they were accepted."""
        if not self._states:
            raise ValueError("no result was accepted: nothing to aggregate")
        outputs = self.aggregate_states(self._states, self._num_samples, round_idx, num_rounds)
        meta = self.output_meta(round_idx, num_rounds)
        return {
            c: FLModel(params_type=ParamsType.FULL, params=p, current_round=round_idx, total_rounds=num_rounds, meta=dict(meta))
            for c, p in outputs.items()
        }

    def reset_stats(self) -> None:
        self._states.clear()
        self._num_samples.clear()


class FedAvgAggregator(PerClientAggregator):
    """Every client gets the same weighted average (`prrfl.methods.aggregation.weighted_average`)."""

    def aggregate_states(self, states, num_samples, round_idx, num_rounds):
        average = weighted_average(list(states.values()), self.weights(states, num_samples))
        return {c: {k: v.clone() for k, v in average.items()} for c in states}


class FedBNAggregator(PerClientAggregator):
    """FedAvg with some keys kept at each client: `local_keys` (names), by default every BatchNorm key found by
    name (`prrfl.algorithms.pfa.guess_batchnorm_keys`: bn/bnN name parts, running statistics and their affine
    parameters). A client whose result does not carry BN at all simply has nothing kept."""

    def __init__(self, weighting: Weighting = "samples", local_keys: Iterable[str] | None = None):
        super().__init__(weighting)
        self.local_keys = None if local_keys is None else list(local_keys)

    def aggregate_states(self, states, num_samples, round_idx, num_rounds):
        keys = list(next(iter(states.values())))
        local = set(pfa.guess_batchnorm_keys(keys) if self.local_keys is None else self.local_keys)
        shared = [k for k in keys if k not in local]
        average = (
            weighted_average([{k: s[k] for k in shared} for s in states.values()], self.weights(states, num_samples)) if shared else {}
        )
        return {c: {k: average[k].clone() if k in average else s[k].detach().clone() for k in keys} for c, s in states.items()}


class FourierAggregator(PerClientAggregator):
    """Progressive Fourier Aggregation (PRR, TMI 2022): `prrfl.algorithms.pfa.pfa_aggregate` with the box
    half-width r of `pfa_threshold(round_idx, num_rounds, r0, r1, schedule)`.

    Inside the low-frequency box of each weight's centred spectrum the clients share the weighted average
    amplitude (and phase, for components="amplitude_phase"; "amplitude" is the MICCAI PRR-FL variant);
    outside, each client keeps its own. BatchNorm keys (`bn_keys`, default found by name) and `skip`
    patterns stay at the client; the classifier (`classifier_key`: a key, or several such as the branches of
    an ASPP head; default the last 2-D weight) is mixed row by row, one class per row (`classifier_rowwise`). `r` holds the last aggregation's r; every output
    model carries it as meta[PFA_R].
    """

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
        super().__init__(weighting)
        pfa.pfa_threshold(0, 1, r0=r0, r1=r1, schedule=schedule)  # checks r0, r1 and the schedule now
        if components not in pfa.COMPONENTS:
            raise ValueError(f"components must be one of {pfa.COMPONENTS}, got {components!r}")
        if conv_layout not in pfa.CONV_LAYOUTS:
            raise ValueError(f"conv_layout must be one of {pfa.CONV_LAYOUTS}, got {conv_layout!r}")
        self.r0, self.r1, self.schedule = r0, r1, schedule
        self.components, self.conv_layout = components, conv_layout
        self.classifier_key = classifier_key if classifier_key is None or isinstance(classifier_key, str) else tuple(classifier_key)
        self.classifier_rowwise = classifier_rowwise
        self.bn_keys = None if bn_keys is None else list(bn_keys)
        self.skip = None if skip is None else list(skip)
        self.r: float | None = None

    def threshold(self, round_idx: int, num_rounds: int) -> float:
        """The box half-width r of round `round_idx` (0-based) of `num_rounds`."""
        return pfa.pfa_threshold(round_idx, num_rounds, r0=self.r0, r1=self.r1, schedule=self.schedule)

    def aggregate_states(self, states, num_samples, round_idx, num_rounds):
        self.r = self.threshold(round_idx, num_rounds)
        mixed = pfa.pfa_aggregate(
            list(states.values()),
            self.r,
            weights=self.weights(states, num_samples),
            components=self.components,
            conv_layout=self.conv_layout,
            classifier_key=self.classifier_key,
            classifier_rowwise=self.classifier_rowwise,
            bn_keys=self.bn_keys,
            skip=self.skip,
        )
        return dict(zip(states, mixed))

    def output_meta(self, round_idx: int, num_rounds: int) -> dict[str, Any]:
        return {PFA_R: self.threshold(round_idx, num_rounds)}
