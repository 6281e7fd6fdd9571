"""Fixed-seed regression of the dermoscopy pipeline through the task contract: the task's batches and
its streaming evaluation give exactly what the loop computed before the contract existed (the
reference code below is that loop's batching and evaluation, kept as the specification). The whole
job's numbers are compared across revisions by benchmarks/same_numbers.sh."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import TINY_DATA

from prrfl.data.augment import DermAugment, normalize
from prrfl.metrics import classification_metrics
from prrfl.models import SlimVGG16BN
from prrfl.tasks.derm.task import DermTask


@pytest.fixture(scope="module")
def derm_site():
    task = DermTask(dict(TINY_DATA))
    return task, task.load_site("A", torch.device("cpu"), None)


def reference_batches(images, labels, batch_size, generator):
    """The loop's batching before the task owned it: one permutation, a last batch of one sample
    joins the previous one, then the dermoscopy augmentation of the batch's images."""
    n = len(labels)
    order = torch.randperm(n, generator=generator)
    bounds = list(range(0, n, batch_size))
    if len(bounds) > 1 and n - bounds[-1] == 1:
        bounds.pop()
    for i, start in enumerate(bounds):
        idx = order[start : bounds[i + 1] if i + 1 < len(bounds) else n]
        yield DermAugment()(images[idx], generator), labels[idx]


def test_derm_batches_are_the_loops_batches_value_for_value(derm_site):
    task, data = derm_site
    for batch_size in (16, len(data.train) - 1):  # the second ends with a batch of one, merged
        ours = list(task.train_batches(data.train, batch_size, torch.Generator().manual_seed(5)))
        reference = list(reference_batches(data.train.images, data.train.targets, batch_size, torch.Generator().manual_seed(5)))
        assert len(ours) == len(reference)
        for (x, y), (rx, ry) in zip(ours, reference):
            assert torch.equal(x, rx) and torch.equal(y, ry)


def test_derm_evaluation_is_the_loops_evaluation_value_for_value(derm_site):
    task, data = derm_site
    torch.manual_seed(0)
    model = SlimVGG16BN(num_classes=3).eval()
    with torch.no_grad():  # the reference: softmax of whole-split chunks of 256, then the metrics
        probs = torch.cat(
            [torch.softmax(model(normalize(data.test.images[s : s + 256]))[0].float(), dim=1) for s in range(0, len(data.test), 256)]
        )
    reference = classification_metrics(probs.numpy(), data.test.targets.numpy(), 3, ("nv", "bkl", "mel"))
    assert task.evaluate(model, data.test) == pytest.approx(reference, rel=0, abs=0, nan_ok=True)  # exactly, NaN for NaN
    assert np.isfinite([reference[m] for m in ("f1", "auc", "acc", "bacc")]).all()
