"""The server's aggregation, one output per site, on state dicts and without FLARE: site weights, the
weighted average, and the three aggregators every prrfl job and every FLARE component runs on.

An `Aggregator` maps every site's state dict (the same keys) and training-set size to one new state dict
per site (`aggregate_states`, deterministic, outputs in the sites' order as given) and may add meta to
every output (`output_meta`). FLARE's accept / aggregate / reset cycle around it lives in
prrfl.flare.components.aggregators; prrfl's methods call it directly.

* `FedAvg`: every site gets the same weighted average.
* `FedBN`: FedAvg, with each site's `local_keys` kept (its BatchNorm layers: `local_batchnorm_keys`).
* `Fourier`: Progressive Fourier Aggregation (PRR; `prrfl.algorithms.pfa.pfa_aggregate`), one output per site.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Literal, get_args

import numpy as np
import torch
from torch import nn

from prrfl.algorithms import pfa
from prrfl.algorithms.pfa import normalised_weights
from prrfl.keys import PFA_R
from prrfl.messages import Upload

StateDict = Mapping[str, torch.Tensor]
Weighting = Literal["samples", "uniform"]
WEIGHTINGS: tuple[str, ...] = get_args(Weighting)


def site_weights(uploads: Sequence[Upload], weighting: Weighting = "samples") -> torch.Tensor:
    """Normalised float64 weights: "samples" n_k / sum n (FedAvg), "uniform" 1/K."""
    if weighting not in WEIGHTINGS:
        raise ValueError(f"weighting must be one of {WEIGHTINGS}, got {weighting!r}")
    counts = [float(u.num_train) for u in uploads] if weighting == "samples" else None
    return normalised_weights(counts, len(uploads))


def weighted_average(states: Sequence[StateDict], weights: torch.Tensor) -> dict[str, torch.Tensor]:
    """sum_k w_k * state_k per key, computed in float64 and cast back to each key's dtype (integer
    buffers such as num_batches_tracked are rounded). Outputs are new, contiguous tensors."""
    if not states:
        raise ValueError("need at least one state dict to average")
    keys = list(states[0])
    if any(set(s) != set(keys) for s in states[1:]):
        raise ValueError("the state dicts to average have different keys")
    w = torch.as_tensor(weights, dtype=torch.float64)
    out = {}
    for key in keys:
        ref = states[0][key]
        stack = torch.stack([s[key].detach().to(ref.device, torch.float64) for s in states])
        mean = torch.tensordot(w.to(ref.device), stack, dims=1)
        out[key] = (mean if ref.is_floating_point() else mean.round()).to(ref.dtype).contiguous()
    return out


def parameter_distance(a: StateDict, b: StateDict, keys: Sequence[str]) -> float:
    """Euclidean distance between two models over `keys`, all tensors flattened into one vector."""
    return float(sum(((a[k].double() - b[k].double()) ** 2).sum() for k in keys) ** 0.5)


def as_tensors(params: Any) -> Any:
    """Params as torch tensors (a result that went through numpy, e.g. a privacy filter, comes back as arrays).
    What cannot be a tensor (a string, an array of objects) is left as it is, and so are params that are not a
    dict: the upload checks (prrfl.server.checks.params_problem) refuse them with the key and the reason."""
    return {k: as_tensor(v) for k, v in params.items()} if isinstance(params, Mapping) else params


def as_tensor(value: Any) -> Any:
    try:
        return torch.from_numpy(np.ascontiguousarray(value)) if isinstance(value, np.ndarray) else torch.as_tensor(value)
    except (TypeError, ValueError, RuntimeError):
        return value


def add_difference(difference: Mapping[str, torch.Tensor], sent: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Full weights from a site's difference to what it was `sent`, in the sent tensors' dtype and device."""
    return {k: (sent[k] + d.to(sent[k].device)).to(sent[k].dtype) for k, d in difference.items()}


def local_batchnorm_keys(model: nn.Module) -> set[str]:
    """The one rule for what FedBN (and PFA, and PRR's deputy) keeps at each site: every entry of the model's
    BatchNorm layers, found by layer type (`prrfl.algorithms.pfa.batchnorm_keys`: affine weight and bias,
    running statistics)."""
    return pfa.batchnorm_keys(model)


def as_uploads(states: Mapping[str, StateDict], num_samples: Mapping[str, int]) -> list[Upload]:
    """The sites as `Upload`s, in the given order, for `site_weights` (a missing count is 0)."""
    return [Upload(site=c, params=dict(s), num_train=int(num_samples.get(c, 0)), class_counts=[]) for c, s in states.items()]


class Aggregator:
    """Base of the aggregators: site -> its new state dict, from every site's state dict and size.

    `weighting`: "samples" weights site k by n_k / sum n; "uniform" by 1/K.
    """

    def __init__(self, weighting: Weighting = "samples"):
        if weighting not in WEIGHTINGS:
            raise ValueError(f"weighting must be one of {WEIGHTINGS}, got {weighting!r}")
        self.weighting = weighting

    def aggregate_states(
        self, states: Mapping[str, StateDict], num_samples: Mapping[str, int], round_idx: int, num_rounds: int
    ) -> dict[str, dict[str, torch.Tensor]]:
        """site -> its new state dict, from every site's state dict (same keys) and training-set size."""
        raise NotImplementedError

    def output_meta(self, round_idx: int, num_rounds: int) -> dict[str, Any]:
        """Meta added to every output of the round (none by default)."""
        return {}

    def kept(self) -> set[str]:
        """The keys that stay at each site (`kept_keys`; none by default). ValueError while they are unknown."""
        kept = getattr(self, "kept_keys", set())
        if kept is None:
            raise ValueError(
                f"{type(self).__name__} does not know which keys stay at the sites: give them, or call use_model(model) "
                "(PersonalizedFedAvg does, with its model)"
            )
        return kept

    def weights(self, states: Mapping[str, StateDict], num_samples: Mapping[str, int]) -> torch.Tensor:
        """Normalised float64 site weights, in the order of `states` (`site_weights`)."""
        if self.weighting == "samples":
            missing = [c for c in states if c not in num_samples]
            if missing:
                raise ValueError(f"weighting='samples' needs the training-set size of {missing}")
        return site_weights(as_uploads(states, num_samples), self.weighting)


class FedAvg(Aggregator):
    """Every site gets the same weighted average (`weighted_average`)."""

    def aggregate_states(self, states, num_samples, round_idx, num_rounds):
        average = weighted_average(list(states.values()), self.weights(states, num_samples))
        return {c: {k: v.clone() for k, v in average.items()} for c in states}


class FedBN(Aggregator):
    """FedAvg with `local_keys` kept at each site: its BatchNorm layers (`local_batchnorm_keys` of the model).
    A key of `local_keys` that a site does not send (prrfl's sites never send BatchNorm) is simply not there
    to keep."""

    def __init__(self, weighting: Weighting = "samples", local_keys: Iterable[str] = ()):
        super().__init__(weighting)
        self.local_keys = sorted(local_keys)
        self.kept_keys: set[str] | None = set(self.local_keys)  # what stays at each site

    def aggregate_states(self, states, num_samples, round_idx, num_rounds):
        keys = list(next(iter(states.values())))
        local = self.kept()
        shared = [k for k in keys if k not in local]
        average = (
            weighted_average([{k: s[k] for k in shared} for s in states.values()], self.weights(states, num_samples)) if shared else {}
        )
        return {c: {k: average[k].clone() if k in average else s[k].detach().clone() for k in keys} for c, s in states.items()}


class Fourier(Aggregator):
    """Progressive Fourier Aggregation (PRR, TMI 2022): `prrfl.algorithms.pfa.pfa_aggregate` with the box
    half-width r of `pfa_threshold(round_idx, num_rounds, r0, r1, schedule)`.

    Inside the low-frequency box of each weight's centred spectrum the sites share the weighted average
    amplitude (and phase, for components="amplitude_phase"; "amplitude" is the MICCAI PRR-FL variant);
    outside, each site keeps its own. BatchNorm keys (`bn_keys`: `local_batchnorm_keys` of the model; ()
    when the sites never send BatchNorm) and `skip` patterns stay at the site; the classifier
    (`classifier_key`: a key, or several such as the branches of an ASPP head; default the last 2-D weight)
    is mixed row by row, one class per row (`classifier_rowwise`). `r` holds the last aggregation's r; every
    output carries it as meta[PFA_R].
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
        bn_keys: Iterable[str] = (),
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
        self.bn_keys = sorted(bn_keys)
        self.kept_keys: set[str] | None = set(self.bn_keys)  # what stays at each site
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
            bn_keys=self.kept(),
            skip=self.skip,
        )
        return dict(zip(states, mixed))

    def output_meta(self, round_idx: int, num_rounds: int) -> dict[str, Any]:
        return {PFA_R: self.threshold(round_idx, num_rounds)}
