"""CPA: the conjoint mask, the modified softmax loss and the prototype weights."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from prrfl.algorithms.cpa import conjoint_mask, cpa_loss, prototype_gamma

COUNTS = (5408, 941, 994)  # nv, bkl, mel: the authors' global training counts


def test_mask_from_the_reference_counts():
    expected = torch.tensor([[1, 0.2469, 0.2579], [1, 1, 1], [1, 0.9571, 1]], dtype=torch.float64)
    torch.testing.assert_close(conjoint_mask(COUNTS), expected, atol=1e-4, rtol=0)
    assert conjoint_mask(COUNTS, beta=0.0).eq(1).all()


def test_mask_treats_empty_classes_as_plain_softmax():
    mask = conjoint_mask([10, 0, 5])
    assert torch.isfinite(mask).all()
    assert mask[1].eq(1).all() and mask[:, 1].eq(1).all()
    assert mask[0, 2] == pytest.approx(0.5**0.8)
    assert conjoint_mask([0, 0]).eq(1).all()


@pytest.mark.parametrize("counts", [[3, -1], [[1, 2]], [], [1, float("inf")]])
def test_mask_rejects_bad_counts(counts):
    with pytest.raises(ValueError):
        conjoint_mask(counts)


def test_loss_is_cross_entropy_when_mask_and_gamma_are_one():
    logits, targets = torch.randn(16, 4), torch.randint(0, 4, (16,))
    ones = torch.ones(4, 4)
    torch.testing.assert_close(cpa_loss(logits, targets, ones), F.cross_entropy(logits, targets))
    torch.testing.assert_close(cpa_loss(logits, targets, ones, gamma=torch.ones(4)), F.cross_entropy(logits, targets))


def test_loss_matches_the_formula():
    mask = conjoint_mask(COUNTS).float()
    logits, targets = torch.randn(8, 3), torch.tensor([0, 1, 2, 0, 1, 2, 0, 0])
    per_sample = cpa_loss(logits, targets, mask, reduction="none")
    for i, c in enumerate(targets.tolist()):
        e = logits[i].exp()
        den = e[c] + sum(mask[c, j] * e[j] for j in range(3) if j != c)
        assert per_sample[i].item() == pytest.approx(-math.log(e[c] / den), rel=1e-5)
    torch.testing.assert_close(cpa_loss(logits, targets, mask), per_sample.mean())
    torch.testing.assert_close(cpa_loss(logits, targets, mask, reduction="sum"), per_sample.sum())


def test_loss_ignores_the_mask_diagonal():
    logits, targets = torch.randn(6, 3), torch.randint(0, 3, (6,))
    mask = conjoint_mask(COUNTS)
    odd = mask.clone().fill_diagonal_(0.25)
    torch.testing.assert_close(cpa_loss(logits, targets, odd), cpa_loss(logits, targets, mask))


def test_loss_is_stable_for_huge_logits():
    mask = torch.tensor([[1.0, 0.5], [1.0, 1.0]], dtype=torch.float64)
    logits = torch.tensor([[1e4, 1e4 - 2.0], [1e4, -1e4]], dtype=torch.float64, requires_grad=True)
    targets = torch.tensor([0, 1])
    loss = cpa_loss(logits, targets, mask, reduction="none")
    expected = torch.tensor([math.log1p(0.5 * math.exp(-2.0)), 2e4], dtype=torch.float64)
    torch.testing.assert_close(loss, expected)
    loss.sum().backward()
    assert torch.isfinite(logits.grad).all()


def test_zero_mask_entries_drop_out_of_the_denominator():
    mask = torch.tensor([[1.0, 0.0], [1.0, 1.0]])
    logits = torch.tensor([[0.0, 50.0]], requires_grad=True)
    loss = cpa_loss(logits, torch.tensor([0]), mask)
    assert loss.item() == pytest.approx(0.0, abs=1e-7)
    loss.backward()
    torch.testing.assert_close(logits.grad, torch.zeros(1, 2))


def test_competitor_gradient_scales_with_the_mask():
    # equal logits, target c = 0: d loss / d z_j = G[0, j] e^{z_j} / den, so the ratio of the
    # competitors' gradients is exactly the ratio of their mask entries
    counts = torch.tensor([1000.0, 100.0, 400.0])
    mask = conjoint_mask(counts, beta=0.8)
    logits = torch.zeros(1, 3, dtype=torch.float64, requires_grad=True)
    cpa_loss(logits, torch.tensor([0]), mask).backward()
    grad = logits.grad[0]
    assert grad[1] / grad[2] == pytest.approx((100 / 400) ** 0.8)
    assert grad[1] == pytest.approx((100 / 1000) ** 0.8 / (1 + mask[0, 1] + mask[0, 2]))
    assert grad[0] == pytest.approx(-(grad[1] + grad[2]))


def test_gamma_multiplies_each_samples_loss():
    mask = conjoint_mask(COUNTS).float()
    logits, targets = torch.randn(9, 3), torch.arange(9) % 3
    gamma = torch.tensor([1.0, 2.0, 0.5])
    plain = cpa_loss(logits, targets, mask, reduction="none")
    weighted = cpa_loss(logits, targets, mask, gamma=gamma, reduction="none")
    torch.testing.assert_close(weighted, gamma[targets] * plain)
    torch.testing.assert_close(cpa_loss(logits, targets, mask, gamma=gamma), weighted.mean())


def test_segmentation_shaped_inputs_match_the_flattened_loss():
    logits, targets = torch.randn(2, 3, 4, 5), torch.randint(0, 3, (2, 4, 5))
    mask = conjoint_mask([100, 10, 1]).float()
    flat = cpa_loss(logits.permute(0, 2, 3, 1).reshape(-1, 3), targets.reshape(-1), mask, reduction="none")
    per_pixel = cpa_loss(logits, targets, mask, reduction="none")
    assert per_pixel.shape == (2, 4, 5)
    torch.testing.assert_close(per_pixel.reshape(-1), flat)


def test_authors_epsilon_variant_is_close_but_not_identical():
    mask = conjoint_mask(COUNTS).float()
    logits, targets = torch.randn(32, 3), torch.randint(0, 3, (32,))
    exact = cpa_loss(logits, targets, mask)
    authors = cpa_loss(logits, targets, mask, authors_eps=True)
    torch.testing.assert_close(authors, exact, atol=1e-4, rtol=0)
    wrong = torch.tensor([[-100.0, 0.0, 0.0]])  # p^ ~ e^-100: the epsilon inside the log caps the loss
    assert cpa_loss(wrong, torch.tensor([0]), mask).item() > 90
    assert cpa_loss(wrong, torch.tensor([0]), mask, authors_eps=True).item() == pytest.approx(-math.log(1e-6))


def test_loss_rejects_bad_shapes_and_reductions():
    logits, targets = torch.randn(4, 3), torch.randint(0, 3, (4,))
    with pytest.raises(ValueError):
        cpa_loss(logits, targets, torch.ones(2, 2))
    with pytest.raises(ValueError):
        cpa_loss(logits, targets[:3], torch.ones(3, 3))
    with pytest.raises(ValueError):
        cpa_loss(logits, targets, torch.ones(3, 3), gamma=torch.ones(2))
    with pytest.raises(ValueError):
        cpa_loss(logits, targets, torch.ones(3, 3), reduction="max")


def test_prototype_gamma_values():
    local = torch.tensor([[1.0, 0.0], [1.0, 0.0], [1.0, 0.0], [2.0, 2.0]])
    glob = torch.tensor([[3.0, 0.0], [0.0, 1.0], [-1.0, 0.0], [1.0, 0.0]])
    gamma = prototype_gamma(local, glob, tau=3.0)
    expected = torch.tensor([1.0, 4.0 / 3.0, 2.0, 4.0 / (3.0 + math.sqrt(0.5))])
    torch.testing.assert_close(gamma, expected)
    assert prototype_gamma(local[1:2], glob[1:2], tau=1.0).item() == pytest.approx(2.0)


def test_prototype_gamma_is_one_for_absent_or_zero_prototypes():
    local = torch.tensor([[1.0, 0.0], [1.0, 0.0], [0.0, 0.0]])
    glob = torch.tensor([[0.0, 1.0], [0.0, 1.0], [0.0, 1.0]])
    gamma = prototype_gamma(local, glob, present=torch.tensor([True, False, True]))
    torch.testing.assert_close(gamma, torch.tensor([4.0 / 3.0, 1.0, 1.0]))


def test_prototype_gamma_carries_no_gradient_and_validates():
    local = torch.randn(3, 4, requires_grad=True)
    assert not prototype_gamma(local, torch.randn(3, 4)).requires_grad
    with pytest.raises(ValueError):
        prototype_gamma(torch.randn(3, 4), torch.randn(3, 5))
    with pytest.raises(ValueError):
        prototype_gamma(torch.randn(3, 4), torch.randn(3, 4), tau=0.0)
