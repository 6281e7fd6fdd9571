"""Metrics, run configuration, site-local configuration and the results table."""

from __future__ import annotations

import math

import numpy as np
import pytest
from sklearn.metrics import f1_score, roc_auc_score

from prrfl.config import RunConfig
from prrfl.metrics import classification_metrics, dice_iou
from prrfl.summary import results_table


def test_classification_metrics_match_sklearn_and_the_papers_scale():
    rng = np.random.default_rng(0)
    labels = np.array([0, 0, 0, 1, 1, 2, 2, 2, 0, 1])
    probs = rng.dirichlet(np.ones(3), size=10)
    m = classification_metrics(probs, labels, 3)
    assert m["f1"] == pytest.approx(100 * f1_score(labels, probs.argmax(1), average="macro"))
    assert m["auc"] == pytest.approx(100 * roc_auc_score(labels, probs, multi_class="ovr"))
    perfect = np.eye(3)[labels]
    assert classification_metrics(perfect, labels, 3)["f1"] == 100.0


def test_auc_skips_classes_without_positives_and_f1_counts_them_as_zero():
    labels = np.array([0, 0, 1, 1])
    probs = np.array([[0.9, 0.05, 0.05], [0.8, 0.1, 0.1], [0.1, 0.8, 0.1], [0.2, 0.7, 0.1]])
    m = classification_metrics(probs, labels, 3)
    assert m["auc"] == 100.0  # the two present classes, perfectly ranked
    assert m["f1"] == pytest.approx(100 * 2 / 3)  # class 2 never predicted nor present -> 0 in the macro mean
    assert math.isnan(classification_metrics(probs[:2], labels[:2], 3)["auc"])
    with pytest.raises(ValueError, match=r"\[N, 3\]"):
        classification_metrics(probs[:, :2], labels, 3)


def test_each_class_recall_by_name_and_nan_for_a_class_the_split_lacks():
    labels = np.array([0, 0, 0, 0, 1, 1])
    # predicted: 0, 0, 0, 1 | 1, 2  -> recall nv 3/4, bkl 1/2, mel absent
    probs = np.eye(3)[[0, 0, 0, 1, 1, 2]] * 0.7 + 0.1
    m = classification_metrics(probs, labels, 3, ("nv", "bkl", "mel"))
    assert (m["recall_nv"], m["recall_bkl"]) == (75.0, 50.0) and math.isnan(m["recall_mel"])
    assert m["bacc"] == pytest.approx((75.0 + 50.0) / 2)  # bACC is the mean recall of the classes present
    assert "recall_nv" not in classification_metrics(probs, labels, 3)
    with pytest.raises(ValueError, match="must name the 3 classes"):
        classification_metrics(probs, labels, 3, ("nv", "mel"))


def test_dice_iou():
    a = np.zeros((4, 4), bool)
    b = np.zeros((4, 4), bool)
    a[:2] = True
    b[1:3] = True
    assert dice_iou(a, b) == {"dice": 50.0, "iou": pytest.approx(100 / 3)}
    assert dice_iou(np.zeros(3), np.zeros(3)) == {"dice": 100.0, "iou": 100.0}


def test_run_config_rejects_bad_fields_by_name():
    with pytest.raises(ValueError, match="unknown config field.*'epochs'"):
        RunConfig.from_dict({"epochs": 3})
    with pytest.raises(ValueError, match="'num_rounds'"):
        RunConfig(num_rounds=0)
    with pytest.raises(ValueError, match="'lr'"):
        RunConfig(lr=-1.0)
    cfg = RunConfig(lr=0.01, lr_step_epochs=25)
    assert cfg.lr_at(24) == 0.01 and cfg.lr_at(25) == 0.005 and cfg.lr_at(249) == pytest.approx(0.01 / 2**9)
    assert RunConfig.from_dict(cfg.to_dict()) == cfg


def test_results_table_reports_best_round_test_metrics_and_the_mean():
    summaries = {
        "site-1": {"best": {"round": 3, "test": {"f1": 70.0, "auc": 90.0}}},
        "site-2": {"best": {"round": 1, "test": {"f1": 60.0, "auc": 80.0}}},
    }
    table = results_table(summaries, ("f1", "auc"))
    assert "| site-1 | 3 | 70.00 | 90.00 |" in table
    assert table.endswith("| **mean** | | **65.00** | **85.00** |")
    # a segmentation task's per-slice rule stands under its table
    from prrfl.tasks.prostate.task import ProstateTask

    noted = results_table(summaries, ("f1", "auc"), ProstateTask.table_note)
    assert noted == table + "\n\n" + ProstateTask.table_note
    assert "without foreground in the truth and the prediction counts 100" in ProstateTask.table_note


def test_cli_overrides_reach_nested_fields_and_parse_json():
    from prrfl.config import apply_overrides

    base = {"num_rounds": 5, "data": {"image_size": 64}, "method_args": {}}
    out = apply_overrides(base, ["num_rounds=2", "data.image_size=128", "method_args.det_split=train", "method_args.tau=1.5"])
    assert out == {"num_rounds": 2, "data": {"image_size": 128}, "method_args": {"det_split": "train", "tau": 1.5}}
    assert base["data"]["image_size"] == 64  # the input is not modified
    with pytest.raises(ValueError, match="KEY=VALUE"):
        apply_overrides(base, ["num_rounds"])
