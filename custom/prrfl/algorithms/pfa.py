"""Progressive Fourier Aggregation (PFA), the server side of PRR (TMI 2022, Sec. III-D).

Every shared weight tensor is seen as a 2-D matrix, moved to the frequency domain (FFT, fftshift),
and inside a centred low-frequency box the sites' amplitude and phase are replaced by their
(weighted) average; outside the box every site keeps its own spectrum. The inverse FFT's real part
is the site's new weight, so there is one output per site and no single global model. The box
grows over the rounds (`pfa_threshold`), sharing more of the spectrum as training settles.

Choices pinned here (docs/authors_code.md §1):
* the box on an axis of length n is [n//2 - b, n//2 + b) with b = floor(r*n): asymmetric, as in
  the authors' code, so r must lie in [0, 0.5];
* the phase is averaged arithmetically (the +-pi wrap is ignored), as in both paper and code; with
  the asymmetric box this makes the spectrum non-Hermitian, hence the explicit real part;
* the last classifier layer is mixed row by row (1-D FFT per class row, TMI); the MICCAI PRR-FL
  variant mixes it as a matrix (`classifier_rowwise=False`) and averages amplitude only
  (`components="amplitude"`);
* BatchNorm parameters and buffers never leave a site's own result (FedBN style); 1-D float
  tensors that are not BN (biases) get a plain weighted average, as the authors' FedAvg branch.
  BatchNorm is found by layer type (`batchnorm_keys(model)`), never from key names: a state dict does
  not say which of its layers are BatchNorm, so `pfa_aggregate` is told the keys.
"""

from __future__ import annotations

import fnmatch
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Literal

import scipy.fft
import torch
from torch import nn

StateDict = Mapping[str, torch.Tensor]
Components = Literal["amplitude_phase", "amplitude"]
ConvLayout = Literal["paper", "authors"]
Schedule = Literal["paper", "authors"]
Skip = Callable[[str], bool] | Iterable[str] | None

COMPONENTS: tuple[str, ...] = ("amplitude_phase", "amplitude")
CONV_LAYOUTS: tuple[str, ...] = ("paper", "authors")
SCHEDULES: tuple[str, ...] = ("paper", "authors")
AUTHORS_R1 = 0.475  # hard-coded end of the authors' schedule (their 0.95 = 2 * r1)

_BN_BUFFERS = ("running_mean", "running_var", "num_batches_tracked")
_BATCHNORM_TYPES = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d, nn.SyncBatchNorm)


# ----- schedule ------------------------------------------------------------------------------
def pfa_threshold(round_idx: int, num_rounds: int, r0: float = 0.35, r1: float = 0.48, schedule: Schedule = "paper") -> float:
    """Box half-width r for round `round_idx` (0-based) of `num_rounds`.

    paper:   linear from r0 at the first round to r1 at the last one (r0 when there is one round).
    authors: r0 + (t / num_rounds) * (0.475 - r0), so the hard-coded end 0.475 is never reached
             (0.4725 at round 49 of 50); only r0 is configurable there, `r1` is not used.
    """
    if schedule not in SCHEDULES:
        raise ValueError(f"schedule must be one of {SCHEDULES}, got {schedule!r}")
    if num_rounds < 1 or not 0 <= round_idx < num_rounds:
        raise ValueError(f"need 0 <= round_idx < num_rounds, got round_idx={round_idx}, num_rounds={num_rounds}")
    for name, value in (("r0", r0), ("r1", r1)):
        _check_r(value, name)
    if schedule == "authors":
        return r0 + round_idx / num_rounds * (AUTHORS_R1 - r0)
    if num_rounds == 1:
        return r0
    return r0 + round_idx / (num_rounds - 1) * (r1 - r0)


def _check_r(r: float, name: str = "r") -> None:
    if not 0.0 <= r <= 0.5:  # b = floor(r*n) <= n//2 keeps the box inside the matrix
        raise ValueError(f"{name} must lie in [0, 0.5], got {r}")


# ----- the spectral mix ------------------------------------------------------------------------
def low_frequency_band(n: int, r: float) -> slice:
    """Centred band [n//2 - b, n//2 + b), b = floor(r*n), of an fftshift-ed axis of length n."""
    _check_r(r)
    b = math.floor(r * n + 1e-9)  # the tolerance keeps e.g. 0.29*100 from flooring to 28
    c = n // 2
    return slice(c - b, c + b)


def low_frequency_box(shape: Sequence[int], r: float) -> tuple[slice, ...]:
    """Row band x column band (one band per axis) of a centred spectrum of `shape`."""
    return tuple(low_frequency_band(n, r) for n in shape)


def mix_spectrum(
    stack: torch.Tensor,
    r: float,
    weights: Sequence[float] | torch.Tensor | None = None,
    components: Components = "amplitude_phase",
    ndim: int = 2,
) -> torch.Tensor:
    """Per-site centred spectra after the PFA mix, in the precision of `stack`.

    stack [K, *batch, *signal]: K sites' real tensors; the FFT runs over the last `ndim` axes
    (2 for a matrix; 1 for the row-wise classifier, whose rows are then the batch axes).
    Returns complex [K, *batch, *signal], fftshift-ed: inside the low-frequency box every site holds
    the weighted average amplitude (and, for "amplitude_phase", phase); outside, its own spectrum.
    """
    if components not in COMPONENTS:
        raise ValueError(f"components must be one of {COMPONENTS}, got {components!r}")
    if not 1 <= ndim < stack.ndim:
        raise ValueError(f"ndim must be in [1, {stack.ndim - 1}] for a stack of shape {tuple(stack.shape)}")
    w = normalised_weights(weights, stack.shape[0]).to(stack.device, stack.real.dtype)
    dims = tuple(range(-ndim, 0))
    spectra = torch.fft.fftshift(torch.fft.fftn(stack, dim=dims), dim=dims)
    _make_real_where_self_conjugate(spectra, stack.shape[-ndim:], centred=True)
    box = (..., *low_frequency_box(stack.shape[-ndim:], r))
    inside = spectra[box]
    amplitude = torch.tensordot(w, inside.abs(), dims=1)
    if components == "amplitude_phase":
        phase = torch.tensordot(w, _phase(inside), dims=1)  # arithmetic mean, as paper and code
        spectra[box] = torch.polar(amplitude, phase)  # broadcast: the same value at every site
    else:
        spectra[box] = torch.polar(amplitude.expand(inside.shape), _phase(inside))
    return spectra


def fourier_mix(
    stack: torch.Tensor,
    r: float,
    weights: Sequence[float] | torch.Tensor | None = None,
    components: Components = "amplitude_phase",
    ndim: int = 2,
) -> torch.Tensor:
    """PFA of a stack of real tensors [K, ...]: the real part of the inverse of `mix_spectrum`.

    Computed on the half spectrum a real FFT returns, without forming `mix_spectrum`'s full one. The
    input is real, so its spectrum F is Hermitian, and so is the box's shared value C (an amplitude
    average is even, a phase average odd). The output Re(ifft(Y)), Y = C inside the box and F outside,
    is the inverse real FFT of Y's Hermitian part H(p) = (Y(p) + conj(Y(-p))) / 2, and on the half
    spectrum H = F + m (C - F), where m(p) = (1[p in box] + 1[-p in box]) / 2 is 1 inside the box and
    its mirror, 0 outside both and 1/2 on the box's one-sided edge (the box [-b, b) is asymmetric).
    Amplitudes, phases and the mix are computed only where m > 0 (per axis, the frequencies [-b, b]).
    Equal to the inverse of `mix_spectrum` up to float rounding (tests/test_pfa.py), with half the FFT
    work, and no fftshift copies. On the CPU the FFTs are scipy's (pocketfft: for float64 about 1.5x
    torch's forward and 2x its inverse transform). On a GPU the FFTs are cheap and the half spectrum's
    bookkeeping is not (measured on an H100: 0.05-0.09 s for a whole ResNet-18 aggregation against 0.03-0.07 s
    by the definition, benchmarks/pfa_speed.py), so there the mix is `reference_mix`.
    """
    if stack.device.type != "cpu":
        return reference_mix(stack, r, weights, components, ndim)
    if components not in COMPONENTS:
        raise ValueError(f"components must be one of {COMPONENTS}, got {components!r}")
    if not 1 <= ndim < stack.ndim:
        raise ValueError(f"ndim must be in [1, {stack.ndim - 1}] for a stack of shape {tuple(stack.shape)}")
    w = normalised_weights(weights, stack.shape[0]).to(stack.device, stack.real.dtype)
    dims = tuple(range(-ndim, 0))
    shape = tuple(stack.shape[-ndim:])
    half = _rfftn(stack, dims)  # [K, *batch, *shape[:-1], shape[-1] // 2 + 1]
    _make_real_where_self_conjugate(half, shape, centred=False)
    region, share = _box_region(shape, r, stack.device, stack.dtype)  # where m > 0, and m there
    inside = half[(..., *region)]
    amplitude = _weighted_sum(w, inside, _amplitude)
    if components == "amplitude_phase":
        shared = _polar(amplitude, _weighted_sum(w, inside, _phase))  # arithmetic mean phase
    else:
        shared = _polar(amplitude, _phase(inside))  # each site's own phase
    half[(..., *region)] = inside.mul_(1 - share).add_(shared * share)  # H = (1 - m) F + m C
    return _irfftn(half, shape, dims)


def _make_real_where_self_conjugate(spectra: torch.Tensor, shape: Sequence[int], centred: bool) -> None:
    """Zero the imaginary part, in place, of the frequencies p = -p (mod n) on every axis (DC, and Nyquist on an
    even axis), where a real tensor's spectrum is real: what an FFT leaves there is rounding (+-1e-17, or a zero
    of either sign, by library), and the phase average tells pi from -pi. On the centred spectrum DC sits at
    n // 2 and Nyquist at 0; on the half spectrum (`centred=False`, last axis n // 2 + 1) at 0 and n / 2."""
    grid = []
    for axis, n in enumerate(shape):
        dc, nyquist = (n // 2, 0) if centred else (0, n // 2)
        points = [dc, nyquist] if n % 2 == 0 else [dc]
        view = [1] * len(shape)
        view[axis] = -1
        grid.append(torch.tensor(points, device=spectra.device).view(view))
    torch.view_as_real(spectra)[(..., *grid, 1)] = 0.0


def _rfftn(stack: torch.Tensor, dims: tuple[int, ...]) -> torch.Tensor:
    """The real FFT of a CPU tensor over `dims`, by scipy (pocketfft)."""
    return torch.from_numpy(scipy.fft.rfftn(stack.detach().numpy(), axes=dims, workers=torch.get_num_threads()))


def _irfftn(half: torch.Tensor, shape: tuple[int, ...], dims: tuple[int, ...]) -> torch.Tensor:
    """The inverse of `_rfftn` (overwrites `half`): axis by axis, the complex inverse over the leading axes in
    place, then the real one (faster than scipy's irfftn, which copies)."""
    spectra, workers = half.numpy(), torch.get_num_threads()
    for axis, n in zip(dims[:-1], shape[:-1]):
        spectra = scipy.fft.ifft(spectra, n=n, axis=axis, overwrite_x=True, workers=workers)
    return torch.from_numpy(scipy.fft.irfft(spectra, n=shape[-1], axis=dims[-1], overwrite_x=True, workers=workers))


def reference_mix(
    stack: torch.Tensor,
    r: float,
    weights: Sequence[float] | torch.Tensor | None = None,
    components: Components = "amplitude_phase",
    ndim: int = 2,
) -> torch.Tensor:
    """`fourier_mix` by its definition: the real part of the full inverse FFT of `mix_spectrum` (slower; the
    tests and benchmarks/pfa_speed.py hold `fourier_mix` to it)."""
    dims = tuple(range(-ndim, 0))
    return torch.fft.ifftn(torch.fft.ifftshift(mix_spectrum(stack, r, weights, components, ndim), dim=dims), dim=dims).real


def _weighted_sum(w: torch.Tensor, half: torch.Tensor, part: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
    """sum_k w[k] part(half[k]), one site at a time (no K-sized temporary)."""
    total = part(half[0]).mul_(w[0])
    for k in range(1, half.shape[0]):
        total.add_(part(half[k]), alpha=float(w[k]))
    return total


def _amplitude(z: torch.Tensor) -> torch.Tensor:
    """|z| of a complex tensor (a vectorised norm of its (re, im) pairs; torch.abs of complex is not)."""
    return torch.linalg.vector_norm(torch.view_as_real(z), dim=-1)


def _phase(z: torch.Tensor) -> torch.Tensor:
    """arg z in (-pi, pi], by atan2 on contiguous real and imaginary parts (vectorised).

    A negative real coefficient (the DC or Nyquist term of a real tensor) has the phase pi whatever the sign of its
    zero imaginary part: -0.0 + 0.0 is +0.0. torch.angle gives -pi for an imaginary -0.0, and which of +-0.0 an FFT
    returns there depends on the FFT library, while the arithmetic mean of phases tells pi from -pi."""
    pairs = torch.view_as_real(z)
    return torch.atan2(pairs[..., 1] + 0.0, pairs[..., 0].contiguous())


def _polar(amplitude: torch.Tensor, phase: torch.Tensor) -> torch.Tensor:
    """amplitude * exp(i phase), as torch.polar (with vectorised cos and sin; broadcasts)."""
    return torch.complex(amplitude * phase.cos(), amplitude * phase.sin())


def _box_region(shape: Sequence[int], r: float, device: torch.device, dtype: torch.dtype) -> tuple[tuple[torch.Tensor, ...], torch.Tensor]:
    """Where m(p) = (1[p in box] + 1[-p in box]) / 2 is not 0 on the half spectrum of `shape` (last axis
    n // 2 + 1), as one index tensor per axis (shaped to broadcast into an open grid), and m there.

    Before fftshift the box [n//2 - b, n//2 + b) of an axis is the frequencies p in [-b, b) mod n."""
    region, inside, mirrored = [], [], []
    for axis, n in enumerate(shape):
        b = low_frequency_band(n, r).stop - n // 2
        p = torch.arange(n // 2 + 1 if axis == len(shape) - 1 else n, device=device)
        into, mirror = ((p + b) % n) < 2 * b, ((b - p) % n) < 2 * b
        kept = (into | mirror).nonzero().flatten()
        view = [1] * len(shape)
        view[axis] = -1
        region.append(kept.view(view))
        inside.append(into[kept].to(dtype).view(view))
        mirrored.append(mirror[kept].to(dtype).view(view))
    return tuple(region), (math.prod(inside) + math.prod(mirrored)) / 2


def normalised_weights(weights: Sequence[float] | torch.Tensor | None, num_sites: int) -> torch.Tensor:
    """Site weights summing to 1 (float64); None means uniform, as the authors' hard-coded 1/K."""
    if num_sites < 1:
        raise ValueError("need at least one site")
    if weights is None:
        return torch.full((num_sites,), 1.0 / num_sites, dtype=torch.float64)
    w = torch.as_tensor(weights, dtype=torch.float64).detach().cpu()
    if w.shape != (num_sites,):
        raise ValueError(f"need one weight per site ({num_sites}), got shape {tuple(w.shape)}")
    if not torch.isfinite(w).all() or (w < 0).any() or w.sum() <= 0:
        raise ValueError(f"weights must be finite, non-negative and not all zero, got {w.tolist()}")
    return w / w.sum()


# ----- conv weights as matrices ----------------------------------------------------------------
def conv_to_matrix(weight: torch.Tensor, layout: ConvLayout = "paper") -> torch.Tensor:
    """Conv weight [..., out, in, kh, kw] as a matrix [..., rows, cols] (leading axes are batch).

    paper:   (out*kh) x (in*kw); element (n, c, i, j) goes to row n*kh + i, column c*kw + j.
    authors: (in*kh) x (kw*out); element (n, c, i, j) goes to row c*kh + i, column j*out + n.
    """
    if weight.ndim < 4:
        raise ValueError(f"a conv weight needs 4 trailing axes (out, in, kh, kw), got shape {tuple(weight.shape)}")
    *lead, n_out, n_in, kh, kw = weight.shape
    if layout == "paper":
        return weight.transpose(-3, -2).reshape(*lead, n_out * kh, n_in * kw)
    if layout == "authors":
        return weight.movedim(-4, -1).reshape(*lead, n_in * kh, kw * n_out)
    raise ValueError(f"conv_layout must be one of {CONV_LAYOUTS}, got {layout!r}")


def matrix_to_conv(matrix: torch.Tensor, shape: Sequence[int], layout: ConvLayout = "paper") -> torch.Tensor:
    """Exact inverse of `conv_to_matrix` for a conv weight whose last four axes are `shape`."""
    n_out, n_in, kh, kw = shape[-4:]
    lead = matrix.shape[:-2]
    if layout == "paper":
        return matrix.reshape(*lead, n_out, kh, n_in, kw).transpose(-3, -2)
    if layout == "authors":
        return matrix.reshape(*lead, n_in, kh, kw, n_out).movedim(-1, -4)
    raise ValueError(f"conv_layout must be one of {CONV_LAYOUTS}, got {layout!r}")


# ----- which keys stay at the site ---------------------------------------------------------------
def batchnorm_keys(module: nn.Module) -> set[str]:
    """State-dict keys of every BatchNorm layer of `module` (parameters and buffers)."""
    keys = set()
    for name, sub in module.named_modules():
        if isinstance(sub, _BATCHNORM_TYPES):
            prefix = f"{name}." if name else ""
            keys.update(prefix + k for k in sub.state_dict())
    return keys


def batchnorm_statistics_keys(module: nn.Module) -> set[str]:
    """The running statistics among `batchnorm_keys` (running_mean, running_var, num_batches_tracked)."""
    return {k for k in batchnorm_keys(module) if k.rpartition(".")[2] in _BN_BUFFERS}


def _skip_rule(skip: Skip) -> Callable[[str], bool]:
    """A predicate from a callable, or from fnmatch patterns (a plain key matches itself)."""
    if skip is None:
        return lambda key: False
    if callable(skip):
        return skip
    patterns = [skip] if isinstance(skip, str) else list(skip)
    return lambda key: any(fnmatch.fnmatchcase(key, p) for p in patterns)


# ----- aggregation ---------------------------------------------------------------------------------
def pfa_aggregate(
    site_states: Sequence[StateDict],
    r: float,
    *,
    weights: Sequence[float] | torch.Tensor | None = None,
    components: Components = "amplitude_phase",
    conv_layout: ConvLayout = "paper",
    classifier_key: str | Sequence[str] | None = None,
    classifier_rowwise: bool = True,
    bn_keys: Iterable[str] | None,
    skip: Skip = None,
) -> list[dict[str, torch.Tensor]]:
    """PFA of K sites' state dicts (same keys and shapes) -> K new state dicts, one per site.

    `bn_keys`: the BatchNorm keys, which stay at each site: `batchnorm_keys(model)` (found by layer type), or
    () when the states carry no BatchNorm (prrfl's sites never send it). There is no default: a state dict
    does not say which layers are BatchNorm, and names are not guessed (None is refused, saying so).
    Per key, in this order:
      BN key (`bn_keys`), `skip` match, or non-float tensor
                      -> the site's own tensor (cloned);
      classifier      -> row-wise 1-D mix (`classifier_rowwise`; the key is `classifier_key`, or
                         each of several keys, e.g. the branches of an ASPP head that all give
                         class logits; by default the last 2-D float tensor that is not kept
                         locally); a named conv classifier (e.g. 3x3) is mixed as the rows of
                         [out, in*kh*kw];
      0-/1-D float    -> weighted average, the same at every site;
      2-D float       -> matrix mix;  4-D float -> conv, mixed as a matrix in `conv_layout`;
      other ranks     -> ValueError (name the key in `skip`).
    `weights`: per-site weights (e.g. training-set sizes), normalised; None = uniform.
    Computation runs in float64 on the first site's device; each output keeps its input's dtype
    and device. Inputs are not modified; outputs are contiguous and share no memory with them.
    """
    keys = _check_states(site_states)
    _check_r(r)
    if conv_layout not in CONV_LAYOUTS:
        raise ValueError(f"conv_layout must be one of {CONV_LAYOUTS}, got {conv_layout!r}")
    w = normalised_weights(weights, len(site_states))
    is_skipped = _skip_rule(skip)
    if bn_keys is None:
        raise ValueError(
            "pfa_aggregate needs the BatchNorm keys that stay at each site, found by layer type in a model: "
            "bn_keys=batchnorm_keys(model), or bn_keys=() when the state dicts carry no BatchNorm"
        )
    local = set(bn_keys)
    first = site_states[0]
    mixed_keys = [k for k in keys if k not in local and not is_skipped(k) and first[k].is_floating_point()]
    rowwise = _classifier(classifier_key, keys, mixed_keys, first) if classifier_rowwise else set()

    outputs: list[dict[str, torch.Tensor]] = [{} for _ in site_states]
    for key in keys:
        tensors = [state[key] for state in site_states]
        if key in mixed_keys:
            new = _mix_key(key, tensors, r, w, components, conv_layout, rowwise=key in rowwise)
        else:
            new = [t.detach().clone() for t in tensors]
        for out, tensor in zip(outputs, new):
            out[key] = tensor
    return outputs


def _check_states(site_states: Sequence[StateDict]) -> list[str]:
    """The common key list; ValueError on missing sites, differing keys or differing shapes."""
    if not site_states:
        raise ValueError("pfa_aggregate needs at least one site state dict")
    keys = list(site_states[0])
    for k, state in enumerate(site_states[1:], start=1):
        if set(state) != set(keys):
            diff = sorted(set(state) ^ set(keys))
            raise ValueError(f"site {k} state dict keys differ from site 0's: {diff[:5]}")
        for key in keys:
            if state[key].shape != site_states[0][key].shape:
                raise ValueError(
                    f"{key}: shape {tuple(state[key].shape)} at site {k} differs from {tuple(site_states[0][key].shape)} at site 0"
                )
    return keys


def _classifier(classifier_key: str | Sequence[str] | None, keys: list[str], mixed_keys: list[str], first: StateDict) -> set[str]:
    """The keys mixed row by row: the named ones, or the last 2-D mixed tensor (none if there is none)."""
    if classifier_key is None:
        return set([k for k in mixed_keys if first[k].ndim == 2][-1:])
    for key in [classifier_key] if isinstance(classifier_key, str) else classifier_key:
        if key not in keys:
            raise ValueError(f"classifier_key {key!r} is not in the state dicts")
        if first[key].ndim < 2:
            raise ValueError(f"classifier_key {key!r} has shape {tuple(first[key].shape)}; need >= 2-D")
    return {classifier_key} if isinstance(classifier_key, str) else set(classifier_key)  # local keys are never mixed


def _mix_key(
    key: str,
    tensors: list[torch.Tensor],
    r: float,
    w: torch.Tensor,
    components: Components,
    conv_layout: ConvLayout,
    rowwise: bool,
) -> list[torch.Tensor]:
    """One key's per-site results, each cast back to its input's dtype and device."""
    first = tensors[0]
    if rowwise:
        matrix, back, ndim = (lambda t: t.flatten(1)), (lambda m: m.view(first.shape)), 1
    elif first.ndim <= 1:  # scalars and vectors (biases): weighted average
        matrix, back, ndim = (lambda t: t), (lambda m: m), 0
    elif first.ndim == 2:
        matrix, back, ndim = (lambda t: t), (lambda m: m), 2
    elif first.ndim == 4:
        matrix, back, ndim = (lambda t: conv_to_matrix(t, conv_layout)), (lambda m: matrix_to_conv(m, first.shape, conv_layout)), 2
    else:
        raise ValueError(f"{key}: no PFA rule for a {first.ndim}-D tensor; keep it local with `skip`")
    # one float64 stack on the first site's device, each site copied (and cast) into it once
    matrices = [matrix(t.detach()) for t in tensors]
    stack = torch.empty((len(tensors), *matrices[0].shape), dtype=torch.float64, device=first.device)
    for row, m in zip(stack, matrices):
        row.copy_(m)
    w = w.to(stack.device)
    if ndim == 0:
        mixed = torch.tensordot(w, stack, dims=1).expand_as(stack)
    else:
        mixed = fourier_mix(stack, r, w, components, ndim=ndim)
    # contiguous: outputs are serialised per tensor (torch.save / safetensors refuse strided views)
    return [torch.empty(t.shape, dtype=t.dtype, device=t.device).copy_(back(m)) for m, t in zip(mixed, tensors)]
