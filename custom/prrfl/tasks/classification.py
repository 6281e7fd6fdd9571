"""What every image-classification task shares: one class index per image."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from prrfl.metrics import classification_metrics
from prrfl.tasks.contract import Split, Task


class ClassProbabilities:
    """Streaming classification metrics: keeps the softmax outputs [N, C] of the split (a few
    numbers per image: AUC ranks all of them) and computes macro F1, AUC, accuracy, bACC and each
    class's recall."""

    def __init__(self, num_classes: int, class_names: tuple[str, ...] = ()):
        self.num_classes = num_classes
        self.class_names = class_names
        self.probs: list[torch.Tensor] = []
        self.labels: list[torch.Tensor] = []

    def update(self, logits: torch.Tensor, targets: torch.Tensor, index: slice) -> None:
        self.probs.append(torch.softmax(logits.float(), dim=1).cpu())
        self.labels.append(targets.cpu())

    def compute(self) -> dict[str, float]:
        return classification_metrics(torch.cat(self.probs).numpy(), torch.cat(self.labels).numpy(), self.num_classes, self.class_names)


class ClassificationTask(Task):
    """Targets are class indices [N]; class_counts are images per class; the loss is cross entropy
    (an imbalance method's term replaces it); an image's embedding is its prototype vector."""

    metric_names = ("f1", "auc", "acc", "bacc")
    table_metrics = ("f1", "auc")  # the papers' Table II
    protocol_metrics = ("bacc", "auc")  # FCA's bACC and bAUC (its bAUC: the mean one-vs-rest AUC over the classes present)

    @property
    def recorded_metrics(self) -> tuple[str, ...]:
        return (*self.metric_names, *(f"recall_{name}" for name in self.class_names))

    def new_metric(self, split: Split) -> ClassProbabilities:
        return ClassProbabilities(self.num_classes, self.class_names)

    def class_counts(self, split: Split) -> list[int]:
        return torch.bincount(split.targets.cpu(), minlength=self.num_classes).tolist()

    def loss(self, logits: torch.Tensor, targets: torch.Tensor, class_term: torch.Tensor | None = None) -> torch.Tensor:
        return F.cross_entropy(logits, targets) if class_term is None else class_term

    def class_embeddings(self, embedding: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return embedding, targets
