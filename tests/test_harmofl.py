"""HarmoFL: amplitude normalization, its running amplitude and freezing, the weight-perturbed step,
the federation's shared amplitude, and the method through the shared loop."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from conftest import TinySegTask, TinyTask
from torch import nn

from prrfl.config import ConfigError, RunConfig
from prrfl.messages import Download
from prrfl.methods.harmofl import AmplitudeNormalization, HarmoFL, HarmoFLModel, perturbed_step
from prrfl.site.state import SiteRuntime
from prrfl.site.trainer import run_round


def harmofl_site(task, tmp_path, site: str = "A", **options) -> SiteRuntime:
    """A site running HarmoFL on a tiny task, built as the loop's fixtures build theirs."""
    cfg = RunConfig.from_dict(
        {
            "task": "tiny",
            "method": "harmofl",
            "num_rounds": 2,
            "local_epochs": 1,
            "batch_size": 8,
            "lr": 0.05,
            "eval_test_every_epoch": False,
        }
    )
    scalars: list = []
    runtime = SiteRuntime.start(
        site,
        cfg,
        task,
        HarmoFL(cfg, task, **options),
        task.load_site(site, torch.device("cpu")),
        tmp_path / site,
        model_seed=123,
        generator_seed=7,
        run_id="run",
        log_scalar=lambda tag, value, step: scalars.append((tag, value, step)),
    )
    runtime.scalars = scalars  # type: ignore[attr-defined]
    return runtime


def tiny(size: int = 8) -> TinyTask:
    return TinyTask({"image_size": size})


# ----- amplitude normalization ------------------------------------------------------------------------
def test_the_normalised_image_has_the_target_amplitude_and_its_own_phase():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(4, 3, 8, 6, generator=g)
    target = torch.fft.fft2(torch.rand(3, 8, 6, generator=g) * 2 - 1).abs()  # a real image's amplitude
    norm = AmplitudeNormalization(3, (8, 6)).eval()
    norm.amplitude.copy_(target)
    out = norm(x)
    assert out.dtype == x.dtype and out.shape == x.shape
    before, after = torch.fft.fft2(x.double()), torch.fft.fft2(out.double())
    torch.testing.assert_close(after.abs(), target.double().expand_as(after), atol=1e-4, rtol=1e-4)
    seen = (before.abs() > 1e-3) & (target.double() > 1e-3)
    # phases compared on the unit circle (pi and -pi are the same angle)
    unit_before, unit_after = before / before.abs(), after / after.abs()
    torch.testing.assert_close(unit_after[seen], unit_before[seen], atol=1e-4, rtol=1e-4)


def test_the_dc_signed_scope_is_a_mean_shift_to_the_average_mean():
    x = torch.randn(5, 3, 8, 8) - 0.4
    norm = AmplitudeNormalization(3, (8, 8), scope="dc_signed").eval()
    norm.amplitude.copy_(torch.rand(3, 8, 8) + 0.1)
    norm.amplitude[:, 0, 0] = torch.tensor([-12.8, 6.4, 0.64])  # signed zero-frequency terms: means -0.2, 0.1, 0.01
    mu = torch.tensor([-0.2, 0.1, 0.01]).view(1, 3, 1, 1)
    torch.testing.assert_close(norm(x), x - x.mean(dim=(2, 3), keepdim=True) + mu)
    # the running zero-frequency term keeps its sign: a dark batch's average mean stays negative
    norm.train()
    norm.amplitude.zero_()
    norm(x)
    torch.testing.assert_close(norm.amplitude[:, 0, 0] / 64, 0.1 * x.mean(dim=(2, 3)).mean(0))


def test_the_dc_scope_is_the_authors_code_modulus_averaged_phase_kept_by_hand():
    """The authors' process with L = 0 on a 2x2 batch: A_bar = mean |FFT2(x)| of the first batch (momentum
    truncated to 0), then each image's zero-frequency amplitude becomes A_bar[0, 0], its phase kept."""
    x = torch.tensor([[[[1.0, 2.0], [3.0, 4.0]]], [[[-1.0, -1.0], [-1.0, -5.0]]]])  # sums 10 and -8
    norm = AmplitudeNormalization(1, (2, 2), scope="dc", update="first_batch")
    out = norm(x)
    # |DC| averaged: (|10| + |-8|) / 2 = 9, mu = 9 / 4 = 2.25 (the signed average would give 1 / 4)
    assert norm.amplitude[0, 0, 0].item() == pytest.approx(9.0)
    # image 1 (mean 2.5, phase 0): x - 2.5 + 2.25; image 2 (mean -2, phase pi): x + 2 - 2.25
    expected = torch.tensor([[[[0.75, 1.75], [2.75, 3.75]]], [[[-1.25, -1.25], [-1.25, -5.25]]]])
    torch.testing.assert_close(out, expected)
    # the same as the code's path through the spectrum: swap the centre of the shifted amplitude, keep the phase
    g = torch.Generator().manual_seed(3)
    x = torch.randn(4, 3, 6, 6, generator=g) - 0.3
    norm = AmplitudeNormalization(3, (6, 6), scope="dc", update="first_batch")
    out = norm(x)
    spectrum = torch.fft.fftshift(torch.fft.fft2(x.double()), dim=(-2, -1))
    amplitude, phase = spectrum.abs(), spectrum.angle()
    running = torch.fft.fftshift(torch.fft.fft2(x.double()).abs().mean(0), dim=(-2, -1))
    amplitude[..., 3, 3] = running[:, 3, 3]  # b = floor(6 * 0) = 0: the centre element only
    reference = torch.fft.ifft2(torch.fft.ifftshift(torch.polar(amplitude, phase), dim=(-2, -1))).real
    torch.testing.assert_close(out.double(), reference, atol=1e-5, rtol=1e-5)


def test_the_amplitude_is_an_ema_from_zero_updated_only_in_training_and_while_not_frozen():
    g = torch.Generator().manual_seed(1)
    a, b = torch.randn(4, 3, 8, 8, generator=g), torch.randn(2, 3, 8, 8, generator=g)
    mean_amp = lambda x: torch.fft.fft2(x).abs().mean(0)  # noqa: E731
    norm = AmplitudeNormalization(3, (8, 8))
    norm.eval()
    assert torch.equal(norm(a), a)  # all zero: inputs pass through
    assert not norm.amplitude.any()  # evaluation never updates
    norm.train()
    norm(a)
    torch.testing.assert_close(norm.amplitude, 0.1 * mean_amp(a))
    norm(b)
    expected = 0.9 * 0.1 * mean_amp(a) + 0.1 * mean_amp(b)
    torch.testing.assert_close(norm.amplitude, expected)
    norm.eval()
    norm(a)
    torch.testing.assert_close(norm.amplitude, expected)
    norm.train()
    norm.frozen = True
    out = norm(a)
    torch.testing.assert_close(norm.amplitude, expected)
    torch.testing.assert_close(torch.fft.fft2(out.double()).abs(), expected.double().expand(4, 3, 8, 8), atol=1e-4, rtol=1e-4)


def test_first_batch_takes_the_first_batch_mean_amplitude_and_keeps_it():
    a, b = torch.randn(4, 1, 8, 8), torch.randn(4, 1, 8, 8) * 3
    norm = AmplitudeNormalization(1, (8, 8), update="first_batch").train()
    norm(a)
    first = torch.fft.fft2(a).abs().mean(0)
    torch.testing.assert_close(norm.amplitude, first)
    norm(b)
    torch.testing.assert_close(norm.amplitude, first)


def test_inputs_of_another_size_are_refused():
    norm = AmplitudeNormalization(3, (8, 8))
    with pytest.raises(ValueError, match=r"\[C, H, W\] = \[3, 8, 8\].*\[2, 3, 16, 16\]"):
        norm(torch.zeros(2, 3, 16, 16))


# ----- weight perturbation --------------------------------------------------------------------------------
def test_one_perturbed_step_is_the_sam_formula():
    # y = w1 x1 + w2 x2, MSE on one sample: l(w) = (w . x - y)^2, grad 2 (w . x - y) x
    x, y = torch.tensor([1.0, 2.0]), torch.tensor(1.0)
    w = torch.tensor([0.5, -0.25], requires_grad=True)
    lr, alpha = 0.1, 0.05
    opt = torch.optim.SGD([w], lr=lr)
    loss = perturbed_step([w], lambda: (w @ x - y) ** 2, opt, alpha)

    w0 = torch.tensor([0.5, -0.25])
    r0 = float(w0 @ x - y)  # -1
    g = 2 * r0 * x  # (-2, -4)
    w_adv = w0 + alpha * g / g.norm()
    g_adv = 2 * float(w_adv @ x - y) * x
    assert float(loss) == pytest.approx(r0**2)
    torch.testing.assert_close(w.detach(), w0 - lr * g_adv)
    assert not torch.allclose(w.detach(), w0 - lr * g)  # not the plain step


def test_weight_decay_applies_only_in_the_base_step_at_the_unperturbed_weights():
    w = torch.tensor([1.0, -2.0], requires_grad=True)
    opt = torch.optim.SGD([w], lr=0.5, weight_decay=0.1)
    perturbed_step([w], lambda: 0.5 * (w**2).sum(), opt, alpha=0.05)
    w0 = torch.tensor([1.0, -2.0])
    w_adv = w0 + 0.05 * w0 / w0.norm()  # grad of 0.5 |w|^2 is w
    torch.testing.assert_close(w.detach(), w0 - 0.5 * (w_adv + 0.1 * w0))


def test_the_second_pass_leaves_the_running_statistics_as_the_first_left_them(tmp_path):
    site = harmofl_site(tiny(), tmp_path)
    model = site.models["local"].train()
    x, labels = torch.randn(6, 3, 8, 8), torch.arange(6) % 3
    state = {k: v.clone() for k, v in model.state_dict().items()}
    # what one plain training forward does to the buffers
    probe = harmofl_site(tiny(), tmp_path, site="B").models["local"].train()
    probe.load_state_dict(state)
    probe(x)
    site.method.train_batch(site.view(), x, labels)
    after = model.state_dict()
    for key in ("norm.amplitude", "base.bn.running_mean", "base.bn.running_var", "base.bn.num_batches_tracked"):
        torch.testing.assert_close(after[key], probe.state_dict()[key])


# ----- the method -------------------------------------------------------------------------------------
def test_the_model_puts_the_normalization_before_the_task_network(tmp_path):
    site = harmofl_site(tiny(), tmp_path)
    model = site.models["local"]
    assert isinstance(model, HarmoFLModel) and model.classifier_key == "base.fc2.weight"
    assert site.method.classifier_key == "base.fc2.weight"
    assert tuple(model.state_dict()["norm.amplitude"].shape) == (3, 8, 8)
    assert "norm.amplitude" in site.method.shared_keys(model)
    model.train()
    x = torch.randn(4, 3, 8, 8)
    model(x)  # one training batch: the amplitude is no longer zero
    assert model.norm.amplitude.any()
    model.eval()
    torch.testing.assert_close(model(x)[0], model.base(model.norm(x))[0])
    seg = HarmoFL(RunConfig(task="tiny"), TinySegTask({})).build_model()
    assert tuple(seg.norm.amplitude.shape) == (1, 16, 16) and seg.classifier_key == "base.head.weight"


def test_uniform_weighting_options_and_refusals():
    method = HarmoFL(RunConfig(task="tiny"), tiny())
    assert method.weighting == "uniform" and method.alpha == 0.05
    assert set(HarmoFL.option_parameters()) == {"weighting", "alpha", "amp_scope", "amp_update", "amp_momentum", "bn_plain"}
    assert HarmoFL.unsupported_reason(TinyTask({})) is not None  # no image size to build the amplitude from
    assert HarmoFL.unsupported_reason(tiny()) is None and HarmoFL.unsupported_reason(TinySegTask({})) is None
    for bad in ({"alpha": -1.0}, {"amp_scope": "low"}, {"amp_update": "sgd"}, {"amp_momentum": 0.0}):
        with pytest.raises(ValueError):
            HarmoFL(RunConfig(task="tiny"), tiny(), **bad)


def test_bn_plain_uses_batch_statistics_without_affine_everywhere():
    model = HarmoFL(RunConfig(task="tiny"), tiny(), bn_plain=True).build_model()
    bns = [m for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    assert bns and all(not m.affine and not m.track_running_stats for m in bns)
    assert all(m.num_features == 4 and m.eps == 1e-5 and m.momentum == 0.1 for m in bns)
    assert not any(k.startswith("base.bn.") for k in model.state_dict())
    default = HarmoFL(RunConfig(task="tiny"), tiny()).build_model()
    assert default.base.bn.affine and default.base.bn.track_running_stats


def test_the_federation_shares_one_frozen_amplitude_from_round_1(tmp_path):
    task = tiny()
    sites = [harmofl_site(task, tmp_path, site=s) for s in ("A", "B")]
    method = sites[0].method
    torch.manual_seed(0)
    initial = method.build_model().state_dict()
    assert not initial["norm.amplitude"].any()
    uploads = [run_round(s, Download(params=initial, round=0), 0) for s in sites]
    amps = [u.params["norm.amplitude"] for u in uploads]
    assert amps[0].any() and not torch.allclose(amps[0], amps[1])  # each site averaged its own images
    downloads = method.aggregate(uploads, 0, {})
    average = (amps[0] + amps[1]) / 2  # uniform, although both sites hold as many images here
    for s in sites:
        torch.testing.assert_close(downloads[s.name].params["norm.amplitude"], average)
        s.method.on_download(s.view(), Download(params=downloads[s.name].params, round=1), first=False)
        assert s.models["local"].norm.frozen
        torch.testing.assert_close(s.models["local"].state_dict()["norm.amplitude"], average)
    uploads = [run_round(s, Download(params=downloads[s.name].params, round=1), 1) for s in sites]
    for s, u in zip(sites, uploads):
        torch.testing.assert_close(u.params["norm.amplitude"], average)
        assert not torch.equal(u.params["base.fc2.weight"], downloads[s.name].params["base.fc2.weight"])  # it trained


def test_the_sites_amplitude_is_frozen_by_the_round_of_each_download(tmp_path):
    site = harmofl_site(tiny(), tmp_path)
    params = site.method.build_model().state_dict()
    site.method.on_download(site.view(), Download(params=params, round=0), first=True)
    assert not site.models["local"].norm.frozen
    site.method.on_download(site.view(), Download(params=params, round=3), first=False)
    assert site.models["local"].norm.frozen


@pytest.mark.parametrize("options", [{}, {"amp_scope": "dc", "amp_update": "first_batch", "bn_plain": True}])
def test_harmofl_runs_on_the_segmentation_task(tmp_path, options):
    task = TinySegTask({})
    site = harmofl_site(task, tmp_path, **options)
    torch.manual_seed(0)
    upload = run_round(site, Download(params=site.method.build_model().state_dict(), round=0), 0)
    losses = [v for tag, v, _ in site.scalars if tag.startswith("loss/")]
    assert losses and all(math.isfinite(v) for v in losses)
    assert upload.params["norm.amplitude"].any() and tuple(upload.params["norm.amplitude"].shape) == (1, 16, 16)
    assert site.best is None  # HarmoFL reports its global model, first scored when round 1's download arrives
    run_round(site, Download(params={**upload.params}, round=1), 1)
    assert site.best is not None and site.best["round"] == 0 and set(site.best["test"]) == set(task.recorded_metrics)


def test_the_loss_is_the_task_loss_at_the_unperturbed_weights(tmp_path):
    site = harmofl_site(tiny(), tmp_path, alpha=0.5)
    model = site.models["local"].train()
    x, labels = torch.randn(6, 3, 8, 8), torch.arange(6) % 3
    probe = harmofl_site(tiny(), tmp_path, site="B").models["local"].train()
    probe.load_state_dict(model.state_dict())
    with torch.no_grad():
        expected = float(F.cross_entropy(probe(x)[0], labels))
    loss = site.method.train_batch(site.view(), x, labels)["local"]  # on the model's device, detached
    assert not loss.requires_grad and float(loss) == pytest.approx(expected, rel=1e-5)


def test_harmofl_is_refused_for_a_task_without_an_image_size(monkeypatch):
    import prrfl.registry as registry
    from prrfl.registry import build_method

    known = registry._methods()
    monkeypatch.setattr(registry, "_methods", lambda: {**known, "harmofl": HarmoFL})
    with pytest.raises(ConfigError, match="cannot run on task 'tiny'.*image size"):
        build_method(RunConfig(task="tiny", method="harmofl"), TinyTask({}))
    assert isinstance(build_method(RunConfig(task="tiny", method="harmofl", method_args={"alpha": 0.1}), tiny()), HarmoFL)
