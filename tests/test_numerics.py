"""The site loop's numerics: losses summed on the device and read once per epoch, the finite check without a
wait for the GPU per batch, the same numbers as the loop that read every loss at once; and the run's numerics
options (config `precision`, `channels_last`, `torch_compile`: prrfl.numerics), checked, recorded, trained and
evaluated with, and the models they save rebuilt by their cards."""

from __future__ import annotations

import collections
import copy
import dataclasses
import functools
import json
import math

import pytest
import torch
from conftest import TinyTask, make_runtime, untimed

from prrfl.config import ConfigError, RunConfig, apply_overrides
from prrfl.flare.jobs import job_config
from prrfl.messages import Download
from prrfl.methods.method import Method
from prrfl.methods.view import LossCheck
from prrfl.numerics import NumericsForward, prepare_model
from prrfl.registry import method_names, validate_job
from prrfl.report import SiteResult, variant_label
from prrfl.site import trainer
from prrfl.site.state import SiteRuntime
from prrfl.site.trainer import estimate_round_seconds, run_round, train_epoch

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


def one_round(task, folder, method: str, **cfg) -> tuple[dict, list, list, SiteRuntime]:
    """(every model's state dict, the history, the scalars logged, the site) after round 0."""
    site = make_runtime(task, folder, method=method, **cfg)
    run_round(site, first_download(task), 0)
    params = {f"{role}.{k}": v.clone() for role, m in site.models.items() for k, v in m.state_dict().items()}
    scalars = [s for s in site.scalars if not s[0].startswith("speed/")]
    return params, untimed(site.history), scalars, site


@pytest.mark.parametrize("method", ["fedavg", "prr"])
def test_a_round_gives_the_numbers_of_the_loop_that_read_every_loss_at_once(tiny_task, tmp_path, method, monkeypatch):
    params, history, scalars, site = one_round(tiny_task, tmp_path / "now", method)
    assert not any("forward" in vars(m) for m in site.models.values())  # the numerics' defaults: the models as built
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


# ----- the numerics options ------------------------------------------------------------------------------
OPTIONS = {"precision": "bf16", "channels_last": True, "torch_compile": True}


@pytest.mark.parametrize("name", list(OPTIONS))
def test_each_numerics_option_is_accepted_in_a_job_and_float32_without_them_is_the_default(name):
    assert {k: getattr(RunConfig(), k) for k in OPTIONS} == {"precision": "float32", "channels_last": False, "torch_compile": False}
    value = OPTIONS[name]
    cfg = validate_job("derm_prr", apply_overrides(job_config("derm_prr").to_dict(), [f"{name}={json.dumps(value)}"]))
    assert getattr(cfg, name) == value and cfg.to_dict()[name] == value


@pytest.mark.parametrize(
    ("name", "value", "expected"),
    [
        ("precision", "fp16", "one of ['float32', 'bf16']"),
        ("precision", "bfloat16", "one of ['float32', 'bf16']"),
        ("precision", None, "one of ['float32', 'bf16']"),
        ("channels_last", "yes", "true or false"),
        ("torch_compile", 1, "true or false"),
    ],
)
def test_a_bad_numerics_value_is_refused_naming_the_field_and_the_allowed_values(name, value, expected):
    with pytest.raises(ConfigError) as e:
        validate_job("derm_prr", {**job_config("derm_prr").to_dict(), name: value})
    assert str(e.value) == f"job 'derm_prr': config field '{name}' must be {expected}, got {value!r}"


def test_with_the_defaults_a_model_is_left_exactly_as_built(tiny_task):
    model = tiny_task.build_model()
    before = {k: (v.clone(), v.stride()) for k, v in model.state_dict().items()}
    assert prepare_model(model, RunConfig(), compiled=True) is model and "forward" not in vars(model)
    assert all(torch.equal(v, before[k][0]) and v.stride() == before[k][1] for k, v in model.state_dict().items())


def dtypes_seen(model: torch.nn.Module, layer: str) -> list[tuple[torch.dtype, bool, bool]]:
    """(output dtype, channels-last input, training) of every call of the model's `layer`, recorded from now on."""
    seen: list[tuple[torch.dtype, bool, bool]] = []
    module = model.get_submodule(layer)
    module.register_forward_hook(
        lambda m, args, out: seen.append((out.dtype, args[0].is_contiguous(memory_format=torch.channels_last), m.training))
    )
    return seen


@pytest.mark.parametrize("method", ["fedavg", "prr"])
def test_bf16_trains_and_evaluates_in_bfloat16_with_finite_losses_and_float32_weights(tiny_task, tmp_path, method):
    site = make_runtime(tiny_task, tmp_path, method=method, precision="bf16")
    seen = {role: dtypes_seen(model, "conv") for role, model in site.models.items()}
    upload = run_round(site, first_download(tiny_task), 0)
    for calls in seen.values():  # every training and evaluation forward of every model computed in bfloat16
        assert {dtype for dtype, _, _ in calls} == {torch.bfloat16} and {training for _, _, training in calls} == {True, False}
    losses = [value for tag, value, _ in site.scalars if tag.startswith("loss/")]
    assert len(losses) == 2 * len(site.models) and all(math.isfinite(v) and 0 < v < 5 for v in losses)
    ckpt = torch.load(site.state_dir / "site_state.pt", weights_only=False)
    floats = [
        *(v for m in site.models.values() for v in m.state_dict().values()),
        *upload.params.values(),
        *(v for state in ckpt["models"].values() for v in state.values()),
        *(v for opt in site.optimizers.values() for p in opt.param_groups[0]["params"] for v in (p, p.grad) if v is not None),
    ]
    assert all(v.dtype == torch.float32 for v in floats if v.is_floating_point())
    results = json.loads((site.state_dir / "results.json").read_text())
    assert {k: results[k] for k in OPTIONS} == {"precision": "bf16", "channels_last": False, "torch_compile": False}
    assert SiteResult.load(site.state_dir / "results.json").method == f'{method}[precision="bf16"]'  # reported apart


def test_channels_last_trains_channels_last_and_its_saved_state_dict_loads_into_a_fresh_model(tiny_task, tmp_path):
    site = make_runtime(tiny_task, tmp_path, method="prr", channels_last=True)
    seen = dtypes_seen(site.models["personal"], "conv")
    upload = run_round(site, first_download(tiny_task), 0)
    assert seen and all(dtype == torch.float32 and channels_last for dtype, channels_last, _ in seen)  # inputs too
    for model in site.models.values():  # still after the optimiser's steps
        assert model.conv.weight.is_contiguous(memory_format=torch.channels_last) and not model.conv.weight.is_contiguous()
    assert upload.params["conv.weight"].dtype == torch.float32
    fresh = tiny_task.build_model().eval()  # float32, contiguous: no numerics of the run
    fresh.load_state_dict(torch.load(site.state_dir / "best_personal.pt"))
    assert fresh.conv.weight.is_contiguous()
    x = tiny_task.eval_transform(site.data.test.images, site.data.test.targets)[0]
    with torch.no_grad():
        torch.testing.assert_close(fresh(x)[0], site.models["personal"].eval()(x)[0])
    results = json.loads((site.state_dir / "results.json").read_text())
    assert results["channels_last"] is True and SiteResult.load(site.state_dir / "results.json").method == "prr[channels_last=true]"


def test_a_model_card_rebuilds_a_model_that_computes_and_scores_as_the_site_did(tiny_task, tmp_path, monkeypatch):
    from nvflare.app_common.abstract.fl_model import FLModel

    import prrfl.registry as registry
    from prrfl.flare.site_app import submit_best_model, validate_model
    from prrfl.flare.site_config import SiteConfig
    from prrfl.inference import evaluate_saved_model, load_saved_model

    monkeypatch.setitem(registry.TASKS, "tiny", "conftest:TinyTask")  # the card's task, rebuilt by name
    site = make_runtime(tiny_task, tmp_path, method="fedbn", precision="bf16", channels_last=True, report_global_model=False)
    run_round(site, first_download(tiny_task), 0)
    card = json.loads((site.state_dir / "best_local.json").read_text())
    assert {k: card["config"][k] for k in OPTIONS} == {"precision": "bf16", "channels_last": True, "torch_compile": False}
    best = site.best_model()  # as the site rebuilds it for the out-of-distribution cohort and its examples
    assert best.forward.dtype == torch.bfloat16 and best.conv.weight.is_contiguous(memory_format=torch.channels_last)
    saved = load_saved_model(site.state_dir / "best_local.pt")
    assert isinstance(saved.model.forward, NumericsForward) and saved.model.forward.dtype == torch.bfloat16
    assert all(v.dtype == torch.float32 for v in torch.load(site.state_dir / "best_local.pt").values() if v.is_floating_point())
    result = evaluate_saved_model(site.state_dir / "best_local.pt", data_root="unused", split="test")
    assert result["metrics"] == card["metrics"]["test"] == site.best["test"]  # the numbers the site chose it with
    submitted = submit_best_model("A", site.state_dir)  # FLARE's cross-site evaluation: sent, rebuilt by its card, scored
    assert all(v.is_contiguous() for v in submitted.params.values())  # FLARE's safetensors streaming refuses others
    assert validate_model("A", FLModel(params=submitted.params, meta=submitted.meta), SiteConfig()).metrics == site.best["test"]


@pytest.mark.parametrize("method", method_names())
def test_every_method_trains_a_round_in_bf16_channels_last(tmp_path, method):
    task = TinyTask({"image_size": 8})  # HarmoFL needs the input size
    site = make_runtime(task, tmp_path, method=method, local_epochs=1, precision="bf16", channels_last=True)
    torch.manual_seed(0)
    run_round(site, Download(params=site.method.build_model().state_dict(), round=0, global_class_counts=COUNTS), 0)
    losses = [value for tag, value, _ in site.scalars if tag.startswith("loss/")]
    assert losses and all(math.isfinite(v) for v in losses)
    assert all(v.dtype == torch.float32 for m in site.models.values() for v in m.state_dict().values() if v.is_floating_point())


def recording_compile(monkeypatch, **compile_args) -> tuple[list, list]:
    """torch.compile replaced by one that records what it compiles and every call of a compiled function; with
    `compile_args` (a backend) it compiles for real, else the function runs as it is."""
    compiled, calls = [], []
    real = torch.compile

    def fake(fn, **kwargs):
        compiled.append(fn)
        run = real(fn, **compile_args) if compile_args else fn
        return functools.wraps(fn)(lambda *a, **k: calls.append(fn) or run(*a, **k))

    monkeypatch.setattr(torch, "compile", fake)
    return compiled, calls


def test_torch_compile_compiles_each_trained_models_forward_once_and_trains_through_it(tiny_task, tmp_path, monkeypatch):
    compiled, calls = recording_compile(monkeypatch)
    site = make_runtime(tiny_task, tmp_path, method="prr", torch_compile=True)
    assert compiled == []  # at the first forward, not before
    estimate_round_seconds(site)  # times a copy of a model: uncompiled
    assert compiled == [] and not copy.deepcopy(site.models["personal"]).forward.compiled
    run_round(site, first_download(tiny_task), 0)
    forwards = {role: model.forward for role, model in site.models.items()}
    assert compiled == [f.numerics for f in forwards.values()] or compiled == [f.numerics for f in reversed(forwards.values())]
    batches = 4 * site.cfg.local_epochs  # 30 samples in batches of 8
    assert sum(1 for fn in calls if fn == forwards["deputy"].numerics) >= batches  # training, then evaluations
    assert "forward" not in vars(site.best_model())  # evaluated once: not compiled (and float32, contiguous: as built)
    results = json.loads((site.state_dir / "results.json").read_text())
    assert results["torch_compile"] is True and SiteResult.load(site.state_dir / "results.json").method == "prr[torch_compile=true]"


def test_a_compiled_bf16_channels_last_round_gives_the_numbers_of_the_same_round_uncompiled(tiny_task, tmp_path, monkeypatch):
    options = {"precision": "bf16", "channels_last": True, "local_epochs": 1}
    eager = one_round(tiny_task, tmp_path / "eager", "fedavg", **options)
    compiled, calls = recording_compile(monkeypatch, backend="aot_eager")  # dynamo and AOTAutograd, without a C++ compiler
    now = one_round(tiny_task, tmp_path / "compiled", "fedavg", torch_compile=True, **options)
    assert len(compiled) == 1 and len(calls) > 4
    for k, v in eager[0].items():
        torch.testing.assert_close(now[0][k], v, rtol=1e-3, atol=1e-3)
    assert [tag for tag, _, _ in now[2]] == [tag for tag, _, _ in eager[2]]


def test_the_numerics_name_a_run_apart_from_the_methods_own():
    assert variant_label("prr", {}, RunConfig().to_dict()) == "prr"
    assert variant_label("prr", {}, {"precision": "float32", "channels_last": False}) == "prr"
    assert variant_label("prr", {"det_enabled": False}, {**RunConfig().to_dict(), **OPTIONS}) == (
        'prr[channels_last=true,det_enabled=false,precision="bf16",torch_compile=true]'
    )
    assert variant_label("fedavg", {}, {"class_loss": "balanced_softmax"}) == 'fedavg[class_loss="balanced_softmax"]'


def test_the_throughput_benchmark_measures_each_numerics_named_on_its_command_line(tiny_task):
    import argparse
    import sys
    from pathlib import Path

    benchmarks = str(Path(__file__).resolve().parents[1] / "benchmarks")
    sys.path.insert(0, benchmarks)
    try:
        import site_throughput
    finally:
        sys.path.remove(benchmarks)
    assert site_throughput.numerics_settings("float32,bf16+channels_last,compile") == {
        "float32": {},
        "bf16+channels_last": {"precision": "bf16", "channels_last": True},
        "compile": {"torch_compile": True},
    }
    with pytest.raises(argparse.ArgumentTypeError, match=r"unknown numerics \['fp16'\] in 'bf16\+fp16'"):
        site_throughput.numerics_settings("bf16+fp16")
    cfg = RunConfig.from_dict({"task": "tiny", "batch_size": 8, "precision": "bf16", "channels_last": True})
    train = tiny_task.load_site("A", torch.device("cpu")).train
    assert site_throughput.bare_loop(tiny_task, train, cfg, torch.device("cpu"), augment=True, epochs=1) > 0
