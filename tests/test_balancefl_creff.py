"""BalanceFL, a competitor of FCA's Table 4 with a rule beyond a local loss: each distinguishing rule against values
worked out by hand on a small example, and a short federation on the synthetic Fed-ISIC2019 (sites that lack classes)
through the server core."""

from __future__ import annotations

import math

import pytest
import torch
from conftest import make_runtime
from test_federation import honest_answers

from prrfl.config import ConfigError, RunConfig
from prrfl.messages import Download
from prrfl.methods.balancefl import (
    augmentation_probabilities,
    balanced_resample,
    balanced_sample_weights,
    covariance_factor,
    inheritance_distillation,
    masked_cross_entropy,
    pooled_class_covariance,
)
from prrfl.registry import build_method, validate_config
from prrfl.tasks.base import Split

COUNTS = [20, 20, 20]


def initial(task, round_idx: int = 0) -> Download:
    torch.manual_seed(0)
    return Download(params=task.build_model().state_dict(), round=round_idx, global_class_counts=COUNTS)


# ----- BalanceFL: what it applies to ------------------------------------------------------------------------------
def test_balancefl_refuses_a_run_wide_balanced_softmax():
    with pytest.raises(ConfigError, match="BalanceFL samples class-balanced batches; class_loss=balanced_softmax would correct"):
        validate_config({"task": "isic2019", "method": "balancefl", "class_loss": "balanced_softmax"})


# ----- BalanceFL: inter-class balancing ------------------------------------------------------------------------
def test_the_balanced_sampler_draws_every_class_the_site_holds_alike_by_hand():
    # counts [3, 1, 2]: a sample of class c is drawn with probability 1 / (3 n_c)
    weights = balanced_sample_weights(torch.tensor([0, 0, 0, 1, 2, 2]), 3)
    torch.testing.assert_close(weights, torch.tensor([1 / 9, 1 / 9, 1 / 9, 1 / 3, 1 / 6, 1 / 6], dtype=torch.float64))
    # a class the site lacks takes no share: counts [2, 0, 1] -> 1 / (2 n_c)
    torch.testing.assert_close(balanced_sample_weights(torch.tensor([0, 0, 2]), 3), torch.tensor([0.25, 0.25, 0.5], dtype=torch.float64))


def test_a_balanced_resample_keeps_each_image_with_its_label_and_evens_the_classes():
    targets = torch.tensor([0] * 90 + [1] * 9 + [2])  # 90 : 9 : 1
    images = (
        targets.to(torch.uint8)[:, None, None, None].expand(100, 1, 2, 2) * 10
        + torch.arange(100, dtype=torch.uint8)[:, None, None, None] % 10
    )
    drawn = balanced_resample(Split(images, targets), 3, torch.Generator().manual_seed(0))
    assert len(drawn) == 100
    batch = torch.arange(100)
    assert torch.equal(drawn.images[batch][:, 0, 0, 0] // 10, drawn.targets)  # the images travel with their labels
    shares = torch.bincount(drawn.targets, minlength=3) / 100
    assert shares.min() > 0.2 and shares.max() < 0.47  # about a third each (the natural shares: 0.9, 0.09, 0.01)


def test_feature_augmentation_probabilities_and_the_pooled_covariance_by_hand():
    torch.testing.assert_close(augmentation_probabilities([10, 5, 2]), torch.tensor([0.0, 0.5, 0.8], dtype=torch.float64))
    embeddings = torch.tensor([[0.0, 0.0], [2.0, 0.0], [1.0, 3.0], [1.0, 1.0], [3.0, 3.0], [5.0, 5.0]])
    labels = torch.tensor([0, 0, 0, 1, 1, 2])
    # class 0: Cov [[1, 0], [0, 3]]; class 1: [[2, 2], [2, 2]]; class 2 (one sample): 0 -> (3 Cov_0 + 2 Cov_1) / 6
    expected = torch.tensor([[7.0, 4.0], [4.0, 13.0]], dtype=torch.float64) / 6
    covariance = pooled_class_covariance(embeddings, labels, 3)
    torch.testing.assert_close(covariance, expected)
    factor = covariance_factor(covariance)
    torch.testing.assert_close(factor @ factor.T, expected)


# ----- BalanceFL: knowledge inheritance ---------------------------------------------------------------------------
def test_knowledge_inheritance_distils_only_the_missing_classes_at_temperature_t_by_hand():
    student, teacher = torch.tensor([[0.0, 1.0, 2.0, 9.0]]), torch.tensor([[5.0, 3.0, 1.0, -4.0]])
    missing = torch.tensor([False, True, True, False])
    # T = 2 over classes 1 and 2: student (0.5, 1), teacher (1.5, 0.5)
    q_t = [1 / (1 + math.exp(-1)), 1 / (1 + math.exp(1))]
    q_s = [1 / (1 + math.exp(0.5)), 1 / (1 + math.exp(-0.5))]
    hand = sum(t * math.log(t / s) for t, s in zip(q_t, q_s))
    assert float(inheritance_distillation(student, teacher, missing, 2.0)) == pytest.approx(hand, rel=1e-6)
    one = torch.tensor([False, True, False, False])  # a softmax over one class is 1 for both: nothing to distil
    assert float(inheritance_distillation(student, teacher, one, 2.0)) == 0.0
    # the cross entropy leaves the missing classes out of its softmax: -log(e^0 / (e^0 + e^9))
    assert float(masked_cross_entropy(student, torch.tensor([0]), ~missing)) == pytest.approx(math.log(1 + math.exp(9)), rel=1e-6)


def test_balancefls_local_loss_is_the_masked_cross_entropy_plus_lam_times_the_distillation_from_the_download(tiny_task, tmp_path):
    args = {"lam": 0.5, "feature_augmentation": False, "missing": "batch"}
    site = make_runtime(tiny_task, tmp_path, method="balancefl", local_epochs=1, eval_test_every_epoch=False, method_args=args)
    method, model = site.method, site.models["local"]
    method.on_download(site.view(), initial(tiny_task), first=True)
    torch.manual_seed(1)
    with torch.no_grad():  # the local model moves away from the download, which stays the teacher
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    inputs, targets = torch.randn(4, 3, 8, 8), torch.tensor([0, 0, 1, 0])
    model.train()
    out = model(inputs)
    method.inputs = inputs
    loss = method.losses(site.view(), targets, {"local": out})["local"]
    method.inputs = None
    teacher = tiny_task.build_model()
    teacher.load_state_dict(initial(tiny_task).params)
    teacher.eval()
    # the batch holds classes a and b: c alone is missing, so nothing to distil; the CE is over a and b
    expected = torch.nn.functional.cross_entropy(out[0][:, :2], targets)
    torch.testing.assert_close(loss, expected)
    one_class = torch.tensor([0, 0, 0, 0])  # b and c missing: CE over one class is 0, the distillation is all
    out = model(inputs)
    method.inputs = inputs
    loss = method.losses(site.view(), one_class, {"local": out})["local"]
    method.inputs = None
    kd = inheritance_distillation(out[0], teacher(inputs)[0], torch.tensor([False, True, True]), 2.0)
    torch.testing.assert_close(loss, 0.5 * kd)
    assert float(kd.detach()) > 0


def test_balancefl_options_and_their_refusals(tiny_task):
    method = build_method(RunConfig(task="tiny", method="balancefl"), tiny_task)
    assert (method.lam, method.temperature, method.missing, method.entropy_weight) == (1.0, 2.0, "site", 0.0)
    assert method.balanced_sampling and method.feature_augmentation
    with pytest.raises(ValueError, match="BalanceFL options need"):
        build_method(RunConfig(task="tiny", method="balancefl", method_args={"temperature": 0.0}), tiny_task)


# ----- end to end: a short federation on the synthetic Fed-ISIC2019 --------------------------------------------------
def isic2019_federation(tmp_path, method: str, method_args: dict) -> tuple:
    """2 rounds x 1 epoch of `method` over three of the synthetic Fed-ISIC2019 centres at 1 % of FLamby's counts,
    32 px (HAM_rosendahl with every class, 20 training images; MSK lacking five, HAM_vienna_dias two), through the
    server core's checks and aggregation: the federation, its last state, the sites with their logged scalars, and
    each round's answers and outcome."""
    from prrfl.flare.jobs import job_config
    from prrfl.messages import PrepareReply
    from prrfl.registry import build_task
    from prrfl.server.federation import Federation
    from prrfl.site.state import SiteRuntime

    quick = job_config(f"isic2019_{method}").to_dict()
    changes = {"num_rounds": 2, "local_epochs": 1, "eval_test_every_epoch": False, "method_args": method_args}
    cfg = RunConfig.from_dict({**quick, **changes, "data": {"image_size": 32, "synthetic_scale": 0.01}})
    task = build_task(cfg)
    fed = Federation(cfg, task, build_method(cfg, task))
    runtimes, scalars = {}, {}
    for cohort in ("HAM_rosendahl", "MSK", "HAM_vienna_dias"):
        scalars[cohort] = []
        runtimes[cohort] = SiteRuntime.start(
            cohort,
            cfg,
            task,
            build_method(cfg, task),
            task.load_site(cohort, torch.device("cpu"), None),
            tmp_path / cohort,
            model_seed=0,
            run_id="run",
            log_scalar=lambda tag, value, step, logged=scalars[cohort]: logged.append((tag, value)),
        )
    replies = {
        c: PrepareReply(cohort=c, num_train=r.data.num_train, class_counts=r.data.class_counts, state_dir=str(tmp_path / c))
        for c, r in runtimes.items()
    }
    state = fed.start(replies, {}, {}, list(runtimes), run_id="run").state
    rounds = []
    for round_idx in range(cfg.num_rounds):
        answers = honest_answers(fed, state, round_idx, runtimes)
        outcome = fed.round(state, round_idx, answers)
        assert outcome.stop is None and outcome.summary.rejected == {}, outcome.summary.rejected
        state = outcome.state
        rounds.append((answers, outcome))
    return fed, state, runtimes, scalars, rounds


@pytest.mark.parametrize("method, args", [("balancefl", {})])
def test_a_short_isic2019_federation_of_sites_that_lack_classes_runs_through_the_server_core(tmp_path, method, args):
    fed, state, runtimes, scalars, rounds = isic2019_federation(tmp_path, method, args)
    assert [r.data.class_counts.count(0) for r in runtimes.values()] == [0, 5, 2]  # the classes each site lacks
    for cohort, runtime in runtimes.items():
        losses = [value for tag, value in scalars[cohort] if tag.startswith("loss/")]
        assert len(losses) == 2 and all(math.isfinite(v) for v in losses), cohort
        assert runtime.best is not None and runtime.best["round"] == 0  # round 0's global model, scored at the round-1 download
        assert math.isfinite(runtime.best["test"]["bacc"])
    _, glob, _ = fed.results(state)
    _, outcome = rounds[-1]
    last = outcome.downloads
    assert all(torch.equal(glob[k], v) for k, v in last["MSK"].params.items())  # FedAvg's global model
