"""Prototypes: per-class means at a site and the server's Gaussian global prototype."""

from __future__ import annotations

import math

import pytest
import torch

from prrfl.algorithms.class_prototypes import PrototypeAccumulator, class_prototypes, sample_global_prototypes


def test_class_means_by_hand():
    features = torch.tensor([[1.0, 2.0], [3.0, 4.0], [10.0, 0.0], [0.0, 0.0], [2.0, 2.0]])
    labels = torch.tensor([0, 0, 2, 0, 2])
    protos, counts = class_prototypes(features, labels, num_classes=4)
    expected = torch.tensor([[4 / 3, 2.0], [0.0, 0.0], [6.0, 1.0], [0.0, 0.0]], dtype=torch.float64)
    torch.testing.assert_close(protos, expected)
    assert counts.tolist() == [3, 0, 2, 0] and counts.dtype == torch.long
    assert torch.isfinite(protos).all()


def test_accumulator_equals_one_shot():
    g = torch.Generator().manual_seed(0)
    features, labels = torch.randn(50, 6, generator=g), torch.randint(0, 3, (50,), generator=g)
    acc = PrototypeAccumulator(num_classes=3, dim=6)
    for start in range(0, 50, 16):
        acc.update(features[start : start + 16], labels[start : start + 16])
    protos, counts = acc.compute()
    one_shot, one_shot_counts = class_prototypes(features, labels, 3)
    torch.testing.assert_close(protos, one_shot)
    assert torch.equal(counts, one_shot_counts)


def test_accumulator_detaches_and_starts_empty():
    acc = PrototypeAccumulator(2, 3)
    protos, counts = acc.compute()
    assert protos.eq(0).all() and counts.eq(0).all()
    features = torch.randn(4, 3, requires_grad=True)
    acc.update(features, torch.tensor([0, 1, 1, 0]))
    assert not acc.compute()[0].requires_grad


def test_accumulator_rejects_bad_inputs():
    acc = PrototypeAccumulator(2, 3)
    with pytest.raises(ValueError):
        acc.update(torch.randn(4, 2), torch.zeros(4, dtype=torch.long))
    with pytest.raises(ValueError):
        acc.update(torch.randn(4, 3), torch.tensor([0, 1, 2, 0]))
    with pytest.raises(ValueError):
        PrototypeAccumulator(0, 3)


# three sites, two classes, two dimensions; class 1 is missing at site 2
SITES = torch.tensor(
    [
        [[1.0, 0.0], [5.0, 1.0]],
        [[3.0, 0.0], [7.0, 1.0]],
        [[5.0, 3.0], [99.0, 99.0]],
    ],
    dtype=torch.float64,
)
PRESENT = torch.tensor([[True, True], [True, True], [True, False]])


def test_mean_prototype_over_the_sites_that_have_the_class():
    mu, present = sample_global_prototypes(SITES, PRESENT, sample=False)
    torch.testing.assert_close(mu, torch.tensor([[3.0, 1.0], [6.0, 1.0]], dtype=torch.float64))
    assert present.tolist() == [True, True]


def sampled_noise_for(std: str, floor: float = 0.0) -> tuple[torch.Tensor, torch.Tensor]:
    """(global prototype - mean, eps) for the shared generator seed."""
    out, _ = sample_global_prototypes(SITES, PRESENT, torch.Generator().manual_seed(3), std=std, std_floor=floor)
    eps = torch.randn(2, 2, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    mu, _ = sample_global_prototypes(SITES, PRESENT, sample=False)
    return out - mu, eps


def test_biased_std_divides_by_the_number_of_sites():
    noise, eps = sampled_noise_for("biased")
    # class 0: dim 0 values 1, 3, 5 -> var 8/3; dim 1 values 0, 0, 3 -> var 6/3; class 1: 5, 7 -> var 1; 1, 1 -> 0
    sigma = torch.tensor([[math.sqrt(8 / 3), math.sqrt(2.0)], [1.0, 0.0]], dtype=torch.float64)
    torch.testing.assert_close(noise, sigma * eps)


def test_unbiased_std_divides_by_one_less():
    noise, eps = sampled_noise_for("unbiased")
    sigma = torch.tensor([[2.0, math.sqrt(3.0)], [math.sqrt(2.0), 0.0]], dtype=torch.float64)
    torch.testing.assert_close(noise, sigma * eps)


def test_std_floor_lifts_small_spreads():
    noise, eps = sampled_noise_for("unbiased", floor=1.5)
    sigma = torch.tensor([[2.0, math.sqrt(3.0)], [1.5, 1.5]], dtype=torch.float64)
    torch.testing.assert_close(noise, sigma * eps)


@pytest.mark.parametrize("std", ["biased", "unbiased"])
def test_a_class_at_one_site_has_zero_spread_until_floored(std):
    present = torch.tensor([[True, False], [True, False], [True, True]])
    out, flags = sample_global_prototypes(SITES, present, torch.Generator().manual_seed(0), std=std)
    torch.testing.assert_close(out[1], SITES[2, 1])
    floored, _ = sample_global_prototypes(SITES, present, torch.Generator().manual_seed(0), std=std, std_floor=1.0)
    assert not torch.allclose(floored[1], SITES[2, 1])
    assert flags.tolist() == [True, True]


def test_a_class_no_site_has_is_flagged_with_a_zero_row():
    protos = SITES.clone()
    protos[:, 1] = float("nan")  # whatever absent rows hold never leaks
    present = torch.tensor([[True, False]] * 3)
    out, flags = sample_global_prototypes(protos, present, torch.Generator().manual_seed(0), std_floor=1.0)
    assert flags.tolist() == [True, False]
    assert out[1].eq(0).all() and torch.isfinite(out).all()


def test_sampling_is_reproducible_with_a_seeded_generator():
    a, _ = sample_global_prototypes(SITES, PRESENT, torch.Generator().manual_seed(11))
    b, _ = sample_global_prototypes(SITES, PRESENT, torch.Generator().manual_seed(11))
    c, _ = sample_global_prototypes(SITES, PRESENT, torch.Generator().manual_seed(12))
    assert torch.equal(a, b) and not torch.equal(a, c)


def test_all_sites_present_by_default():
    out, flags = sample_global_prototypes(SITES[:2], sample=False)
    torch.testing.assert_close(out, SITES[:2].mean(0))
    assert flags.all()


def test_global_sampling_rejects_bad_arguments():
    with pytest.raises(ValueError):
        sample_global_prototypes(SITES, std="population")
    with pytest.raises(ValueError):
        sample_global_prototypes(SITES, std_floor=-1.0)
    with pytest.raises(ValueError):
        sample_global_prototypes(SITES, PRESENT[:2])
    with pytest.raises(ValueError):
        sample_global_prototypes(SITES[0])
