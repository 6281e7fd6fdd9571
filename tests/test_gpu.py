"""On a GPU (skipped without one, as in CI): the site loop's training batches never wait for the device, the
augmentations draw the same numbers on any device, and labels out of range that reach the prototype tracker on a
GPU are still refused (at the end of the epoch instead of at once)."""

from __future__ import annotations

import warnings

import pytest
import torch
from conftest import TinyTask

from prrfl.algorithms.class_prototypes import PrototypeAccumulator
from prrfl.config import RunConfig
from prrfl.data.augment import DermAugment, SliceAugment
from prrfl.messages import Download
from prrfl.registry import build_method
from prrfl.site.state import SiteRuntime

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
CUDA = torch.device("cuda")


class AugmentedTinyTask(TinyTask):
    """TinyTask trained through the dermoscopy augmentation, as a real site is."""

    def train_transform(self, images, targets, generator):
        return DermAugment()(images, generator), targets


def gpu_site(tmp_path, method: str) -> SiteRuntime:
    task = AugmentedTinyTask({})
    cfg = RunConfig.from_dict({"task": "tiny", "method": method, "num_rounds": 3, "local_epochs": 2, "batch_size": 8, "lr": 0.05})
    method_ = build_method(cfg, task)
    site = SiteRuntime.start("A", cfg, task, method_, task.load_site("A", CUDA), tmp_path, model_seed=0, device=CUDA, run_id="gpu")
    view = site.view()
    torch.manual_seed(0)
    download = Download(params=task.build_model().state_dict(), round=0, global_class_counts=site.data.class_counts)
    method_.on_download(view, download, first=True)
    method_.before_epoch(view, 0)
    return site


@pytest.fixture(scope="module", autouse=True)
def _sync_debug_mode_switched_once():
    """The first switch of torch's sync debug mode in a process sets CUDA state up, which itself waits for the GPU
    (seen on torch 2.11: one warning from torch/cuda/__init__.py in the module's first test only): done before any
    test records."""
    torch.cuda.set_sync_debug_mode("warn")
    torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize()


def synchronizing_lines(action) -> list[str]:
    """file:line of every operation in `action()` that waited for the GPU (torch's sync debug mode)."""
    torch.cuda.synchronize()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            action()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    return sorted({f"{w.filename}:{w.lineno}" for w in caught if "synchroniz" in str(w.message)})


@pytest.mark.parametrize("method", ["fedavg", "prr", "fedproto"])
def test_training_batches_never_wait_for_the_gpu(tmp_path, method):
    site = gpu_site(tmp_path, method)
    view = site.view()
    batches = 0

    def train() -> None:
        nonlocal batches
        for inputs, targets in site.method.train_batches(view):
            site.method.train_batch(view, inputs, targets)
            batches += 1

    train()  # the first epoch also initialises the GPU's libraries (handles, workspaces)
    assert synchronizing_lines(train) == []
    assert batches == 8  # 30 images in batches of 8, two epochs
    view.loss_check.settle()  # the epoch's one read: the losses were finite


@pytest.mark.parametrize("augment", [DermAugment(), SliceAugment.extended()], ids=["derm", "slice"])
def test_the_augmentation_draws_the_same_on_the_gpu_as_on_the_cpu(augment):
    images = torch.randint(
        0, 256, (12, 3 if isinstance(augment, DermAugment) else 1, 32, 32), generator=torch.Generator().manual_seed(1), dtype=torch.uint8
    )
    masks = (images[:, 0] > 128).long()
    outputs = []
    for device in ("cpu", "cuda"):
        generator = torch.Generator().manual_seed(0)
        args = (images.to(device),) if isinstance(augment, DermAugment) else (images.to(device), masks.to(device))
        out = augment(*args, generator)
        outputs.append([t.cpu() for t in (out if isinstance(out, tuple) else (out,))])
        assert generator.initial_seed() == 0
    for cpu, gpu in zip(*outputs):
        # the same draws; bilinear sampling and the blur differ in the last float32 bits between the devices' kernels
        torch.testing.assert_close(gpu, cpu, atol=1e-4, rtol=0)


def test_labels_out_of_range_on_the_gpu_are_refused_when_the_prototypes_are_read():
    accumulator = PrototypeAccumulator(3, 2)
    accumulator.update(torch.ones(2, 2, device=CUDA), torch.tensor([0, 2], device=CUDA))
    accumulator.update(torch.ones(2, 2, device=CUDA), torch.tensor([1, 5], device=CUDA))
    with pytest.raises(ValueError, match=r"labels must lie in \[0, 3\), got 0\.\.5"):
        accumulator.compute()


def test_prototypes_on_the_gpu_equal_the_cpu_ones():
    features = torch.randn(10, 4, generator=torch.Generator().manual_seed(0))
    labels = torch.tensor([0, 1, 1, 2, 0, 0, 1, 2, 2, 2])
    results = []
    for device in ("cpu", "cuda"):
        accumulator = PrototypeAccumulator(3, 4)
        accumulator.update(features[:6].to(device), labels[:6].to(device))
        accumulator.update(features[6:].to(device), labels[6:].to(device))
        results.append([t.cpu() for t in accumulator.compute()])
    torch.testing.assert_close(results[1][0], results[0][0])
    assert torch.equal(results[1][1], results[0][1])
