"""Server math shared by the averaging methods (FedAvg and its relatives): site weights and the
weighted average of state dicts."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Literal, get_args

import torch

from prrfl.algorithms.pfa import normalised_weights
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
