"""The task contract: every data set exports the same names, so every method and runner works on it.

A task owns everything that depends on its data: the model it trains (`build_model`), its sites'
splits (`load_site`), how a split becomes batches (`train_batches` with augmentation applied
jointly to an image and its spatial target, `eval_batches`), its metrics computed while streaming
over a split (`evaluate`), the statistics a site reports and how the server checks them
(`class_counts`, `stats_problem`), its supervised loss (`loss`, into which an imbalance method
plugs its per-sample term) and how an embedding is pooled per class for prototypes
(`class_embeddings`). Methods, the site loop, the FLARE glue and the report read only these names.
`ClassificationTask` and `SegmentationTask` implement the parts that depend on the kind of target.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Protocol

import torch

from prrfl.config import config_error
from prrfl.data.augment import to_device
from prrfl.data.manifest import MANIFEST_NAME


def is_count(value: Any) -> bool:
    """A non-negative integer (not a bool) that a torch.long can hold."""
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**63


@dataclass
class Split:
    images: torch.Tensor  # stored inputs, e.g. uint8 [N, C, H, W], on the training device
    targets: torch.Tensor  # int64 [N] class indices, or [N, H, W] masks of class indices
    groups: torch.Tensor | None = None  # int64 [N]: the volume each slice belongs to (None: samples stand alone)

    def __len__(self) -> int:
        return int(self.targets.shape[0])

    @classmethod
    def pooled(cls, splits: list[Split]) -> Split:
        """The splits of several sites as one (on the first split's device): samples in order, volume
        numbers made distinct across splits, so a volume never merges with another site's."""
        if not splits:
            raise ValueError("cannot pool an empty list of splits")
        device = splits[0].targets.device
        groups = None
        if any(s.groups is not None for s in splits):
            offset, parts = 0, []
            for s in splits:  # volume numbers are >= 0
                g = (s.groups if s.groups is not None else torch.arange(len(s))).to(device)
                parts.append(g + offset)
                offset += int(g.max()) + 1 if len(s) else 0
            groups = torch.cat(parts)
        return cls(torch.cat([s.images.to(device) for s in splits]), torch.cat([s.targets.to(device) for s in splits]), groups)


@dataclass
class SiteData:
    cohort: str
    train: Split
    valid: Split
    test: Split
    class_counts: list[int]  # the task's statistics of the training split (Task.class_counts)

    @property
    def num_train(self) -> int:
        return len(self.train)

    def split(self, name: str) -> Split:
        if name not in ("train", "valid", "test"):
            raise ValueError(f"unknown split '{name}', expected train, valid or test")
        return getattr(self, name)


class StreamingMetric(Protocol):
    """Metrics accumulated batch by batch over a split, in the split's order."""

    def update(self, logits: torch.Tensor, targets: torch.Tensor, index: slice) -> None: ...

    def compute(self) -> dict[str, float]: ...


class MissingCohort(FileNotFoundError):
    """A prepared data folder without the site's cohort."""

    def __init__(self, root: Path, cohort: str, available: list[str]):
        super().__init__(f"{root} holds no prepared cohort '{cohort}' (it holds {available})")
        self.root, self.cohort, self.available = Path(root), cohort, available


# The job profiles every task states its settings for (Task.profiles): "quick", the committed <task>_<method> jobs
# that run in minutes on a laptop; "bench", the benchmark's (`prrfl sweep --profile bench`); "paper", the paper's.
PROFILE_NAMES = ("quick", "bench", "paper")


class Task:
    """Base of a task package's main class."""

    name: ClassVar[str]
    num_classes: ClassVar[int]
    class_names: ClassVar[tuple[str, ...]]
    # the classes spelled out for a reader (class_names order) where class_names are a dataset's codes ("mel"): the
    # model card and `prrfl predict`'s output name both; empty: the class names are already words
    class_long_names: ClassVar[tuple[str, ...]] = ()
    site_names: ClassVar[tuple[str, ...]]  # the federation's cohorts, in FLARE site order
    extra_cohorts: ClassVar[tuple[str, ...]] = ()  # other cohorts a site may state in its settings (e.g. I2CVB)
    ood_cohort: ClassVar[str | None] = None  # evaluated at the end, never trained on
    ood_scored_by: ClassVar[str | None] = None  # the cohort whose best model the report scores on it
    paper_table: ClassVar[str] = "per-site results"  # the paper's name of the per-site table, for the report
    metric_names: ClassVar[tuple[str, ...]]  # the task's main metrics, the primary one (selection, DET) first
    table_metrics: ClassVar[tuple[str, ...]]  # the test metrics of the per-site tables, in their order
    protocol_metrics: ClassVar[tuple[str, ...]]  # of FCA's generalization/specialization protocol (prrfl.crosseval)
    table_note: ClassVar[str] = ""  # what a reader of the per-site table must know about its metrics (the report prints it)
    sample_noun: ClassVar[str] = "images"  # what num_train counts, for messages
    eval_batch_size: ClassVar[int] = 64  # samples per evaluation chunk: bounds a site's memory (benchmarks/memory.py)
    profiles: ClassVar[dict[str, dict[str, Any]]]  # PROFILE_NAMES -> the job settings (RunConfig fields) of that profile
    prediction: ClassVar[str]  # what `prrfl predict` takes and writes for this task: a key of prrfl.predict.PREDICTORS

    def __init__(self, data_cfg: dict[str, Any]):
        self.data_cfg = dict(data_cfg)

    def check_data_ranges(self, rules: dict[str, tuple[bool, str]]) -> None:
        """Data options of the right type that would still fail once a site builds its data: option -> (whether its
        value is fine, what is expected); the first that is not is a ConfigError naming `data.<option>`."""
        for key, (ok, expected) in rules.items():
            if not ok:
                raise config_error(f"{self.name} data option '{key}'", expected, self.data_cfg[key], f"data.{key}")

    @classmethod
    def package(cls) -> str:
        """The task's package (prrfl.tasks.<task>): its data readers, synthetic generator and preparation, and its
        data command line (`python -m <package> ...`)."""
        return cls.__module__.rpartition(".")[0]

    @property
    def primary_metric(self) -> str:
        return self.metric_names[0]

    @property
    def recorded_metrics(self) -> tuple[str, ...]:
        """Every metric `evaluate` returns: metric_names, and what a kind of task adds (per-class values)."""
        return self.metric_names

    # ----- model and data ----------------------------------------------------------------
    def build_model(self) -> torch.nn.Module:
        """The task's network: forward(x) -> (logits [B, C, ...], embedding), and a `classifier_key`
        attribute naming the state-dict key of its last classifier layer."""
        raise NotImplementedError

    def given_root(self, data_root: str) -> Path:
        """A site's own prepared data folder, which must hold the manifest that preparation writes."""
        root = Path(data_root)
        if not root.is_dir():  # e.g. deleted or unmounted during a run: preparing would not be the fix
            raise FileNotFoundError(f"data root {root} does not exist (any more): check that the folder is there and mounted")
        if not (root / MANIFEST_NAME).exists():
            raise FileNotFoundError(
                f"data root {root} has no {MANIFEST_NAME}: prepare the raw data first "
                f"(python -m {self.package()} prepare --raw <raw> --out <root>)"
            )
        return root

    @property
    def cohorts(self) -> tuple[str, ...]:
        """Every cohort a site of this task may be: the federation's, its out-of-distribution one, and extras."""
        return (*self.site_names, *((self.ood_cohort,) if self.ood_cohort else ()), *self.extra_cohorts)

    def cohort_dir(self, root: Path, cohort: str) -> Path:
        """The prepared folder of `cohort` in `root` (`<root>/<cohort>/`); MissingCohort names what root holds."""
        folder = Path(root) / cohort
        if not folder.is_dir():
            raise MissingCohort(root, cohort, sorted(p.name for p in Path(root).iterdir() if p.is_dir() and not p.name.startswith(".")))
        return folder

    def prepared_root(self, data_root: str | None, workers: int = 1) -> Path:
        """A site's prepared data: `data_root` when given (checked), else the task's embedded synthetic
        data, built into the cache on first use (`workers` > 1 only from a plain command line, not
        inside a FLARE site process)."""
        raise NotImplementedError

    def load_site(self, cohort: str, device: torch.device, data_root: str | None) -> SiteData:
        raise NotImplementedError

    def site_data(self, cohort: str, train: Split, valid: Split, test: Split) -> SiteData:
        return SiteData(cohort=cohort, train=train, valid=valid, test=test, class_counts=self.class_counts(train))

    # ----- batches ------------------------------------------------------------------------
    def train_transform(self, images: torch.Tensor, targets: torch.Tensor, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        """Stored samples -> augmented model inputs and their targets (a spatial target is moved
        with its image). `generator` lives on the CPU."""
        raise NotImplementedError

    def eval_transform(self, images: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        raise NotImplementedError

    def train_batches(self, split: Split, batch_size: int, generator: torch.Generator) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """One shuffled pass over `split`. A last batch of one sample would break BatchNorm in
        training mode: it joins the previous batch. Lazy: each batch is drawn (and augmented, from
        `generator`) when the loop asks for it."""
        n = len(split)
        order = to_device(torch.randperm(n, generator=generator), split.targets.device)
        bounds = list(range(0, n, batch_size))
        if len(bounds) > 1 and n - bounds[-1] == 1:
            bounds.pop()
        for i, start in enumerate(bounds):
            idx = order[start : bounds[i + 1] if i + 1 < len(bounds) else n]
            yield self.train_transform(split.images[idx], split.targets[idx], generator)

    def eval_batches(self, split: Split, batch_size: int | None = None) -> Iterator[tuple[torch.Tensor, torch.Tensor, slice]]:
        """The split in order, in chunks of `batch_size` (default `eval_batch_size`): (inputs,
        targets, the chunk's positions in the split)."""
        size = batch_size or self.eval_batch_size
        for start in range(0, len(split), size):
            index = slice(start, min(start + size, len(split)))
            yield (*self.eval_transform(split.images[index], split.targets[index]), index)

    # ----- evaluation ---------------------------------------------------------------------
    def new_metric(self, split: Split) -> StreamingMetric:
        raise NotImplementedError

    @torch.no_grad()
    def evaluate(self, model: torch.nn.Module, split: Split, batch_size: int | None = None) -> dict[str, float]:
        """The task's metrics of `model` on `split` (percent), streaming over chunks of the split:
        memory is bounded by one chunk plus what the metric keeps. The model's mode is restored."""
        was_training = model.training
        model.eval()
        metric = self.new_metric(split)
        try:
            for inputs, targets, index in self.eval_batches(split, batch_size):
                logits, _ = model(inputs)
                metric.update(logits, targets, index)
        finally:
            model.train(was_training)
        return metric.compute()

    def preprocessing(self) -> dict[str, Any]:
        """How a raw input becomes the model's input, for the model card written beside every best model
        (what inference must repeat): the input kind, image size, channels and the steps in order."""
        raise NotImplementedError

    def examples(self, model: torch.nn.Module, split: Split) -> dict[str, Any] | None:
        """A few samples of `split` with the model's output, as numpy arrays, for figures (the report's
        segmentation overlays); None when the task draws none."""
        return None

    # ----- statistics, loss, prototypes -------------------------------------------------------
    def class_counts(self, split: Split) -> list[int]:
        """The per-class statistics a site reports for its training split."""
        raise NotImplementedError

    def stats_problem(self, num_train: Any, class_counts: Any) -> str | None:
        """None when a site's reported statistics are consistent, else a one-line reason (server side)."""
        if not is_count(num_train):
            return f"num_train must be a non-negative integer, got {num_train!r:.60}"
        counts = class_counts
        if not isinstance(counts, list) or len(counts) != self.num_classes or not all(is_count(c) for c in counts):
            return f"class_counts must be {self.num_classes} non-negative integers, got {counts!r:.200}"
        units = self.units_per_sample()
        if sum(counts) != num_train * units:
            return f"class_counts sum to {sum(counts)}, expected num_train {num_train} x {units} per sample = {num_train * units}"
        return None

    def units_per_sample(self) -> int:
        """What one training sample adds to the sum of class_counts (1 image, or the pixels of a slice)."""
        return 1

    def loss(self, logits: torch.Tensor, targets: torch.Tensor, class_term: torch.Tensor | None = None) -> torch.Tensor:
        """The task's supervised loss. `class_term`: an imbalance method's per-sample classification
        loss (already reduced), which takes the place of the task's cross-entropy term; the task adds
        its other terms (e.g. Dice for segmentation) to it."""
        raise NotImplementedError

    def class_embeddings(self, embedding: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The model's embedding of a batch -> (vectors [M, D], their classes [M]) from which class
        prototypes are averaged. Differentiable (FedProto regularises them)."""
        raise NotImplementedError

    def cohort_of(self, site_name: str) -> str:
        """FLARE site name -> cohort: the cohort's own name, or site-N -> N-th cohort. (A site named
        otherwise states its cohort in its local config.)"""
        if site_name in self.site_names:
            cohort = site_name
        elif site_name.startswith("site-") and site_name[5:].isdigit() and 1 <= int(site_name[5:]) <= len(self.site_names):
            cohort = self.site_names[int(site_name[5:]) - 1]
        else:
            raise ValueError(
                f"cannot map FLARE site '{site_name}' to a {self.name} cohort: name it one of {list(self.site_names)}, "
                f"use site-1..site-{len(self.site_names)}, or set 'cohort' in the site's local config"
            )
        return cohort
