"""The site loop's numerics: losses summed on the device and read once per epoch, the finite check without a
wait for the GPU per batch, and the same numbers as the loop that read every loss at once."""

from __future__ import annotations

import collections
import dataclasses

import pytest
import torch
from conftest import make_runtime, untimed

from prrfl.messages import Download
from prrfl.methods.base import Method
from prrfl.methods.view import LossCheck
from prrfl.site import trainer
from prrfl.site.state import SiteRuntime
from prrfl.site.trainer import run_round, train_epoch

COUNTS = [20, 20, 20]


def first_download(task) -> Download:
    torch.manual_seed(0)
    return Download(params=task.build_model().state_dict(), round=0, global_class_counts=COUNTS)


# ----- the loop as it was when every batch's loss was read at once: the reference of the default numbers -----
def reading_train_batch(self, site, inputs, targets):
    outputs = {role: site.models[role](inputs) for role in self.roles}
    losses = self.losses(site, targets, outputs)
    for opt in site.optimizers.values():
        opt.zero_grad(set_to_none=True)
    total = sum(losses.values())
    if not torch.isfinite(total):
        raise FloatingPointError(f"site {site.name}: non-finite training loss {float(total)}")
    total.backward()
    for opt in site.optimizers.values():
        opt.step()
    self.after_batch(site, targets, outputs)
    return {role: float(loss.detach()) for role, loss in losses.items()}


def reading_train_epoch(site, view):
    method, train = site.method, site.data.train
    for role in method.roles:
        site.models[role].train()
    totals: dict[str, float] = {}
    for inputs, targets in site.task.train_batches(train, site.cfg.batch_size, site.generator):
        for role, loss in method.train_batch(view, inputs, targets).items():
            totals[role] = totals.get(role, 0.0) + loss * len(targets)
    return {role: total / max(len(train), 1) for role, total in totals.items()}


def one_round(task, folder, method: str, **cfg) -> tuple[dict, list, list]:
    site = make_runtime(task, folder, method=method, **cfg)
    run_round(site, first_download(task), 0)
    params = {f"{role}.{k}": v.clone() for role, m in site.models.items() for k, v in m.state_dict().items()}
    scalars = [s for s in site.scalars if not s[0].startswith("speed/")]
    return params, untimed(site.history), scalars


@pytest.mark.parametrize("method", ["fedavg", "prr"])
def test_a_round_gives_the_numbers_of_the_loop_that_read_every_loss_at_once(tiny_task, tmp_path, method, monkeypatch):
    params, history, scalars = one_round(tiny_task, tmp_path / "now", method)
    monkeypatch.setattr(Method, "train_batch", reading_train_batch)
    monkeypatch.setattr(trainer, "train_epoch", reading_train_epoch)
    before = one_round(tiny_task, tmp_path / "before", method)
    assert params.keys() == before[0].keys() and all(torch.equal(params[k], before[0][k]) for k in params)
    assert history == before[1]
    assert scalars == before[2] and any(tag.startswith("loss/") for tag, _, _ in scalars)  # the epochs' mean losses too


def deferred(site: SiteRuntime) -> SiteRuntime:
    """The site with the finite check it has on a GPU (tested here on the CPU)."""
    own_view = site.view
    site.view = lambda: dataclasses.replace(own_view(), loss_check=LossCheck(site.name, deferred=True))  # type: ignore[method-assign]
    return site


def test_an_epoch_reads_its_losses_from_the_device_once_however_many_batches(tiny_task, tmp_path, monkeypatch):
    site = deferred(make_runtime(tiny_task, tmp_path, method="fedavg", batch_size=4))
    view = site.view()
    site.method.on_download(view, first_download(tiny_task), first=True)
    batches = []
    train_batch = site.method.train_batch
    site.method.train_batch = lambda *a: batches.append(1) or train_batch(*a)
    reads = collections.Counter()
    for name in ("__bool__", "__float__", "__int__", "__index__", "item", "tolist", "cpu", "numpy"):
        original = getattr(torch.Tensor, name)
        monkeypatch.setattr(torch.Tensor, name, lambda self, *a, _n=name, _f=original, **k: reads.update([_n]) or _f(self, *a, **k))
    losses = train_epoch(site, view)
    monkeypatch.undo()
    assert len(batches) == 8  # 30 samples in batches of 4 (the last holds 2)
    assert reads == {"__bool__": 1, "tolist": 1}  # the deferred finite check and the epoch's losses, once each
    assert set(losses) == {"local"} and isinstance(losses["local"], float)


def nan_losses(site: SiteRuntime, from_batch: int = 0) -> list[int]:
    """Make the site's losses NaN from its `from_batch`-th batch on; the batches trained are counted."""
    batches: list[int] = []
    losses = site.method.losses

    def nan_after(view, targets, outputs):
        batches.append(1)
        out = losses(view, targets, outputs)
        return {role: loss * float("nan") for role, loss in out.items()} if len(batches) > from_batch else out

    site.method.losses = nan_after
    return batches


def test_a_non_finite_loss_on_the_cpu_raises_at_once_naming_the_site_before_its_step(tiny_task, tmp_path):
    site = make_runtime(tiny_task, tmp_path, method="fedavg")
    batches = nan_losses(site)
    download = first_download(tiny_task)
    with pytest.raises(FloatingPointError, match=r"^site A: non-finite training loss nan \(lower the learning rate\?\)"):
        run_round(site, download, 0)
    assert len(batches) == 1
    assert all(torch.equal(p, download.params[k]) for k, p in site.models["local"].named_parameters())  # no step taken


def test_a_non_finite_loss_on_a_gpu_raises_naming_the_site_at_the_end_of_its_epoch(tiny_task, tmp_path):
    site = deferred(make_runtime(tiny_task, tmp_path, method="prr"))
    batches = nan_losses(site, from_batch=1)
    with pytest.raises(FloatingPointError, match=r"^site A: non-finite training loss in this epoch \(lower the learning rate\?\)"):
        run_round(site, first_download(tiny_task), 0)
    assert len(batches) == 4  # the whole first epoch (30 samples in batches of 8), not one batch past the NaN
    assert site.round_idx == -1 and all(h["kind"] != "round" for h in site.history)  # the round did not complete


def test_a_deferred_check_settles_every_loss_since_the_last_settle_once():
    check = LossCheck("B", deferred=True)
    for value in (1.0, float("inf"), 2.0):
        check.check(torch.tensor(value))  # no read of the value here
    with pytest.raises(FloatingPointError, match="^site B: non-finite training loss in this epoch"):
        check.settle()
    check.check(torch.tensor(3.0))
    check.settle()  # a new epoch starts afresh
    check.settle()  # nothing checked: nothing to read
    with pytest.raises(FloatingPointError, match="^site B: non-finite training loss -inf"):
        LossCheck("B").check(torch.tensor(float("-inf")))
