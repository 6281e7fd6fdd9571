"""Evaluation metrics (scikit-learn), on the 0-100 scale the papers report.

Classification: macro F1 and macro one-vs-rest AUC (the papers' F1/AUC), accuracy and balanced
accuracy (bACC). Segmentation: Dice and IoU of the foreground.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterable, Sequence

import numpy as np
from sklearn.metrics import accuracy_score, balanced_accuracy_score, f1_score, recall_score, roc_auc_score

LABELS = {
    "f1": "F1",
    "auc": "AUC",
    "acc": "ACC",
    "bacc": "bACC",
    "bauc": "bAUC",
    "dice": "Dice",
    "iou": "IoU",
    "slice_dice": "Dice/slice",
    "slice_iou": "IoU/slice",
}


def label(metric: str) -> str:
    """How tables and figures name a metric ("dice" -> "Dice")."""
    return LABELS.get(metric, metric.upper())


def nanmean(values: Iterable[float]) -> float:
    """The mean of the values that are not NaN; NaN when there are none."""
    finite = [v for v in values if not math.isnan(v)]
    return sum(finite) / len(finite) if finite else math.nan


def download_drops(history: Iterable[dict], metric: str) -> dict[int, tuple[float, float]]:
    """Retrogress in a site's history: communication round r (>= 1) -> (before, after), the test metric of
    the last local epoch of round r-1 (just before communication) and right after the download of round r.
    The drop is before - after. Needs the per-epoch test records (eval_test_every_epoch)."""
    before: dict[int, tuple[int, float]] = {}  # round -> (epochs_done, value) of its last epoch
    after: dict[int, float] = {}
    for h in history:
        if h["kind"] == "epoch" and h["epochs_done"] >= before.get(h["round"], (-1, 0.0))[0]:
            before[h["round"]] = (h["epochs_done"], h["test"][metric])
        elif h["kind"] == "download":
            after[h["round"]] = h["test"][metric]
    return {rnd: (before[rnd - 1][1], after[rnd]) for rnd in sorted(after) if rnd - 1 in before}


def shared_model_drops(history: Iterable[dict], metric: str) -> dict[int, tuple[float, float]]:
    """Retrogress of the shared model, for a method that uploads another model than the one it reports
    (PRR's deputy; see `download_drops` for the reported one): communication round r (>= 1) -> (before,
    after), the test metric of the model uploaded at the end of round r-1 and of the same model right
    after the download of round r overwrote it. Empty when the history has no `shared_test` records."""
    uploaded = {h["round"]: h["shared_test"][metric] for h in history if h["kind"] == "round" and "shared_test" in h}
    received = {h["round"]: h["shared_test"][metric] for h in history if h["kind"] == "download" and "shared_test" in h}
    return {rnd: (uploaded[rnd - 1], received[rnd]) for rnd in sorted(received) if rnd - 1 in uploaded}


def classification_metrics(probs: np.ndarray, labels: np.ndarray, num_classes: int, class_names: Sequence[str] = ()) -> dict[str, float]:
    """probs [N, C] softmax outputs, labels [N] ints -> {"f1", "auc", "acc", "bacc"} in percent, and with
    `class_names` each class's recall as "recall_<name>" (NaN for a class absent from `labels`).

    AUC is the unweighted mean of the one-vs-rest AUCs over the classes present in `labels` (with at
    least one negative too); a split where no class qualifies gives NaN rather than a made-up value.
    """
    probs = np.asarray(probs, dtype=np.float64)
    labels = np.asarray(labels)
    if probs.ndim != 2 or probs.shape[0] != labels.shape[0] or probs.shape[1] != num_classes:
        raise ValueError(f"probs must be [N, {num_classes}] with N = len(labels); got {probs.shape} and {labels.shape}")
    if labels.size == 0:
        raise ValueError("cannot compute metrics on an empty split")
    preds = probs.argmax(axis=1)
    classes = list(range(num_classes))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # sklearn warns on classes absent from y_true; the macro rule is explicit
        f1 = f1_score(labels, preds, labels=classes, average="macro", zero_division=0)
        bacc = balanced_accuracy_score(labels, preds)
        recall = recall_score(labels, preds, labels=classes, average=None, zero_division=np.nan) if class_names else ()
    if class_names and len(class_names) != num_classes:
        raise ValueError(f"class_names must name the {num_classes} classes, got {list(class_names)}")
    return {
        "f1": 100.0 * f1,
        "auc": 100.0 * ovr_auc(probs, labels, num_classes),
        "acc": 100.0 * accuracy_score(labels, preds),
        "bacc": 100.0 * bacc,
        **{f"recall_{name}": 100.0 * float(r) for name, r in zip(class_names, recall)},
    }


def ovr_auc(probs: np.ndarray, labels: np.ndarray, num_classes: int) -> float:
    """Macro one-vs-rest ROC AUC over the classes that have both positives and negatives."""
    aucs = []
    for c in range(num_classes):
        positives = labels == c
        if positives.all() or not positives.any():
            continue
        aucs.append(roc_auc_score(positives, probs[:, c]))
    return float(np.mean(aucs)) if aucs else math.nan


def dice_iou(pred_mask: np.ndarray, true_mask: np.ndarray) -> dict[str, float]:
    """Foreground Dice and IoU in percent (both 100 when both masks are empty)."""
    pred = np.asarray(pred_mask, dtype=bool)
    true = np.asarray(true_mask, dtype=bool)
    inter = np.logical_and(pred, true).sum()
    total = pred.sum() + true.sum()
    union = np.logical_or(pred, true).sum()
    if total == 0:
        return {"dice": 100.0, "iou": 100.0}
    return {"dice": 100.0 * 2 * inter / total, "iou": 100.0 * inter / union}


def improves(best: float | None, score: float, round_idx: int, select_from_round: int) -> bool:
    """Whether a round's validation `score` becomes the new best: the round is eligible (>= select_from_round),
    the score is a number, and it beats the best so far (None: none yet) strictly, so the first maximum stays."""
    return round_idx >= select_from_round and not math.isnan(score) and (best is None or score > best)
