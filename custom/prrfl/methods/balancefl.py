"""BalanceFL (Shuai et al., "BalanceFL: Addressing Class Imbalance in Long-Tail Federated Learning", IPSN 2022), a
competitor of FCA's Table 4: FedAvg whose local update inherits the global model's knowledge of the classes a site
lacks and balances the classes it has."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import torch
import torch.nn.functional as F

from prrfl.methods.fedavg import FedAvg
from prrfl.methods.label_skew import classification_only
from prrfl.methods.method import frozen_copy
from prrfl.methods.view import SiteView
from prrfl.tasks.contract import Split

if TYPE_CHECKING:
    from prrfl.messages import Download
    from prrfl.tasks.contract import Task

MissingClasses = Literal["site", "batch"]


def balanced_sample_weights(targets: torch.Tensor, num_classes: int) -> torch.Tensor:
    """Each sample's probability of being drawn so that every class the site holds is drawn alike:
    1 / (|C| n_c) for a sample of class c, n_c the site's count of c and |C| the number of classes it holds."""
    counts = torch.bincount(targets.cpu(), minlength=num_classes).double()
    held = int((counts > 0).sum())
    return 1.0 / (held * counts[targets.cpu()])


class _Rows:
    """The rows `index` of a tensor, gathered only when indexed: a resampled split's images without a copy of them."""

    def __init__(self, tensor: torch.Tensor, index: torch.Tensor):
        self.tensor, self.index = tensor, index.to(tensor.device)

    def __getitem__(self, idx: torch.Tensor) -> torch.Tensor:
        return self.tensor[self.index[idx]]


def balanced_resample(split: Split, num_classes: int, generator: torch.Generator) -> Split:
    """len(split) samples of `split` drawn with replacement by `balanced_sample_weights` (class-balanced sampling)."""
    index = torch.multinomial(balanced_sample_weights(split.targets, num_classes), len(split), replacement=True, generator=generator)
    # the task's batching indexes the images with a batch's positions: _Rows stands for the tensor there
    return Split(images=_Rows(split.images, index), targets=split.targets[index.to(split.targets.device)])


def masked_cross_entropy(logits: torch.Tensor, targets: torch.Tensor, present: torch.Tensor) -> torch.Tensor:
    """Cross entropy over the `present` classes only ([C] bool): the others drop out of the softmax."""
    return F.cross_entropy(logits.masked_fill(~present.to(logits.device), -torch.inf), targets)


def class_columns(logits: torch.Tensor, classes: torch.Tensor) -> torch.Tensor:
    """The logits [B, C] of the `classes` ([C] bool, on the CPU: no wait for a GPU) only."""
    return logits.index_select(1, torch.nonzero(classes.cpu()).flatten().to(logits.device))


def inheritance_distillation(student: torch.Tensor, teacher: torch.Tensor, missing: torch.Tensor, temperature: float) -> torch.Tensor:
    """BalanceFL's knowledge inheritance: batch mean of KL(q_teacher || q_student), q = softmax(logits / T) over the
    `missing` classes only ([C] bool). Zero when fewer than two classes are missing (a softmax over one class is 1)."""
    if int(missing.sum()) < 2:
        return student.sum() * 0.0
    log_s = F.log_softmax(class_columns(student, missing) / temperature, dim=1)
    log_t = F.log_softmax(class_columns(teacher, missing).to(student.dtype) / temperature, dim=1)
    return (log_t.exp() * (log_t - log_s)).sum(dim=1).mean()


def present_entropy(logits: torch.Tensor, present: torch.Tensor) -> torch.Tensor:
    """The entropy of the softmax over the `present` classes, summed over the batch (the authors' code's penalty)."""
    log_p = F.log_softmax(class_columns(logits, present), dim=1)
    return -(log_p.exp() * log_p).sum()


def pooled_class_covariance(embeddings: torch.Tensor, labels: torch.Tensor, num_classes: int) -> torch.Tensor:
    """sum_c n_c Cov_c / sum_c n_c over the classes present, Cov_c the unbiased covariance [D, D] of the class's
    embeddings (0 for a class of one sample), in float64."""
    x = embeddings.detach().double().cpu()
    labels = labels.cpu()
    total = torch.zeros(x.shape[1], x.shape[1], dtype=torch.float64)
    for c in range(num_classes):
        rows = x[labels == c]
        if len(rows) > 1:
            total += len(rows) * torch.cov(rows.T).reshape(x.shape[1], x.shape[1])
    return total / max(len(x), 1)


def covariance_factor(covariance: torch.Tensor) -> torch.Tensor:
    """A with A A^T = covariance (a symmetric positive semi-definite matrix), so that z A^T, z ~ N(0, I), is N(0, covariance)."""
    values, vectors = torch.linalg.eigh(covariance)
    return vectors * values.clamp(min=0).sqrt()


def augmentation_probabilities(class_counts: list[int]) -> torch.Tensor:
    """The probability that a sample of class c has its embedding augmented: 1 - n_c / max_c n_c (the rarer the
    class, the more often; never the most frequent one)."""
    counts = torch.tensor(class_counts, dtype=torch.float64)
    return (1 - counts / counts.max()).clamp(min=0)


@dataclass
class _RoundState:
    """What a site computes at each download: the global model as teacher, and the feature augmentation's noise
    factor [D, D] and per-class probabilities [C] (None without feature augmentation)."""

    teacher: torch.nn.Module
    noise_factor: torch.Tensor | None = None
    augment_probability: torch.Tensor | None = None


class BalanceFL(FedAvg):
    """BalanceFL (Shuai et al., IPSN 2022): FedAvg whose local update has two parts.

    * Knowledge inheritance: the cross entropy is taken over the classes the site holds only (the others drop out of
      its softmax, `masked_cross_entropy`), and the logits of the classes it lacks are distilled from the global model
      it received, lam * mean KL(softmax(z_global / T) || softmax(z / T)) over those classes (`inheritance_distillation`).
    * Inter-class balancing: the local epochs draw their batches class-balanced, with replacement (`balanced_resample`:
      every class the site holds is drawn alike), and the embedding of a sample of class c is augmented with
      probability 1 - n_c / n_max by Gaussian noise N(0, S) before the classifier, S the site's class-count-weighted
      average of per-class covariances of the global model's embeddings (`pooled_class_covariance`); the cross
      entropy is taken on the augmented logits, the distillation on the plain ones.

    Choices: lam = 1 and T = 2 (the authors' configs for all three of their datasets; FCA's code states no setting
    for BalanceFL); the KD is the KL divergence (the code's cross-entropy form differs from it by the teacher's
    entropy, a constant: the same gradients), not scaled by T^2, as the code; the embedding is the classifier's input;
    the teacher is a frozen copy of the download in evaluation mode (the code runs it in training mode, BatchNorm on
    the batch's statistics), and the covariance is computed once per round over the site's training split without
    augmentation; the noise is drawn from the site's generator for each augmented sample (the code cycles through
    500 draws made at the round's start). Everything else is FedAvg's (sample-weighted average of the whole model,
    the global model reported). Options for the authors' code: `missing="batch"` (the classes treated as missing are
    those absent from each batch, the code's `torch.unique(labels)`, rather than the site's), `entropy_weight=0.002`
    (the code subtracts 0.002 x the entropy of the softmax over the present classes, summed over the batch; 0 here);
    ablations: `balanced_sampling`, `feature_augmentation` (docs/authors_code.md §9). Classification only; refused with
    `class_loss=balanced_softmax`: the batches are already class-balanced by sampling, so the balanced softmax of the
    batches' own prior is this masked cross entropy, and the site's prior would correct them a second time.
    """

    name = "balancefl"

    def __init__(
        self,
        cfg,
        task,
        *,
        lam: float = 1.0,
        temperature: float = 2.0,
        balanced_sampling: bool = True,
        feature_augmentation: bool = True,
        missing: MissingClasses = "site",
        entropy_weight: float = 0.0,
        **options: Any,
    ):
        super().__init__(cfg, task, **options)
        if cfg.class_loss != "method":
            raise ValueError(
                f"BalanceFL samples class-balanced batches; class_loss={cfg.class_loss} would correct them for the site's prior "
                "a second time (use class_loss=method)"
            )
        if not (lam >= 0 and temperature > 0 and entropy_weight >= 0) or missing not in ("site", "batch"):
            raise ValueError(
                f"BalanceFL options need lam >= 0, temperature > 0, entropy_weight >= 0 and missing 'site' or 'batch', got "
                f"{lam}, {temperature}, {entropy_weight}, {missing!r}"
            )
        self.lam, self.temperature, self.entropy_weight, self.missing = lam, temperature, entropy_weight, missing
        self.balanced_sampling, self.feature_augmentation = balanced_sampling, feature_augmentation
        self.rounds: dict[str, _RoundState] = {}  # site -> what it computed at its last download

    @classmethod
    def unsupported_reason(cls, task: Task) -> str | None:
        return classification_only("BalanceFL", task)

    @property
    def head(self) -> str:
        return self.classifier_key.rpartition(".")[0]

    def on_download(self, site: SiteView, download: Download, first: bool) -> None:
        super().on_download(site, download, first)
        if download.round >= self.cfg.num_rounds:  # the last aggregate, to score only: no local update follows
            return
        model = site.models[self.upload_role]
        teacher = frozen_copy(self, model.state_dict(), next(model.parameters()).device)
        state = _RoundState(teacher)
        if self.feature_augmentation:
            embeddings, labels = [], []
            with torch.no_grad():
                for inputs, targets, _ in site.task.eval_batches(site.train):
                    embeddings.append(teacher(inputs)[1])
                    labels.append(targets)
            covariance = pooled_class_covariance(torch.cat(embeddings), torch.cat(labels), site.task.num_classes)
            state.noise_factor = covariance_factor(covariance).float().to(embeddings[0].device)
            state.augment_probability = augmentation_probabilities(site.class_counts).to(embeddings[0].device)
        self.rounds[site.name] = state

    def train_batches(self, site: SiteView) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        if not self.balanced_sampling:
            return super().train_batches(site)
        resampled = balanced_resample(site.train, site.task.num_classes, site.generator)
        return site.task.train_batches(resampled, self.cfg.batch_size, site.generator)

    def present_classes(self, site: SiteView, targets: torch.Tensor) -> torch.Tensor:
        """[C] bool, on the CPU: the classes the cross entropy covers; the others are the missing ones. The batch's
        classes are read from the device, once a batch (the code's `torch.unique(labels).tolist()` too)."""
        if self.missing == "batch":
            return torch.bincount(targets.cpu(), minlength=site.task.num_classes) > 0
        return torch.tensor(site.class_counts) > 0

    def augmented_logits(self, site: SiteView, state: _RoundState, embedding: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """The classifier's logits of the embeddings, each augmented with its class's probability."""
        device = embedding.device
        draw = torch.rand(len(targets), generator=site.generator, dtype=torch.float64).to(device)
        chosen = draw < state.augment_probability.to(device)[targets]
        noise = torch.randn(len(targets), embedding.shape[1], generator=site.generator).to(device) @ state.noise_factor.T
        augmented = embedding + noise * chosen.to(embedding.dtype)[:, None]
        return site.models[self.upload_role].get_submodule(self.head)(augmented)

    def losses(self, site, targets, outputs):
        logits, embedding = outputs[self.upload_role]
        state = self.rounds[site.name]
        present = self.present_classes(site, targets)
        trained = self.augmented_logits(site, state, embedding, targets) if state.noise_factor is not None else logits
        loss = self.task.loss(trained, targets, class_term=masked_cross_entropy(trained, targets, present))
        if self.lam > 0 and int((~present).sum()) >= 2 and self.inputs is not None:
            with torch.no_grad():
                teacher = state.teacher(self.inputs)[0]
            loss = loss + self.lam * inheritance_distillation(logits, teacher, ~present, self.temperature)
        if self.entropy_weight > 0:
            loss = loss - self.entropy_weight * present_entropy(logits, present)
        return {self.upload_role: loss}
