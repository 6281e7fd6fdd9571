"""HarmoFL: harmonizing local and global drifts on heterogeneous medical images (Jiang et al., AAAI
2022)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, Literal, get_args

import torch
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm

from prrfl.messages import Download
from prrfl.methods.fedavg import FedAvg
from prrfl.methods.method import check_finite
from prrfl.methods.view import SiteView
from prrfl.server import aggregation

if TYPE_CHECKING:
    from prrfl.tasks.contract import Task

AmpScope = Literal["full", "dc", "dc_signed"]
AmpUpdate = Literal["ema", "first_batch"]
AMP_SCOPES: tuple[str, ...] = get_args(AmpScope)
AMP_UPDATES: tuple[str, ...] = get_args(AmpUpdate)
_GRAD_EPS = 1e-12  # the weight perturbation's guard against a zero gradient


class AmplitudeNormalization(nn.Module):
    """The input layer of HarmoFL: every image, per channel, keeps the phase of its 2-D Fourier
    spectrum and takes the running average amplitude `amplitude` (a buffer [C, H, W], so it is in
    the state dict and travels with the model): x' = Re(IFFT2(A_bar * exp(i * angle(FFT2(x))))).

    In training mode, unless `frozen`, every forward first updates A_bar from its batch, then
    normalises the batch with it: "ema" A_bar <- (1 - momentum) * A_bar + momentum * mean_batch
    |FFT2(x)|, from zero; "first_batch" sets A_bar to the first batch's mean amplitude and never
    changes it again. Evaluation mode never updates it. While A_bar is all zero (no training batch
    seen yet, e.g. evaluating the initial model) inputs pass through unchanged instead of being
    zeroed.

    scope "dc" replaces only the zero-frequency term, as the HarmoFL authors' code does (its band
    width L = 0): A_bar[:, 0, 0] averages the modulus |sum of the image channel| and each image keeps
    its own zero-frequency phase (0 or pi), i.e. x_c <- x_c - mean(x_c) + sign(mean(x_c)) * mu_c,
    mu_c = A_bar_c[0, 0] / (H * W) (sign(0) = +1). For non-negative images that is a shift to the
    average mean; for inputs normalised around 0 a dark channel goes to minus the average absolute
    mean. scope "dc_signed" averages the signed coefficient instead and shifts every image to that
    signed average mean, x_c <- x_c - mean(x_c) + mu_c: the same for non-negative images, the mean
    shift the code intends for zero-centred ones. In both the other entries of A_bar average the
    amplitude as in scope "full" (unused there).
    """

    def __init__(self, channels: int, size: tuple[int, int], *, scope: AmpScope = "full", update: AmpUpdate = "ema", momentum: float = 0.1):
        super().__init__()
        if scope not in AMP_SCOPES or update not in AMP_UPDATES or not 0 < momentum <= 1:
            raise ValueError(f"amplitude normalization needs scope in {AMP_SCOPES}, update in {AMP_UPDATES}, 0 < momentum <= 1")
        self.register_buffer("amplitude", torch.zeros(channels, *size))
        self.scope, self.update_rule, self.momentum = scope, update, momentum
        self.frozen = False  # set by the method from the round (not state: each round's download sets it)

    def extra_repr(self) -> str:
        return f"shape={tuple(self.amplitude.shape)}, scope={self.scope}, update={self.update_rule}, momentum={self.momentum}"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() != 4 or tuple(x.shape[1:]) != tuple(self.amplitude.shape):
            raise ValueError(
                f"HarmoFL's amplitude normalization holds an amplitude of shape [C, H, W] = {list(self.amplitude.shape)} "
                f"(the task's channels and image_size) but got inputs of shape {list(x.shape)}"
            )
        if self.training and not self.frozen:
            self.update(x)
        if not bool(self.amplitude.any()):
            return x
        return self.normalize(x)

    def batch_statistic(self, x: torch.Tensor) -> torch.Tensor:
        """The batch's mean amplitude [C, H, W] (in scope "dc_signed" with the signed zero-frequency term)."""
        spectrum = torch.fft.fft2(x.detach().float())
        stat = spectrum.abs().mean(dim=0)
        if self.scope == "dc_signed":
            stat[:, 0, 0] = spectrum[:, :, 0, 0].real.mean(dim=0)
        return stat

    @torch.no_grad()
    def update(self, x: torch.Tensor) -> None:
        stat = self.batch_statistic(x).to(self.amplitude.dtype)
        if self.update_rule == "first_batch":
            if not bool(self.amplitude.any()):
                self.amplitude.copy_(stat)
        else:
            self.amplitude.mul_(1 - self.momentum).add_(stat, alpha=self.momentum)

    def normalize(self, x: torch.Tensor) -> torch.Tensor:
        h, w = x.shape[-2:]
        if self.scope != "full":
            mu = (self.amplitude[:, 0, 0] / (h * w)).to(x.dtype).view(1, -1, 1, 1)
            mean = x.mean(dim=(-2, -1), keepdim=True)
            return x - mean + (torch.where(mean < 0, -mu, mu) if self.scope == "dc" else mu)
        phase = torch.fft.fft2(x.float()).angle()
        spectrum = torch.polar(self.amplitude.float().expand_as(phase), phase)
        return torch.fft.ifft2(spectrum).real.to(x.dtype)


class HarmoFLModel(nn.Module):
    """The task's network behind the amplitude normalization: forward(x) = base(norm(x)), the task's
    (logits, embedding). State-dict keys: "norm.amplitude" and the network's under "base."."""

    def __init__(self, norm: AmplitudeNormalization, base: nn.Module):
        super().__init__()
        self.norm = norm
        self.base = base
        key = getattr(base, "classifier_key", None)
        if key is not None:
            self.classifier_key = f"base.{key}"

    def forward(self, x: torch.Tensor) -> Any:
        return self.base(self.norm(x))


def image_size_of(task: Task) -> int | None:
    """The side of the task's (square) input images: its data option image_size, else its attribute."""
    size = task.data_cfg.get("image_size", getattr(task, "image_size", None))
    return size if isinstance(size, int) and not isinstance(size, bool) and size > 0 else None


def input_channels(model: nn.Module) -> int:
    """The channels of a network's input: the in_channels of its first convolution."""
    for layer in model.modules():
        if isinstance(layer, nn.Conv2d):
            return layer.in_channels
    raise ValueError("HarmoFL needs a network whose first layer with weights is a Conv2d (to know the input channels)")


def plain_batchnorm(model: nn.Module) -> nn.Module:
    """Replace, in place, every BatchNorm layer by one of the same type, num_features, eps and momentum
    with affine=False and track_running_stats=False (batch statistics in training and evaluation)."""
    for layer in list(model.modules()):
        for child_name, child in list(layer.named_children()):
            if isinstance(child, _BatchNorm):
                kind = nn.BatchNorm2d if isinstance(child, nn.SyncBatchNorm) else type(child)
                plain = kind(child.num_features, eps=child.eps, momentum=child.momentum, affine=False, track_running_stats=False)
                setattr(layer, child_name, plain)
    return model


@contextlib.contextmanager
def running_statistics_kept(model: nn.Module) -> Iterator[None]:
    """Inside, a training-mode forward changes no running statistic of `model`: the amplitude
    normalization does not update (it normalises with its current amplitude) and every buffer
    (BatchNorm running mean, variance and counter) is restored on exit, which must therefore come
    after the backward pass (BatchNorm's backward checks that its buffers were not modified)."""
    saved = [(b, b.detach().clone()) for b in model.buffers()]
    norms = [(m, m.frozen) for m in model.modules() if isinstance(m, AmplitudeNormalization)]
    for m, _ in norms:
        m.frozen = True
    try:
        yield
    finally:
        for m, frozen in norms:
            m.frozen = frozen
        with torch.no_grad():
            for b, value in saved:
                b.copy_(value)


def perturbed_step(
    params: list[torch.Tensor],
    loss_fn: Callable[[], torch.Tensor],
    optimizer: torch.optim.Optimizer,
    alpha: float,
    check: Callable[[torch.Tensor], None] = lambda loss: None,
    second_pass: Callable[[], contextlib.AbstractContextManager[Any]] = contextlib.nullcontext,
) -> torch.Tensor:
    """One weight-perturbed step: g = grad loss(theta); delta = alpha * g / (||g|| + 1e-12), ||g|| the
    L2 norm over every parameter with a gradient; the optimiser steps theta with the gradient of
    loss(theta + delta) (its weight decay and momentum apply to theta). The second forward and
    backward run inside `second_pass()`. Returns loss(theta)."""
    optimizer.zero_grad(set_to_none=True)
    loss = loss_fn()
    check(loss)
    loss.backward()
    if alpha > 0:
        with torch.no_grad():
            used = [p for p in params if p.grad is not None]
            norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(p.grad) for p in used])) if used else 0.0
            deltas = [alpha * p.grad / (norm + _GRAD_EPS) for p in used]
            for p, d in zip(used, deltas):
                p.add_(d)
        optimizer.zero_grad(set_to_none=True)
        with second_pass():
            perturbed = loss_fn()
            check(perturbed)
            perturbed.backward()
        with torch.no_grad():
            for p, d in zip(used, deltas):
                p.sub_(d)
    optimizer.step()
    return loss.detach()


class HarmoFL(FedAvg):
    """HarmoFL: local drift (heterogeneous inputs) is reduced by normalising every image's amplitude
    spectrum to a running average amplitude shared by the federation (`AmplitudeNormalization`, the
    first layer of the model, at training and evaluation); global drift by training with weight
    perturbation, a SAM-like step: the loss's gradient g at theta gives delta = alpha g / ||g||, and
    the optimiser steps theta with the gradient at theta + delta (`perturbed_step`). Each site
    averages its amplitude over its training batches in round 0 (EMA from zero, momentum 0.1); the
    server averages everything, the amplitude included, uniformly (1/K); from round 1 on every site
    keeps the averaged amplitude frozen.

    Choices: the amplitude buffer has the shape [C, image_size, image_size] from construction (C the
    input channels of the network's first convolution), so the server knows it; a task that states
    no image_size cannot run HarmoFL, and inputs of another size are an error. Each batch updates
    the amplitude first and is normalised with the updated one; until the first update (all zero)
    inputs pass through unchanged. The site freezes the amplitude when a download's round (meta
    "round"; without it, the round after the site's last) is >= 1.
    The step returns the loss at theta; the second forward (at theta + delta) updates neither the
    amplitude nor the BatchNorm running statistics, so each batch counts once, at the unperturbed
    weights; the perturbation skips parameters without gradient; the loop's optimiser (its momentum
    and weight decay) takes the step; alpha = 0 is a plain step. The whole model travels, BatchNorm
    statistics included (HarmoFL's aggregation is FedAvg).
    Options from the authors' code: `amp_scope="dc"` replaces only the zero-frequency amplitude with
    the average of its modulus, each image keeping its phase, exactly as the code (applied as the
    equivalent mean shift: see `AmplitudeNormalization`; `amp_scope="dc_signed"` averages the signed
    term, the shift meant for inputs normalised around 0); `amp_update="first_batch"` (the code's integer-truncated momentum)
    takes the first batch's mean amplitude and never updates it; `bn_plain=True` gives every
    BatchNorm affine=False and track_running_stats=False (the authors' networks: batch statistics
    at evaluation too). `weighting="samples"` weights the average by training-set size instead.
    """

    name = "harmofl"

    def __init__(
        self,
        cfg,
        task,
        *,
        weighting: aggregation.Weighting = "uniform",
        alpha: float = 0.05,
        amp_scope: AmpScope = "full",
        amp_update: AmpUpdate = "ema",
        amp_momentum: float = 0.1,
        bn_plain: bool = False,
        **options: Any,
    ):
        super().__init__(cfg, task, weighting=weighting, **options)
        if not alpha >= 0:
            raise ValueError(f"HarmoFL option alpha must be >= 0, got {alpha}")
        if amp_scope not in AMP_SCOPES:
            raise ValueError(f"HarmoFL option amp_scope must be one of {AMP_SCOPES}, got {amp_scope!r}")
        if amp_update not in AMP_UPDATES:
            raise ValueError(f"HarmoFL option amp_update must be one of {AMP_UPDATES}, got {amp_update!r}")
        if not 0 < amp_momentum <= 1:
            raise ValueError(f"HarmoFL option amp_momentum must lie in (0, 1], got {amp_momentum}")
        self.alpha, self.amp_scope, self.amp_update, self.amp_momentum = alpha, amp_scope, amp_update, amp_momentum
        self.bn_plain = bn_plain

    @classmethod
    def unsupported_reason(cls, task: Task) -> str | None:
        if image_size_of(task) is None:
            return "HarmoFL's amplitude normalization needs the task's input image size (data option or attribute image_size)"
        return None

    def build_model(self) -> nn.Module:
        base = self.task.build_model()
        if self.bn_plain:
            plain_batchnorm(base)
        size = image_size_of(self.task)
        if size is None:
            raise ValueError(self.unsupported_reason(self.task))
        norm = AmplitudeNormalization(
            input_channels(base), (size, size), scope=self.amp_scope, update=self.amp_update, momentum=self.amp_momentum
        )
        return HarmoFLModel(norm, base)

    def on_download(self, site: SiteView, download: Download, first: bool) -> None:
        """Load the average; from round 1 on the (averaged) amplitude stays frozen."""
        super().on_download(site, download, first)
        for role in self.roles:
            for layer in site.models[role].modules():
                if isinstance(layer, AmplitudeNormalization):
                    layer.frozen = download.round >= 1

    def train_batch(self, site, inputs, targets):
        role = self.upload_role
        model = site.models[role]

        loss = perturbed_step(
            list(model.parameters()),
            lambda: self.supervised_loss(site, model(inputs)[0], targets),
            site.optimizers[role],
            self.alpha,
            check=lambda value: check_finite(site, value),
            second_pass=lambda: running_statistics_kept(model),
        )
        return {role: loss}
