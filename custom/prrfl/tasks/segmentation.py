"""What every slice-wise segmentation task shares: a class index per pixel, metrics per volume.

* statistics: voxels per class of the training split (the counts CPA's conjoint mask and FedeAMC's
  weights use; the authors' segmentation code hard-codes the same voxel counts);
* loss: Dice of the foreground classes (MONAI) + a per-pixel classification term, 1:1 (the TMI
  paper); cross entropy unless an imbalance method passes its own term (CPA, focal, ...);
* prototypes: masked average pooling of the feature map per class (`masked_class_embeddings`);
* metrics: Dice and IoU of the foreground (MONAI), computed on each whole volume from its slices,
  then averaged over the volumes of the split ("dice", "iou"), and on each slice, averaged over the
  slices of the split ("slice_dice", "slice_iou"; a slice without foreground in truth and prediction
  scores 100, with foreground predicted on it 0): `VolumeOverlap`.
"""

from __future__ import annotations

from typing import Any, Literal

import numpy as np
import torch
import torch.nn.functional as F
from monai.losses import DiceLoss
from monai.metrics import compute_dice, compute_iou

from prrfl.tasks.contract import Split, Task

Pooling = Literal["area", "sum"]
POOLINGS: tuple[str, ...] = ("area", "sum")


def masked_class_embeddings(
    features: torch.Tensor, masks: torch.Tensor, num_classes: int, pooling: Pooling = "area"
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per image and class, the feature map [B, D, h, w] pooled under the class's mask [B, H, W]
    (nearest-resized to h x w): -> (vectors [M, D], classes [M]).

    "area": sum_p f_p [m_p = c] / sum_p [m_p = c], one vector per (image, class present in the
    image): the masked average. "sum": the authors' segmentation code, sum_p f_p [m_p = c] / (h w)
    for every (image, class), present or not: it scales with the class's area, and an image without
    the class adds a zero vector to its prototype."""
    if pooling not in POOLINGS:
        raise ValueError(f"pooling must be one of {POOLINGS}, got {pooling!r}")
    if features.ndim != 4 or masks.ndim != 3 or masks.shape[0] != features.shape[0]:
        raise ValueError(f"need features [B, D, h, w] and masks [B, H, W], got {tuple(features.shape)} and {tuple(masks.shape)}")
    b, d, h, w = features.shape
    small = F.interpolate(masks[:, None].float(), size=(h, w), mode="nearest")[:, 0].long()
    onehot = F.one_hot(small, num_classes).permute(0, 3, 1, 2).to(features.dtype)  # [B, C, h, w]
    sums = torch.einsum("bchw,bdhw->bcd", onehot, features)  # [B, C, D]
    classes = torch.arange(num_classes, device=features.device).expand(b, num_classes)
    if pooling == "sum":
        return (sums / (h * w)).reshape(-1, d), classes.reshape(-1)
    area = onehot.sum(dim=(2, 3))  # [B, C]
    present = area > 0
    return (sums / area.clamp(min=1)[..., None])[present], classes[present]


def overlap(pred: torch.Tensor, true: torch.Tensor, num_classes: int) -> tuple[torch.Tensor, torch.Tensor]:
    """MONAI's Dice and IoU of class-index masks [N, *spatial], one value per leading entry, the
    foreground classes averaged; an entry without foreground in truth and prediction scores 1."""
    dims = (0, pred.ndim, *range(1, pred.ndim))  # [N, *spatial, C] -> [N, C, *spatial]
    p, t = F.one_hot(pred, num_classes).permute(*dims), F.one_hot(true, num_classes).permute(*dims)
    dice = compute_dice(p, t, include_background=False, ignore_empty=False).mean(dim=1)
    iou = compute_iou(p, t, include_background=False, ignore_empty=False).mean(dim=1)
    return dice, iou


class VolumeOverlap:
    """Streaming Dice and IoU per volume and per slice. The slices of a volume must come together (the
    prepared splits keep each case's slices in order); memory is one volume's predicted and true masks."""

    def __init__(self, num_classes: int, groups: torch.Tensor | None):
        self.num_classes = num_classes
        self.groups = groups.cpu() if groups is not None else None
        self.done: set[int] = set()
        self.current: int | None = None
        self.pred: list[torch.Tensor] = []
        self.true: list[torch.Tensor] = []
        self.dice: list[torch.Tensor] = []
        self.iou: list[torch.Tensor] = []
        self.slice_sums = torch.zeros(2, dtype=torch.float64)  # per-slice Dice and IoU, summed
        self.slices = 0

    def update(self, logits: torch.Tensor, targets: torch.Tensor, index: slice) -> None:
        pred, true = logits.argmax(dim=1).cpu(), targets.cpu()
        dice, iou = overlap(pred, true, self.num_classes)
        self.slice_sums += torch.stack([dice.double().sum(), iou.double().sum()])
        self.slices += len(pred)
        groups = self.groups[index] if self.groups is not None else torch.arange(index.start, index.stop)
        for g in torch.unique_consecutive(groups).tolist():
            rows = groups == g
            if g != self.current:
                self._flush()
                if g in self.done:
                    raise ValueError(f"the slices of volume {g} are not contiguous in the split")
                self.current = g
            self.pred.append(pred[rows])
            self.true.append(true[rows])

    def _flush(self) -> None:
        if self.current is None:
            return
        # one volume as [1, S, H, W]: MONAI's overlap over all its voxels, foreground classes averaged
        dice, iou = overlap(torch.cat(self.pred)[None], torch.cat(self.true)[None], self.num_classes)
        self.dice.append(dice[0])
        self.iou.append(iou[0])
        self.done.add(self.current)
        self.current, self.pred, self.true = None, [], []

    def compute(self) -> dict[str, float]:
        self._flush()
        if not self.dice:
            raise ValueError("cannot compute metrics on an empty split")
        slice_dice, slice_iou = (100.0 * self.slice_sums / self.slices).tolist()
        return {
            "dice": 100.0 * float(torch.stack(self.dice).mean()),
            "iou": 100.0 * float(torch.stack(self.iou).mean()),
            "slice_dice": slice_dice,
            "slice_iou": slice_iou,
        }


class SegmentationTask(Task):
    """Targets are masks [N, H, W] of class indices (0 = background); samples are 2-D slices whose
    `Split.groups` name their volume. A subclass sets `image_size` (the slices' side) and may set
    `prototype_pooling` ("area", or "sum" for the authors' unnormalised pooling)."""

    metric_names = ("dice", "iou", "slice_dice", "slice_iou")
    # the papers' tables (TMI Table III) average over slices: those columns first, the volumes' beside them
    table_metrics = ("slice_dice", "slice_iou", "dice", "iou")
    protocol_metrics = ("dice",)
    table_note = (
        "Dice and IoU per slice: each test slice's overlap of the foreground, averaged over the slices of the site; "
        "a slice without foreground in the truth and the prediction counts 100, one with foreground predicted on it "
        "and none in the truth 0, so a model that predicts nothing still scores the share of empty slices. Dice and "
        "IoU per volume: each test volume's overlap over all its voxels, averaged over the volumes of the site."
    )
    sample_noun = "slices"
    eval_batch_size = 32
    image_size: int
    prototype_pooling: Pooling = "area"

    def __init__(self, data_cfg):
        super().__init__(data_cfg)
        # the authors' Dice: 1 - mean over images of (2 sum p q + 1) / (sum p + sum q + 1), foreground only
        self.dice_loss = DiceLoss(include_background=False, to_onehot_y=True, softmax=True, smooth_nr=1.0, smooth_dr=1.0)

    max_examples = 3

    @torch.no_grad()
    def examples(self, model: torch.nn.Module, split: Split) -> dict[str, Any] | None:
        """For the first `max_examples` volumes of the split, the slice with the largest foreground:
        the slice (uint8), its true mask and the model's predicted mask (the report draws them as
        contours, in the style of the TMI paper's Fig. 4)."""
        groups = split.groups if split.groups is not None else torch.arange(len(split), device=split.targets.device)
        rows = []
        for g in torch.unique_consecutive(groups)[: self.max_examples].tolist():
            members = torch.nonzero(groups == g).flatten()
            area = split.targets[members].flatten(1).ne(0).sum(dim=1)
            rows.append(int(members[int(area.argmax())]))
        if not rows:
            return None
        index = torch.tensor(rows, device=split.targets.device)
        was_training = model.training
        model.eval()
        inputs, targets = self.eval_transform(split.images[index], split.targets[index])
        logits, _ = model(inputs)
        model.train(was_training)
        return {
            "image": split.images[index, 0].cpu().numpy().astype(np.uint8),
            "truth": targets.cpu().numpy().astype(np.uint8),
            "prediction": logits.argmax(dim=1).cpu().numpy().astype(np.uint8),
            "volume": groups[index].cpu().numpy(),
        }

    def new_metric(self, split: Split) -> VolumeOverlap:
        return VolumeOverlap(self.num_classes, split.groups)

    def class_counts(self, split: Split) -> list[int]:
        return torch.bincount(split.targets.reshape(-1).long().cpu(), minlength=self.num_classes).tolist()

    def units_per_sample(self) -> int:
        return self.image_size * self.image_size

    def loss(self, logits: torch.Tensor, targets: torch.Tensor, class_term: torch.Tensor | None = None) -> torch.Tensor:
        term = F.cross_entropy(logits, targets) if class_term is None else class_term
        return self.dice_loss(logits, targets[:, None]) + term

    def class_embeddings(self, embedding: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return masked_class_embeddings(embedding, targets, self.num_classes, self.prototype_pooling)
