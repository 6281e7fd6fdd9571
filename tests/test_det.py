"""DET: the phase state machine, who distils from whom, and the KL term."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from prrfl.algorithms.det import (
    DET_METRIC_SPLITS,
    DISTILLATIONS,
    DeputyPair,
    Phase,
    distillation,
    distillation_targets,
    kl_distillation,
    mse_distillation,
    next_phase,
)

R, E, S = Phase.RECOVER, Phase.EXCHANGE, Phase.SUBLIMATE
P = 80.0  # personal score; l1 * P = 56, l2 * P = 72 with the defaults
LOW, MID, HIGH = 50.0, 60.0, 75.0  # D < l1 P, l1 P <= D < l2 P, D >= l2 P


@pytest.mark.parametrize(
    "phase, deputy, expected",
    [
        (None, HIGH, R),  # no phase yet (round start)
        (R, LOW, R),
        (R, MID, E),
        (R, HIGH, E),  # never straight to Sublimate
        (R, 56.0, E),  # the l1 boundary belongs to Exchange
        (E, LOW, R),
        (E, MID, E),
        (E, HIGH, S),
        (E, 72.0, S),  # the l2 boundary belongs to Sublimate
        (S, LOW, R),
        (S, MID, E),
        (S, HIGH, S),
    ],
)
def test_transition_table(phase, deputy, expected):
    assert next_phase(phase, deputy, P) is expected


@pytest.mark.parametrize("phase", [None, R, E, S])
def test_a_download_always_restarts_in_recover(phase):
    assert next_phase(phase, HIGH, P, just_downloaded=True) is R


def test_thresholds_are_configurable_and_ints_are_accepted():
    assert next_phase(2, 60.0, 100.0, l1=0.5, l2=0.6) is S
    assert next_phase(2, 60.0, 100.0) is R
    assert next_phase(3, 100.0, 100.0, l1=1.0, l2=1.0) is S


@pytest.mark.parametrize(
    "kwargs",
    [dict(l1=0.9, l2=0.7), dict(l1=0.0, l2=0.9), dict(l1=0.7, l2=1.1), dict(deputy_score=float("nan"))],
)
def test_bad_arguments_are_rejected(kwargs):
    args = dict(phase=E, deputy_score=50.0, personal_score=80.0) | kwargs
    with pytest.raises(ValueError):
        next_phase(**args)


def test_only_known_phases_are_accepted():
    with pytest.raises(ValueError):
        next_phase(0, 50.0, 80.0)  # the authors' "reset" stage 0 is None here


def test_distillation_targets():
    assert distillation_targets(R) == (False, True)
    assert distillation_targets(E) == (True, True)
    assert distillation_targets(S) == (True, False)
    assert distillation_targets(3) == (True, False)


def test_metric_splits_put_the_papers_choice_first():
    assert DET_METRIC_SPLITS == ("valid", "train")


def test_kl_equals_the_hand_formula():
    student, teacher = torch.randn(5, 4), torch.randn(5, 4)
    q, log_p = teacher.softmax(1), student.log_softmax(1)
    expected = (q * (q.log() - log_p)).sum(1).mean()
    torch.testing.assert_close(kl_distillation(student, teacher), expected)
    assert kl_distillation(student, student).item() == pytest.approx(0.0, abs=1e-6)


def test_kl_with_temperature_is_scaled_by_its_square():
    student, teacher, t = torch.randn(5, 4), torch.randn(5, 4), 2.0
    q, log_p = (teacher / t).softmax(1), (student / t).log_softmax(1)
    expected = t**2 * (q * (q.log() - log_p)).sum(1).mean()
    torch.testing.assert_close(kl_distillation(student, teacher, temperature=t), expected)


def test_kl_gives_no_gradient_to_the_teacher():
    student = torch.randn(3, 4, requires_grad=True)
    teacher = torch.randn(3, 4, requires_grad=True)
    kl_distillation(student, teacher).backward()
    assert teacher.grad is None
    expected = (student.softmax(1) - teacher.softmax(1)) / 3  # d KL / d z_student, batch mean
    torch.testing.assert_close(student.grad, expected.detach())


def test_kl_on_maps_averages_over_samples_and_positions():
    student, teacher = torch.randn(2, 3, 4, 4), torch.randn(2, 3, 4, 4)
    flat = kl_distillation(student.permute(0, 2, 3, 1).reshape(-1, 3), teacher.permute(0, 2, 3, 1).reshape(-1, 3))
    torch.testing.assert_close(kl_distillation(student, teacher), flat)
    manual = F.kl_div(student.log_softmax(1), teacher.softmax(1), reduction="sum") / 32
    torch.testing.assert_close(kl_distillation(student, teacher), manual)


def test_kl_rejects_bad_inputs():
    with pytest.raises(ValueError):
        kl_distillation(torch.randn(3, 4), torch.randn(3, 5))
    with pytest.raises(ValueError):
        kl_distillation(torch.randn(3, 4), torch.randn(3, 4), temperature=0.0)


def test_mse_distillation_is_the_mean_squared_difference_of_the_softmax_maps():
    # two pixels, two classes: softmax([0, 0]) = (.5, .5), softmax([0, ln 3]) = (.25, .75)
    student = torch.zeros(1, 2, 1, 2)
    teacher = torch.tensor([[[[0.0, 0.0]], [[0.0, float(torch.log(torch.tensor(3.0)))]]]])
    # squared differences: pixel 1: 0, 0; pixel 2: (.5 - .25)^2 = (.5 - .75)^2 = 1/16; mean over 4 entries
    expected = torch.tensor(2 / 16 / 4)
    torch.testing.assert_close(mse_distillation(student, teacher), expected)
    torch.testing.assert_close(distillation(student, teacher, "mse"), expected)
    torch.testing.assert_close(distillation(student, teacher, "kl"), kl_distillation(student, teacher))


def test_mse_distillation_gives_no_gradient_to_the_teacher_and_rejects_bad_inputs():
    student = torch.randn(3, 2, requires_grad=True)
    teacher = torch.randn(3, 2, requires_grad=True)
    mse_distillation(student, teacher).backward()
    assert teacher.grad is None and student.grad is not None
    with pytest.raises(ValueError, match="same"):
        mse_distillation(torch.randn(3, 4), torch.randn(3, 5))
    with pytest.raises(ValueError, match="distillation must be one of"):
        distillation(torch.randn(3, 4), torch.randn(3, 4), "l1")
    assert DISTILLATIONS == ("kl", "mse")  # the paper's first: the default


def test_a_deputy_pair_caps_its_phase_to_the_allowed_ones_and_weights_its_distillation():
    pair = DeputyPair(torch.nn.Linear(2, 3), torch.nn.Linear(2, 3), phases=[R, S])
    assert pair.phases == (R, S)
    pair.receive_state({k: torch.zeros_like(v) for k, v in pair.personal.state_dict().items()})
    assert pair.phase(1.0, 1.0) == R  # just downloaded
    assert pair.phase(1.0, 1.0) == R  # Exchange is not allowed: the closest allowed phase below it
    z_p, z_d = torch.randn(4, 3), torch.randn(4, 3)
    extra_p, extra_d = pair.distillation(z_p, z_d, "mse", weight=10.0)
    assert float(extra_p) == 0.0 and torch.equal(extra_d, 10.0 * mse_distillation(z_d, z_p))
    only_exchange = DeputyPair(torch.nn.Linear(2, 3), torch.nn.Linear(2, 3), phases=[2])
    assert only_exchange.phase(0.0, 0.0, just_downloaded=True) == E  # Recover is not allowed: the lowest allowed one
    with pytest.raises(ValueError, match="at least one allowed phase"):
        DeputyPair(torch.nn.Linear(2, 3), torch.nn.Linear(2, 3), phases=())


def test_a_deputy_pair_told_which_weights_are_first_loads_them_as_such():
    pair = DeputyPair(torch.nn.Linear(2, 3), torch.nn.Linear(2, 3))
    weights = {k: torch.ones_like(v) for k, v in pair.personal.state_dict().items()}
    assert pair.receive_state(weights, first=False) is False  # to the deputy only, though none was received before
    assert torch.equal(pair.deputy.weight, weights["weight"]) and not torch.equal(pair.personal.weight, weights["weight"])
    assert pair.receive_state(weights, first=True) is True and torch.equal(pair.personal.weight, weights["weight"])
