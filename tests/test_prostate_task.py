"""The prostate task behind the contract: its options, its sites' data as slices grouped by volume,
the model and loss on real prepared data (a tiny synthetic federation)."""

from __future__ import annotations

import pytest
import torch

from prrfl.config import ConfigError, RunConfig
from prrfl.registry import build_method, validate_config
from prrfl.tasks.prostate.task import ProstateTask

TINY = {"image_size": 32, "model_width": 4, "synthetic_scale": 0.1, "synthetic_matrix_scale": 0.15}


@pytest.fixture(scope="module")
def task_and_site():
    task = ProstateTask(dict(TINY))
    return task, task.load_site("UCL", torch.device("cpu"), None)


@pytest.mark.parametrize(
    "data, field",
    [
        ({"image_size": 30}, "data.image_size"),
        ({"prototype_pooling": "mean"}, "data.prototype_pooling"),
        ({"model_width": 2}, "data.model_width"),
        ({"synthetic_scale": "0.3"}, "data.synthetic_scale"),
        ({"size": 64}, "data"),
    ],
)
def test_bad_options_are_refused_naming_the_field(data, field):
    with pytest.raises(ConfigError, match=f"'{field}"):
        validate_config({"task": "prostate", "method": "prr", "data": data})


def test_slices_are_grouped_by_volume_in_order(task_and_site):
    task, data = task_and_site
    for split in (data.train, data.valid, data.test):
        groups = split.groups.tolist()
        assert groups == sorted(groups) and groups[0] == 0  # each volume's slices together, volumes numbered in order
        assert split.images.shape[1:] == (1, 32, 32) and split.images.dtype == torch.uint8
        assert set(split.targets.unique().tolist()) <= {0, 1} and split.targets.dtype == torch.long
    assert data.num_train > 0 and data.class_counts[1] > 0
    assert task.stats_problem(data.num_train, data.class_counts) is None


def test_a_prepared_size_other_than_the_jobs_is_refused_naming_the_file(task_and_site, tmp_path):
    task, _ = task_and_site
    root = task.prepared_root(None)
    other = ProstateTask({**TINY, "image_size": 40})
    with pytest.raises(ValueError, match=r"UCL/train\.npz holds 32 px slices but the job asks for image_size=40"):
        other.load_site("UCL", torch.device("cpu"), str(root))
    with pytest.raises(FileNotFoundError, match="has no manifest.json: prepare the raw data first"):
        task.load_site("UCL", torch.device("cpu"), str(tmp_path))
    gone = tmp_path / "deleted_during_the_run"  # a folder that is no longer there is not advised to be prepared
    with pytest.raises(FileNotFoundError, match=f"data root {gone} does not exist \\(any more\\): check that the folder is there"):
        task.load_site("UCL", torch.device("cpu"), str(gone))


def test_prr_trains_the_deeplab_model_with_adam_on_prepared_slices(task_and_site):
    task, data = task_and_site
    cfg = RunConfig(task="prostate", optimizer="adam", lr=1e-3, data=TINY)
    method = build_method(cfg, task)
    assert method.classifier_key == "aspp.0.weight"
    torch.manual_seed(0)
    model = method.build_model()
    optimizer = method.build_optimizer(model)
    assert isinstance(optimizer, torch.optim.Adam)
    inputs, targets = next(task.train_batches(data.train, 4, torch.Generator().manual_seed(0)))
    logits, features = model(inputs)
    assert logits.shape == (len(targets), 2, 32, 32) and features.shape == (len(targets), 32, 4, 4)
    loss = task.loss(logits, targets)
    loss.backward()
    optimizer.step()
    assert torch.isfinite(loss)
    metrics = task.evaluate(model, data.test)
    assert set(metrics) == {"dice", "iou", "slice_dice", "slice_iou"} and 0 <= metrics["iou"] <= metrics["dice"] <= 100
    assert 0 <= metrics["slice_iou"] <= metrics["slice_dice"] <= 100
