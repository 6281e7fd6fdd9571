"""PFA: the spectral mix, the per-key rules, the conv layouts and the round schedule."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch import nn

from prrfl.algorithms.pfa import (
    batchnorm_keys,
    conv_to_matrix,
    fourier_mix,
    low_frequency_band,
    low_frequency_box,
    matrix_to_conv,
    mix_spectrum,
    pfa_aggregate,
    pfa_threshold,
    reference_mix,
)

BN = ("bn.weight", "bn.bias", "bn.running_mean", "bn.running_var", "bn.num_batches_tracked")


class Toy(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, bias=False)
        self.bn = nn.BatchNorm2d(4)
        self.fc1 = nn.Linear(6, 8)
        self.fc2 = nn.Linear(8, 3, bias=False)


def toy_state(seed: int, dtype: torch.dtype = torch.float64) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    state = {
        "conv.weight": torch.randn(4, 3, 3, 3, generator=g),
        "bn.weight": torch.rand(4, generator=g),
        "bn.bias": torch.randn(4, generator=g),
        "bn.running_mean": torch.randn(4, generator=g),
        "bn.running_var": torch.rand(4, generator=g),
        "bn.num_batches_tracked": torch.tensor(seed),
        "fc1.weight": torch.randn(8, 6, generator=g),
        "fc1.bias": torch.randn(8, generator=g),
        "fc2.weight": torch.randn(3, 8, generator=g),
    }
    return {k: v.to(dtype) if v.is_floating_point() else v for k, v in state.items()}


def shifted_fft(x: torch.Tensor, ndim: int = 2) -> torch.Tensor:
    dims = tuple(range(-ndim, 0))
    return torch.fft.fftshift(torch.fft.fftn(x, dim=dims), dim=dims)


def box_mask(shape, r) -> torch.Tensor:
    mask = torch.zeros(shape, dtype=torch.bool)
    mask[low_frequency_box(shape, r)] = True
    return mask


def authors_avg_freq(mats: list[np.ndarray], r: float, amplitude_only: bool = False) -> list[np.ndarray]:
    """Independent numpy transcription of the authors' avg_freq_all (TMI) / avg_freq (MICCAI)."""
    h, w = mats[0].shape
    bh, bw, ch, cw = int(h * r), int(w * r), h // 2, w // 2
    spectra = [np.fft.fft2(m) for m in mats]
    amps = [np.fft.fftshift(np.abs(f)) for f in spectra]
    phases = [np.fft.fftshift(np.angle(f)) for f in spectra]
    amp_avg, phase_avg = sum(amps) / len(mats), sum(phases) / len(mats)
    out = []
    for f, a, p in zip(spectra, amps, phases):
        a, p = a.copy(), p.copy()
        a[ch - bh : ch + bh, cw - bw : cw + bw] = amp_avg[ch - bh : ch + bh, cw - bw : cw + bw]
        if amplitude_only:
            out.append(np.real(np.fft.ifft2(np.fft.ifftshift(a) * np.exp(1j * np.angle(f)))))
            continue
        p[ch - bh : ch + bh, cw - bw : cw + bw] = phase_avg[ch - bh : ch + bh, cw - bw : cw + bw]
        out.append(np.real(np.fft.ifft2(np.fft.ifftshift(a) * np.exp(1j * np.fft.ifftshift(p)))))
    return out


# ----- schedule and box ------------------------------------------------------------------------
def test_threshold_paper_schedule_is_linear_from_r0_to_r1():
    assert pfa_threshold(0, 50) == pytest.approx(0.35)
    assert pfa_threshold(49, 50) == pytest.approx(0.48)
    assert pfa_threshold(1, 3, r0=0.2, r1=0.4) == pytest.approx(0.3)
    assert pfa_threshold(0, 1) == pytest.approx(0.35)


def test_threshold_authors_schedule_never_reaches_its_end():
    assert pfa_threshold(0, 50, schedule="authors") == pytest.approx(0.35)
    assert pfa_threshold(49, 50, schedule="authors") == pytest.approx(0.4725)
    assert pfa_threshold(25, 50, r0=0.25, schedule="authors") == pytest.approx(0.25 + 0.5 * 0.225)


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(round_idx=50, num_rounds=50),
        dict(round_idx=-1, num_rounds=50),
        dict(round_idx=0, num_rounds=0),
        dict(round_idx=0, num_rounds=5, r1=0.6),
        dict(round_idx=0, num_rounds=5, r0=-0.1),
        dict(round_idx=0, num_rounds=5, schedule="cosine"),
    ],
)
def test_threshold_rejects_bad_arguments(kwargs):
    with pytest.raises(ValueError):
        pfa_threshold(**kwargs)


def test_box_matches_the_reference_table():
    # docs/authors_code.md §1.5: layer1.0.conv as a 9 x 96 matrix (authors' layout), fc2 rows of length 64
    assert low_frequency_box((9, 96), 0.35) == (slice(1, 7), slice(15, 81))
    assert low_frequency_box((9, 96), 0.4725) == (slice(0, 8), slice(3, 93))
    assert low_frequency_band(64, 0.35) == slice(10, 54)
    assert low_frequency_band(64, 0.4725) == slice(2, 62)
    assert low_frequency_band(100, 0.29) == slice(21, 79)  # 0.29 * 100 is 28.999... in floating point
    assert low_frequency_band(7, 0.0) == slice(3, 3)


# ----- the spectral mix ------------------------------------------------------------------------
@pytest.mark.parametrize("r", [0.2, 0.35, 0.5])
def test_mix_shares_weighted_amplitude_and_phase_inside_and_keeps_own_outside(r):
    stack = torch.randn(3, 6, 10, dtype=torch.float64)
    weights = torch.tensor([1.0, 2.0, 5.0])
    mixed = mix_spectrum(stack, r, weights)
    own = shifted_fft(stack)
    inside = box_mask((6, 10), r)
    w = (weights / weights.sum())[:, None, None]
    amp_avg, phase_avg = (w * own.abs()).sum(0), (w * own.angle()).sum(0)
    for k in range(3):
        torch.testing.assert_close(mixed[k].abs()[inside], amp_avg[inside])
        torch.testing.assert_close(
            torch.polar(torch.ones_like(amp_avg), mixed[k].angle())[inside], torch.polar(torch.ones_like(amp_avg), phase_avg)[inside]
        )
        torch.testing.assert_close(mixed[k][~inside], own[k][~inside])


def test_amplitude_only_mix_keeps_each_sites_phase():
    stack = torch.randn(2, 8, 8, dtype=torch.float64)
    mixed = mix_spectrum(stack, 0.35, components="amplitude")
    own = shifted_fft(stack)
    inside = box_mask((8, 8), 0.35)
    torch.testing.assert_close(mixed[0].abs()[inside], mixed[1].abs()[inside])
    torch.testing.assert_close(mixed[0].abs()[inside], own.abs().mean(0)[inside])
    torch.testing.assert_close(mixed / mixed.abs(), own / own.abs())  # unit phasors unchanged everywhere


def test_weights_one_zero_give_site_zeros_spectrum_inside_the_box():
    stack = torch.randn(2, 8, 12, dtype=torch.float64)
    mixed = mix_spectrum(stack, 0.3, weights=[1.0, 0.0])
    inside = box_mask((8, 12), 0.3)
    torch.testing.assert_close(mixed[1][inside], shifted_fft(stack)[0][inside])
    # a full box (even sides, r = 0.5) then hands site 1 exactly site 0's weights
    torch.testing.assert_close(fourier_mix(stack, 0.5, weights=[1.0, 0.0]), stack[[0, 0]])


def test_rowwise_mix_is_one_fft_per_row():
    stack = torch.randn(3, 4, 16, dtype=torch.float64)
    mixed = fourier_mix(stack, 0.35, ndim=1)
    for row in range(4):
        torch.testing.assert_close(mixed[:, row], fourier_mix(stack[:, row], 0.35, ndim=1))


def test_mix_matches_an_independent_transcription_of_the_authors_code():
    mats = [np.random.default_rng(k).normal(size=(9, 96)) for k in range(4)]
    stack = torch.tensor(np.stack(mats))
    for amplitude_only in (False, True):
        components = "amplitude" if amplitude_only else "amplitude_phase"
        expected = np.stack(authors_avg_freq(mats, 0.35, amplitude_only))
        np.testing.assert_allclose(fourier_mix(stack, 0.35, components=components).numpy(), expected, atol=1e-12)


@pytest.mark.parametrize("components", ["amplitude_phase", "amplitude"])
def test_half_spectrum_mix_equals_the_definition_up_to_rounding(components):
    # odd and even sides, a batch axis, 1-D rows, one-element axes, the empty and the full box, uneven weights:
    # fourier_mix works on the real FFT's half spectrum with the box's one-sided edge weighted 1/2
    g = torch.Generator().manual_seed(0)
    for shape, ndim in [
        ((3, 8, 8), 2),
        ((2, 7, 9), 2),
        ((4, 5, 6), 1),
        ((3, 2, 3, 10, 11), 2),
        ((3, 1, 1), 2),
        ((3, 16), 1),
        ((2, 12, 5), 2),
    ]:
        for r in (0.0, 0.1, 0.25, 0.35, 0.48, 0.5):
            for weights in (None, torch.arange(1.0, shape[0] + 1)):
                stack = torch.randn(shape, generator=g, dtype=torch.float64)
                fast = fourier_mix(stack, r, weights, components, ndim)
                torch.testing.assert_close(fast, reference_mix(stack, r, weights, components, ndim), rtol=0, atol=1e-13)


def test_bad_weights_and_components_are_rejected():
    stack = torch.randn(2, 4, 4)
    for weights in ([1.0], [1.0, -1.0], [0.0, 0.0], [float("nan"), 1.0]):
        with pytest.raises(ValueError):
            mix_spectrum(stack, 0.3, weights)
    with pytest.raises(ValueError):
        mix_spectrum(stack, 0.3, components="phase")
    with pytest.raises(ValueError):
        mix_spectrum(stack, 0.6)


# ----- conv layouts ----------------------------------------------------------------------------
@pytest.mark.parametrize("layout", ["paper", "authors"])
def test_conv_layout_round_trips(layout):
    w = torch.randn(5, 3, 2, 4)
    m = conv_to_matrix(w, layout)
    assert m.shape == ((10, 12) if layout == "paper" else (6, 20))
    torch.testing.assert_close(matrix_to_conv(m, w.shape, layout), w, rtol=0, atol=0)
    batched = torch.stack([w, 2 * w])
    torch.testing.assert_close(matrix_to_conv(conv_to_matrix(batched, layout), w.shape, layout), batched, rtol=0, atol=0)


def test_conv_layout_element_positions():
    n_out, n_in, kh, kw = 5, 3, 2, 4
    w = torch.arange(n_out * n_in * kh * kw).reshape(n_out, n_in, kh, kw)
    paper, authors = conv_to_matrix(w, "paper"), conv_to_matrix(w, "authors")
    for n, c, i, j in [(0, 0, 0, 0), (4, 2, 1, 3), (1, 2, 0, 3), (3, 0, 1, 1)]:
        assert paper[n * kh + i, c * kw + j] == w[n, c, i, j]
        assert authors[c * kh + i, j * n_out + n] == w[n, c, i, j]


def test_conv_layout_rejects_unknown_names():
    with pytest.raises(ValueError):
        conv_to_matrix(torch.randn(2, 2, 3, 3), "transposed")


# ----- pfa_aggregate: per-key rules --------------------------------------------------------------
@pytest.mark.parametrize("r", [0.0, 0.25, 0.35, 0.5])
@pytest.mark.parametrize("conv_layout", ["paper", "authors"])
@pytest.mark.parametrize("components", ["amplitude_phase", "amplitude"])
def test_identical_sites_come_back_unchanged(r, conv_layout, components):
    state = toy_state(0)
    out = pfa_aggregate([state] * 3, r, conv_layout=conv_layout, components=components, bn_keys=BN)
    for site in out:
        for key, value in state.items():
            torch.testing.assert_close(site[key], value, rtol=0, atol=1e-12)


def test_r_zero_returns_each_sites_own_weights_and_averages_biases():
    states = [toy_state(k) for k in range(3)]
    out = pfa_aggregate(states, 0.0, bn_keys=BN)
    for site, state in zip(out, states):
        for key in ("conv.weight", "fc1.weight", "fc2.weight", *BN):
            torch.testing.assert_close(site[key], state[key], rtol=0, atol=1e-12)
        torch.testing.assert_close(site["fc1.bias"], sum(s["fc1.bias"] for s in states) / 3)


def test_aggregate_equals_the_mix_of_each_tensor():
    states = [toy_state(k) for k in range(4)]
    r = 0.35
    out = pfa_aggregate(states, r, conv_layout="authors", bn_keys=BN)
    convs = conv_to_matrix(torch.stack([s["conv.weight"] for s in states]), "authors")
    expected_conv = matrix_to_conv(fourier_mix(convs, r), (4, 3, 3, 3), "authors")
    expected_fc1 = fourier_mix(torch.stack([s["fc1.weight"] for s in states]), r)
    expected_fc2 = fourier_mix(torch.stack([s["fc2.weight"] for s in states]), r, ndim=1)
    for k, site in enumerate(out):
        torch.testing.assert_close(site["conv.weight"], expected_conv[k])
        torch.testing.assert_close(site["fc1.weight"], expected_fc1[k])
        torch.testing.assert_close(site["fc2.weight"], expected_fc2[k])
    assert not torch.allclose(out[0]["fc1.weight"], states[0]["fc1.weight"])  # something was mixed


def test_classifier_rows_are_independent():
    states = [toy_state(k) for k in range(3)]
    changed = [dict(s) for s in states]
    changed[1]["fc2.weight"] = states[1]["fc2.weight"].clone()
    changed[1]["fc2.weight"][1] += 10.0
    before, after = pfa_aggregate(states, 0.4, bn_keys=BN), pfa_aggregate(changed, 0.4, bn_keys=BN)
    for b, a in zip(before, after):
        torch.testing.assert_close(a["fc2.weight"][[0, 2]], b["fc2.weight"][[0, 2]])
    # as a matrix (MICCAI), the rows are coupled
    before, after = (pfa_aggregate(s, 0.4, classifier_rowwise=False, bn_keys=BN) for s in (states, changed))
    assert not torch.allclose(after[0]["fc2.weight"][0], before[0]["fc2.weight"][0])


def test_classifier_defaults_to_the_last_2d_weight_and_can_be_named():
    states = [toy_state(k) for k in range(2)]
    default = pfa_aggregate(states, 0.4, bn_keys=BN)
    named = pfa_aggregate(states, 0.4, classifier_key="fc2.weight", bn_keys=BN)
    for d, n in zip(default, named):
        torch.testing.assert_close(d["fc2.weight"], n["fc2.weight"], rtol=0, atol=0)
    as_fc1 = pfa_aggregate(states, 0.4, classifier_key="fc1.weight", bn_keys=BN)
    rows = fourier_mix(torch.stack([s["fc1.weight"] for s in states]), 0.4, ndim=1)
    torch.testing.assert_close(as_fc1[0]["fc1.weight"], rows[0])
    with pytest.raises(ValueError, match="nope"):
        pfa_aggregate(states, 0.4, classifier_key="nope", bn_keys=BN)


def test_a_conv_classifier_is_mixed_by_output_rows():
    states = [{"head.weight": torch.randn(3, 8, 1, 1, dtype=torch.float64)} for _ in range(2)]
    out = pfa_aggregate(states, 0.4, classifier_key="head.weight", bn_keys=())
    rows = fourier_mix(torch.stack([s["head.weight"][:, :, 0, 0] for s in states]), 0.4, ndim=1)
    torch.testing.assert_close(out[1]["head.weight"][:, :, 0, 0], rows[1])


def test_every_branch_of_an_aspp_head_is_mixed_class_by_class():
    """DeepLab-v2's four ASPP branches all output class logits: each 3x3 conv weight [classes, D, 3, 3] is
    mixed one class row (D*9 values) at a time, rows independent, as the one-key classifier is."""
    g = torch.Generator().manual_seed(0)
    keys = [f"aspp.{i}.weight" for i in range(4)]
    states = [{k: torch.randn(2, 6, 3, 3, generator=g, dtype=torch.float64) for k in keys} for _ in range(3)]
    out = pfa_aggregate(states, 0.4, classifier_key=keys, bn_keys=())
    for key in keys:
        rows = fourier_mix(torch.stack([s[key].flatten(1) for s in states]), 0.4, ndim=1)
        for site in range(3):
            torch.testing.assert_close(out[site][key].flatten(1), rows[site], rtol=0, atol=1e-12)
    only_first = pfa_aggregate(states, 0.4, classifier_key="aspp.0.weight", bn_keys=())  # the others as conv matrices
    assert not torch.allclose(only_first[0]["aspp.3.weight"], out[0]["aspp.3.weight"])
    torch.testing.assert_close(only_first[0]["aspp.0.weight"], out[0]["aspp.0.weight"], rtol=0, atol=0)


def test_prr_mixes_all_four_aspp_branches_of_the_prostate_network():
    from prrfl.config import RunConfig
    from prrfl.registry import build_method, build_task

    cfg = RunConfig.from_dict({"task": "prostate", "method": "prr"})
    method = build_method(cfg, build_task(cfg))
    assert method.classifier_keys == tuple(f"aspp.{i}.weight" for i in range(4))


def test_batchnorm_stays_per_site_with_explicit_or_module_keys_and_is_never_guessed_from_names():
    states = [toy_state(k) for k in range(3)]
    for bn_keys in (set(BN), batchnorm_keys(Toy())):
        out = pfa_aggregate(states, 0.5, bn_keys=bn_keys)
        for site, state in zip(out, states):
            for key in BN:
                torch.testing.assert_close(site[key], state[key], rtol=0, atol=0)
    with pytest.raises(ValueError, match=r"found by layer type in a model: bn_keys=batchnorm_keys\(model\)"):
        pfa_aggregate(states, 0.5, bn_keys=None)
    with pytest.raises(TypeError, match="bn_keys"):
        pfa_aggregate(states, 0.5)  # no default
    mixed = pfa_aggregate(states, 0.5, bn_keys=())  # "bn." in a name means nothing: the weights are mixed
    assert not torch.equal(mixed[0]["bn.weight"], states[0]["bn.weight"])


def test_batchnorm_key_detection():
    model = nn.Sequential(nn.Conv2d(1, 2, 1), nn.BatchNorm2d(2), nn.Linear(2, 2))
    assert batchnorm_keys(model) == {f"1.{k}" for k in ("weight", "bias", "running_mean", "running_var", "num_batches_tracked")}
    assert batchnorm_keys(Toy()) == set(BN)
    named_like_bn = nn.ModuleDict({"bn": nn.Linear(2, 2), "norm": nn.BatchNorm1d(2)})  # the type decides, not the name
    assert batchnorm_keys(named_like_bn) == {f"norm.{k}" for k in ("weight", "bias", "running_mean", "running_var", "num_batches_tracked")}


def test_biases_get_the_weighted_average_and_non_float_buffers_are_kept():
    states = [toy_state(k) for k in range(2)]
    for k, state in enumerate(states):
        state["mask"] = torch.tensor([True, k == 1])
        state["step"] = torch.tensor([k, 7])
    out = pfa_aggregate(states, 0.3, weights=[3.0, 1.0], bn_keys=BN)
    expected = 0.75 * states[0]["fc1.bias"] + 0.25 * states[1]["fc1.bias"]
    for site, state in zip(out, states):
        torch.testing.assert_close(site["fc1.bias"], expected)
        assert torch.equal(site["mask"], state["mask"]) and torch.equal(site["step"], state["step"])
        assert site["step"].dtype == torch.long


def test_skip_keeps_keys_per_site_by_pattern_or_predicate():
    states = [toy_state(k) for k in range(2)]
    for skip in (["fc1.*"], "fc1.*", lambda key: key.startswith("fc1")):
        out = pfa_aggregate(states, 0.5, skip=skip, bn_keys=BN)
        for site, state in zip(out, states):
            torch.testing.assert_close(site["fc1.weight"], state["fc1.weight"], rtol=0, atol=0)
            torch.testing.assert_close(site["fc1.bias"], state["fc1.bias"], rtol=0, atol=0)
        assert not torch.allclose(out[0]["fc2.weight"], states[0]["fc2.weight"])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_dtype_is_preserved(dtype):
    out = pfa_aggregate([toy_state(k, dtype) for k in range(2)], 0.4, bn_keys=BN)
    for key, value in out[0].items():
        assert value.dtype == (dtype if key != "bn.num_batches_tracked" else torch.long)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_device_is_preserved_on_gpu():
    states = [{k: v.cuda() for k, v in toy_state(k).items()} for k in range(2)]
    out = pfa_aggregate(states, 0.4, bn_keys=BN)
    cpu = pfa_aggregate([toy_state(k) for k in range(2)], 0.4, bn_keys=BN)
    for key in out[0]:
        assert out[0][key].device == states[0][key].device
        torch.testing.assert_close(out[0][key].cpu(), cpu[0][key])


def test_inputs_are_not_mutated_and_outputs_share_no_memory():
    states = [toy_state(k) for k in range(3)]
    copies = [{k: v.clone() for k, v in s.items()} for s in states]
    out = pfa_aggregate(states, 0.45, bn_keys=BN)
    for state, copy, site in zip(states, copies, out):
        for key in state:
            assert torch.equal(state[key], copy[key])
            assert site[key].data_ptr() != state[key].data_ptr()
    out[0]["fc1.bias"] += 1.0  # the averaged bias is not one tensor shared by the sites
    assert not torch.equal(out[0]["fc1.bias"], out[1]["fc1.bias"])


def test_mismatched_states_are_rejected():
    a, b = toy_state(0), toy_state(1)
    b["fc1.weight"] = torch.randn(8, 5, dtype=torch.float64)
    with pytest.raises(ValueError, match="fc1.weight"):
        pfa_aggregate([a, b], 0.3, bn_keys=BN)
    with pytest.raises(ValueError, match="keys differ"):
        pfa_aggregate([a, {k: v for k, v in a.items() if k != "fc2.weight"}], 0.3, bn_keys=BN)
    with pytest.raises(ValueError):
        pfa_aggregate([], 0.3, bn_keys=BN)
    with pytest.raises(ValueError):
        pfa_aggregate([a, a], 0.7, bn_keys=BN)


def test_unsupported_rank_names_the_key():
    states = [{"conv1d.weight": torch.randn(4, 3, 5)} for _ in range(2)]
    with pytest.raises(ValueError, match="conv1d.weight"):
        pfa_aggregate(states, 0.3, bn_keys=())
    out = pfa_aggregate(states, 0.3, skip=["conv1d.weight"], bn_keys=())
    torch.testing.assert_close(out[1]["conv1d.weight"], states[1]["conv1d.weight"])


def test_outputs_are_contiguous_for_serialisation():
    torch.manual_seed(0)
    states = [{"c.weight": torch.randn(4, 3, 3, 3), "fc.weight": torch.randn(3, 8), "b": torch.randn(3)} for _ in range(2)]
    for layout in ("paper", "authors"):
        for out in pfa_aggregate(states, 0.4, conv_layout=layout, classifier_key="fc.weight", bn_keys=()):
            assert all(t.is_contiguous() for t in out.values())


def test_a_negative_real_coefficient_has_phase_pi_whatever_its_rounding():
    # the mean phase tells pi from -pi: two sites whose DC is -4 must share the phase pi (mean pi), not pi and -pi
    # (mean 0, which would turn the shared DC into +4); an FFT leaves +-0.0 or +-1e-17 there by library
    from prrfl.algorithms.pfa import _make_real_where_self_conjugate, _phase

    z = torch.complex(torch.tensor([-4.0, -4.0], dtype=torch.float64), torch.tensor([0.0, -0.0], dtype=torch.float64))
    assert _phase(z).tolist() == [math.pi, math.pi]
    half = torch.complex(-torch.ones(2, 4, 3, dtype=torch.float64), torch.full((2, 4, 3), -1e-17, dtype=torch.float64))
    _make_real_where_self_conjugate(half, (4, 4), centred=False)  # DC and Nyquist rows x columns 0 and 2
    assert (half.imag == 0).nonzero()[:, 1:].unique(dim=0).tolist() == [[0, 0], [0, 2], [2, 0], [2, 2]]
    constant = -torch.ones(2, 4, 4, dtype=torch.float64)
    torch.testing.assert_close(fourier_mix(constant, 0.5), constant, rtol=0, atol=1e-15)
