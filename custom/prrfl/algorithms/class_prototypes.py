"""Class prototypes: per-class mean embeddings at a site, and the server's global prototype.

A site's prototype of class c is the mean embedding (input of the last FC) of its class-c samples.
Only these [C, D] means and the class counts travel. The server models the global prototype of
class c as N(mu_c, sigma_c^2) per dimension over the sites' prototypes and sends one sample of it
(TMI 2022, Sec. III-C); the spread keeps gamma from over-trusting a single federation average.
"""

from __future__ import annotations

from typing import Literal

import torch

from prrfl.keys import CLASS_COUNTS, PROTOTYPE_PRESENT, PROTOTYPES

StdKind = Literal["biased", "unbiased"]
STD_KINDS: tuple[str, ...] = ("biased", "unbiased")


class PrototypeAccumulator:
    """Running per-class sums of embeddings, fed batch by batch (no feature is stored).

    Sums are float64 and follow the features' device (moved once, at the first update there).
    """

    def __init__(self, num_classes: int, dim: int):
        if num_classes < 1 or dim < 1:
            raise ValueError(f"need num_classes >= 1 and dim >= 1, got {num_classes} and {dim}")
        self.sums = torch.zeros(num_classes, dim, dtype=torch.float64)
        self.counts = torch.zeros(num_classes, dtype=torch.long)
        self._empty = True  # nothing added yet
        self._range: tuple[torch.Tensor, torch.Tensor] | None = None  # (lowest, highest) label seen on a GPU

    def update(self, features: torch.Tensor, labels: torch.Tensor) -> None:
        """Add features [N, D] (detached) of samples with class indices labels [N]."""
        num_classes, dim = self.sums.shape
        if features.ndim != 2 or features.shape[1] != dim or labels.shape != features.shape[:1]:
            raise ValueError(f"need features [N, {dim}] and labels [N], got {tuple(features.shape)} and {tuple(labels.shape)}")
        labels = labels.long()
        if self.sums.device != features.device:  # made there, not copied, while nothing was added (no wait for a GPU)
            move = (lambda t: torch.zeros_like(t, device=features.device)) if self._empty else (lambda t: t.to(features.device))
            self.sums, self.counts = move(self.sums), move(self.counts)
        self._empty = False
        if not labels.numel():
            return
        if labels.device.type == "cpu":
            self._check(labels.min(), labels.max())
        else:  # on a GPU the range is read at compute(), so that training never waits for the device
            low, high = labels.min(), labels.max()
            self._range = (low, high) if self._range is None else (torch.minimum(self._range[0], low), torch.maximum(self._range[1], high))
            labels = labels.clamp(0, num_classes - 1)  # an index out of range would end the process on a GPU
        self.sums.index_add_(0, labels, features.detach().to(torch.float64))
        self.counts.index_add_(0, labels, torch.ones_like(labels))  # bincount would wait for a GPU (its size)

    def _check(self, low: torch.Tensor, high: torch.Tensor) -> None:
        if low < 0 or high >= self.sums.shape[0]:
            raise ValueError(f"labels must lie in [0, {self.sums.shape[0]}), got {low.item()}..{high.item()}")

    def compute(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(prototypes [C, D] float64, counts [C] long); an absent class has a zero row and count 0. Labels out of
        range fed on a GPU raise here (on the CPU, at once)."""
        if self._range is not None:
            self._check(*self._range)
        return self.sums / self.counts.clamp(min=1)[:, None], self.counts.clone()


def class_prototypes(features: torch.Tensor, labels: torch.Tensor, num_classes: int) -> tuple[torch.Tensor, torch.Tensor]:
    """One-shot `PrototypeAccumulator`: (mean embedding per class [C, D] float64, counts [C])."""
    accumulator = PrototypeAccumulator(num_classes, features.shape[-1])
    accumulator.update(features, labels)
    return accumulator.compute()


def sample_global_prototypes(
    site_protos: torch.Tensor,
    site_present: torch.Tensor | None = None,
    generator: torch.Generator | None = None,
    std: StdKind = "biased",
    std_floor: float = 0.0,
    sample: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Global prototypes [C, D] and which classes have one ([C] bool) from K sites' [K, C, D].

    Per class, over the sites that have it (`site_present` [K, C], default all): mu = mean and
    sigma = std per dimension, then mu + max(sigma, std_floor) * eps with eps ~ N(0, 1) from
    `generator` (drawn for every class, so the stream does not depend on which are present).
    std "biased" divides by the number of sites n (paper), "unbiased" by n - 1 (authors); a class
    held by a single site has sigma 0 either way, so only the floor adds noise to it. The authors
    use unbiased with std_floor = 1. A class no site has is flagged absent with a zero row.
    `sample=False` returns mu (the "avg" global prototype) and draws nothing.
    """
    if site_protos.ndim != 3 or not site_protos.is_floating_point():
        raise ValueError(f"site_protos must be a float [K, C, D] tensor, got {site_protos.dtype} {tuple(site_protos.shape)}")
    if std not in STD_KINDS:
        raise ValueError(f"std must be one of {STD_KINDS}, got {std!r}")
    if not std_floor >= 0:
        raise ValueError(f"std_floor must be non-negative, got {std_floor}")
    if site_present is None:
        site_present = torch.ones(site_protos.shape[:2], dtype=torch.bool)
    if site_present.shape != site_protos.shape[:2]:
        raise ValueError(f"site_present must be [K, C] = {tuple(site_protos.shape[:2])}, got {tuple(site_present.shape)}")
    has = site_present.to(site_protos.device, torch.bool)[..., None]  # [K, C, 1]
    n = has.sum(dim=0).to(site_protos.dtype)  # [C, 1] sites per class
    present = n.squeeze(1) > 0
    mu = torch.where(has, site_protos, 0.0).sum(dim=0) / n.clamp(min=1)  # where: absent rows may hold NaN
    if not sample:
        return mu, present
    divisor = n if std == "biased" else n - 1
    sq_dev = torch.where(has, (site_protos - mu) ** 2, 0.0).sum(dim=0)
    sigma = torch.where(divisor > 0, sq_dev / divisor.clamp(min=1), 0.0).sqrt().clamp(min=std_floor)
    eps = torch.randn(mu.shape, generator=generator, dtype=mu.dtype, device=mu.device)
    return torch.where(present[:, None], mu + sigma * eps, 0.0), present


class PrototypeTracker:
    """A site's per-class mean embeddings over a local epoch, fed batch by batch, as they travel.

    Call `reset()` at the start of each local epoch so the prototypes sent are those of the last epoch (PRR's
    choice), `update(embeddings [N, D], labels [N])` for every training batch, then `meta(class_counts)` for
    the result's meta (prrfl.flare.components.PrototypeTracker.attach puts it into an FLModel).
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

    def meta(self, class_counts) -> dict:
        """PROTOTYPES, PROTOTYPE_PRESENT and CLASS_COUNTS (prrfl.keys) for a result's meta."""
        counts = torch.as_tensor(class_counts, dtype=torch.long).flatten()
        if counts.numel() != self.num_classes or (counts < 0).any():
            raise ValueError(f"class_counts must be {self.num_classes} non-negative integers, got {counts.tolist()}")
        protos, present = self.prototypes()
        return {PROTOTYPES: protos.tolist(), PROTOTYPE_PRESENT: present.tolist(), CLASS_COUNTS: counts.tolist()}
