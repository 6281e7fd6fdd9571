"""The one local training loop every method shares."""

from __future__ import annotations

import copy
import logging
import math
import time
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager

import torch

from prrfl.messages import Download, Upload
from prrfl.methods.view import SiteView
from prrfl.metrics import improves, shared_model_drops
from prrfl.site.state import SiteRuntime

log = logging.getLogger(__name__)


class PhaseClock:
    """Seconds a round spends in each of its phases (`with clock("train"): ...`), for the round's `timing`
    record; on a GPU each phase ends with a synchronization, so that its kernels are counted in it."""

    def __init__(self, device: torch.device):
        self.device = device
        self.seconds: dict[str, float] = defaultdict(float)

    @contextmanager
    def __call__(self, phase: str) -> Iterator[None]:
        tick = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[phase] += _synchronized(self.device) - tick


# The phases of a round, as `timing["phases"]` names them: the download's merge and its scoring (`download`), the
# method's hook before each epoch (PRR: DET scoring P and D on valid, `before_epoch`), the local steps (`train`) and
# the hook after them (`after_epoch`), the per-epoch test curve (`epoch_test`), the end-of-round scoring of every
# model (`round_end`), the last round's out-of-distribution scores and examples (`ood`) and the upload (`upload`).
# The checkpoint written after them (it holds this record) is outside `round_seconds`.
PHASES = ("download", "before_epoch", "train", "after_epoch", "epoch_test", "round_end", "ood", "upload")


def run_round(site: SiteRuntime, download: Download, round_idx: int) -> Upload:
    """One communication round at a site: download, E local epochs, evaluation, checkpoint, upload.
    The method's hooks see the site through `SiteRuntime.view`."""
    cfg, method = site.cfg, site.method
    view = site.view()
    started = time.perf_counter()
    clock = PhaseClock(site.device)
    first = site.round_idx < 0
    if first and round_idx > 0:
        check_can_join(site, download, round_idx)
    with clock("download"):
        method.on_download(view, download, first=first)
        scored = download_recorded(site, round_idx)  # by score_last_download, before the run was extended
        if round_idx > 0 and (cfg.eval_test_every_epoch or method.reports_download()) and not scored:
            # right after the download, before any local step: where retrogress shows, and the global model's scores
            record_download(site, round_idx)
    if cfg.eval_test_every_epoch and round_idx > 0:
        epochs_done = round_idx * cfg.local_epochs
        metric = site.task.primary_metric
        drop = site.download_drop(round_idx)
        if drop is not None:
            site.log_scalar(f"retrogress/{metric}_drop", drop, epochs_done)
        shared = shared_model_drops(site.history, metric).get(round_idx)
        if shared is not None and method.upload_role != method.eval_role:  # otherwise the same as the line above
            site.log_scalar(f"retrogress/shared_{metric}_drop", shared[0] - shared[1], epochs_done)
    for epoch in range(cfg.local_epochs):
        step = round_idx * cfg.local_epochs + epoch  # global epoch index: the x axis of every curve
        for opt in site.optimizers.values():
            for group in opt.param_groups:
                group["lr"] = method.lr_at(step)
        with clock("before_epoch"):
            method.before_epoch(view, epoch)
        with clock("train"):
            losses = train_epoch(site, view)
        with clock("after_epoch"):
            method.after_epoch(view, epoch)
        for role, value in losses.items():
            site.log_scalar(f"loss/{role}", value, step)
        site.log_scalar("lr", method.lr_at(step), step)
        if cfg.eval_test_every_epoch:
            with clock("epoch_test"):
                test = site.evaluate(method.eval_role, "test")
            site.history.append({"kind": "epoch", "round": round_idx, "epochs_done": step + 1, "test": test})
            site.log_scalar(f"epoch_test/{site.task.primary_metric}", test[site.task.primary_metric], step)
    images = site.data.num_train * cfg.local_epochs * len(method.roles)
    train_seconds = clock.seconds["train"]
    timing = {
        "round_seconds": math.nan,  # set below, once the round's scoring is done
        "train_seconds": train_seconds,
        "train_images_per_second": images / train_seconds if train_seconds > 0 else math.nan,  # all models counted
        "phases": clock.seconds,
    }
    site.log_scalar("speed/train_images_per_second", timing["train_images_per_second"], (round_idx + 1) * cfg.local_epochs - 1)
    with clock("round_end"):
        record_round(site, round_idx, timing)
    site.round_idx = round_idx
    if round_idx == cfg.num_rounds - 1:
        with clock("ood"):
            site.ood = site.evaluate_best_on_ood()
            site.write_examples()
    with clock("upload"):
        upload = method.upload(view)
    timing["phases"] = {phase: round(clock.seconds.get(phase, 0.0), 4) for phase in PHASES}
    timing["round_seconds"] = time.perf_counter() - started
    site.save()
    return upload


def score_last_download(site: SiteRuntime, download: Download, round_idx: int) -> None:
    """The global model of the last round (round `round_idx` - 1 = num_rounds - 1), scored as every earlier round's
    is at its download (`record_download`) and considered for the site's best, with no training: the authors' codes
    test the aggregate after every round, the last included. Only for a method that reports its global model
    (`Method.reports_download`). Done once: a repeated request (a resumed server) changes nothing."""
    if not site.method.reports_download():
        raise ValueError(f"site {site.name}: {site.cfg.method} reports its model after the local epochs; it has no global model to score")
    if download_recorded(site, round_idx):
        return
    site.method.on_download(site.view(), download, first=False)
    record_download(site, round_idx)
    if site.best is not None and site.best["round"] == round_idx - 1:  # the last aggregate is the new best: run_round's
        site.ood = site.evaluate_best_on_ood()  # out-of-distribution scores and examples were of the previous one
        site.write_examples()
    site.save()


def download_recorded(site: SiteRuntime, round_idx: int) -> bool:
    """Whether round `round_idx`'s download has been scored (`record_download`) already."""
    return any(h["kind"] == "download" and h["round"] == round_idx for h in site.history)


def record_download(site: SiteRuntime, round_idx: int) -> None:
    """Score the reported model right after round `round_idx`'s download: on test (retrogress), and, when it is the
    method's reported model (`Method.reports_download`), on valid too, as the global model of round `round_idx` - 1,
    which may become the site's best."""
    method = site.method
    test = site.evaluate(method.eval_role, "test")
    entry = {"kind": "download", "round": round_idx, "epochs_done": round_idx * site.cfg.local_epochs, "test": test}
    entry["shared_test"] = shared_test(site, test)
    site.history.append(entry)
    if method.reports_download():
        entry["valid"] = site.evaluate(method.eval_role, "valid")
        entry["global_round"] = round_idx - 1  # the round whose aggregate this download is
        step = round_idx * site.cfg.local_epochs - 1  # the x of round round_idx - 1's other curves
        for split in ("valid", "test"):
            for name, value in entry[split].items():
                site.log_scalar(f"{split}_global/{name}", value, step)
        consider_best(site, round_idx - 1, entry["valid"], test)


def shared_test(site: SiteRuntime, reported: dict[str, float]) -> dict[str, float]:
    """Test metrics of the model the site uploads and the next download overwrites, recorded (with per-epoch
    test records) at the end of each round and right after each download: the retrogress of the shared
    model. It is the reported model (`reported`, already measured) unless the method uploads another one
    (PRR's deputy)."""
    role = site.method.upload_role
    return reported if role == site.method.eval_role else site.evaluate(role, "test")


def check_can_join(site: SiteRuntime, download: Download, round_idx: int) -> None:
    """A site without a checkpoint may join a running run only while its download is still a whole model
    (it never completed a round); otherwise its local layers (e.g. BatchNorm) are gone: say so."""
    local = {k for model in site.models.values() for k in model.state_dict()} - set(download.params)
    if local:
        raise RuntimeError(
            f"site {site.name}: no checkpoint of run {site.run_id} in {site.state_dir}, but the server asks for round "
            f"{round_idx} and sends only the shared weights ({len(local)} local tensors such as {sorted(local)[0]!r} "
            "are missing): restore that folder from a backup, or start a new run"
        )


def train_epoch(site: SiteRuntime, view: SiteView) -> dict[str, float]:
    """One pass over the site's training split, in the method's batches (`Method.train_batches`: the task's,
    unless the method samples its own); returns the mean loss of each trained model. `view`: the site as the
    method's hooks see it. The batches' losses are summed where
    they are, on the models' device, in float64 (the same numbers as summing them as Python floats), and read
    once, after the epoch, with the epoch's deferred finite checks (`LossCheck.settle`): on a GPU the host
    never waits for the device between batches."""
    method, train = site.method, site.data.train
    for role in method.roles:
        site.models[role].train()
    totals: dict[str, torch.Tensor] = {}
    for inputs, targets in method.train_batches(view):
        for role, loss in method.train_batch(view, inputs, targets).items():
            weighted = loss.detach().double() * len(targets)
            totals[role] = totals[role] + weighted if role in totals else weighted
    view.loss_check.settle()
    summed = torch.stack(list(totals.values())).tolist() if totals else []
    return {role: total / max(len(train), 1) for role, total in zip(totals, summed)}


def estimate_round_seconds(site: SiteRuntime, repeats: int = 2) -> float:
    """A rough cost of one round at this site, measured before the first one (the server's first-round
    deadline is a multiple of it): the seconds per image of one training step of the task's model on one
    batch, times the images a round trains (every model of the method) plus its evaluations at a third
    of that cost. The site's models, generator and the global RNG are left as they were. The step is timed
    with the run's numerics, uncompiled (a copy of a model is: `prrfl.numerics.NumericsForward`): with
    `torch_compile` the first round also spends the compilation, which this does not count."""
    cfg, data = site.cfg, site.data
    model = copy.deepcopy(site.models[site.method.roles[0]]).train()
    seconds = []
    with torch.random.fork_rng(devices=[site.device] if site.device.type == "cuda" else []):
        inputs, targets, _ = next(site.task.eval_batches(data.train, cfg.batch_size))
        for _ in range(repeats + 1):  # the first step warms up
            tick = time.perf_counter()
            logits, _ = model(inputs)
            site.task.loss(logits, targets).backward()
            seconds.append(_synchronized(site.device) - tick)
    per_image = min(seconds[1:]) / len(targets)
    trained = data.num_train * cfg.local_epochs * len(site.method.roles)
    evaluated = (len(data.valid) + len(data.test)) * (cfg.local_epochs + 2)  # DET, per-epoch test, round end
    return per_image * (trained + evaluated / 3)


def _synchronized(device: torch.device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()


def record_round(site: SiteRuntime, round_idx: int, timing: dict[str, float]) -> None:
    """Evaluate the site's reported model on valid and test, and every other model the method trains beside
    it (PRR's deputy: `other_models`, logged as `valid_<role>/...`); keep the best on validation, unless the
    reported model is the one scored at the download (`record_download`)."""
    role = site.method.eval_role
    valid = site.evaluate(role, "valid")
    test = site.evaluate(role, "test")
    others = {r: {"valid": site.evaluate(r, "valid"), "test": site.evaluate(r, "test")} for r in site.method.roles if r != role}
    step = (round_idx + 1) * site.cfg.local_epochs - 1
    for suffix, scores in (("", {"valid": valid, "test": test}), *((f"_{r}", s) for r, s in others.items())):
        for split, values in scores.items():
            for name, value in values.items():
                site.log_scalar(f"{split}{suffix}/{name}", value, step)
    entry = {"kind": "round", "round": round_idx, "epochs_done": step + 1, "valid": valid, "test": test, "timing": timing}
    if others:
        entry["other_models"] = others
    if site.cfg.eval_test_every_epoch:  # the uploaded model's test: measured above when it is one of the others
        uploaded = site.method.upload_role
        entry["shared_test"] = others[uploaded]["test"] if uploaded in others else shared_test(site, test)
    site.history.append(entry)
    if not site.method.reports_download():
        consider_best(site, round_idx, valid, test)


def consider_best(site: SiteRuntime, round_idx: int, valid: dict[str, float], test: dict[str, float]) -> None:
    """The reported model, scored for round `round_idx`, becomes the site's best when its validation score improves
    (`prrfl.metrics.improves`): its weights and card are saved."""
    metric = site.task.primary_metric
    if improves(None if site.best is None else site.best["valid"][metric], valid[metric], round_idx, site.cfg.select_from_round):
        site.best = {"round": round_idx, "valid": valid, "test": test}
        site.save_best(site.method.eval_role, round_idx, valid, test)
        log.info("site %s: new best %s %.2f at round %d", site.name, metric, valid[metric], round_idx)
