"""BalanceFL and CReFF, FCA's Table 4 competitors with a rule beyond a local loss: each distinguishing rule against
values worked out by hand on a small example, the server's refusal of a CReFF site's bad class gradients, and a
short federation of each on the synthetic Fed-ISIC2019 (sites that lack classes) through the server core."""

from __future__ import annotations

import math

import pytest
import torch
from conftest import make_runtime
from test_federation import federation, honest_answers, started
from test_hostile_uploads import assert_c_alone_rejected, site_result

from prrfl.algorithms import federated_features as ff
from prrfl.config import ConfigError, RunConfig
from prrfl.flare.components import Answers
from prrfl.flare.server_workflow import round_answers
from prrfl.keys import CLASS_GRADIENT_PRESENT, CLASS_GRADIENTS, GRADIENT_CLASSIFIER_ROUND, MATCH_LOSS, RETRAINED_CLASSIFIER, RETRAINED_ROUND
from prrfl.messages import Download, Upload
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
from prrfl.tasks.contract import Split

COUNTS = [20, 20, 20]
CHEAP_CREFF = {"features_per_class": 4, "match_steps": 5, "retrain_epochs": 3, "gradient_draws": 2}


def initial(task, round_idx: int = 0) -> Download:
    torch.manual_seed(0)
    return Download(params=task.build_model().state_dict(), round=round_idx, global_class_counts=COUNTS)


# ----- both: what they apply to ----------------------------------------------------------------------------------
def test_balancefl_refuses_a_run_wide_balanced_softmax_and_creff_takes_it_for_the_local_training(tiny_task):
    with pytest.raises(ConfigError, match="BalanceFL samples class-balanced batches; class_loss=balanced_softmax would correct"):
        validate_config({"task": "isic2019", "method": "balancefl", "class_loss": "balanced_softmax"})
    cfg = validate_config({"task": "isic2019", "method": "creff", "class_loss": "balanced_softmax"})
    site = type("Site", (), {"class_counts": [6, 3, 1], "memory": {}})()
    logits, targets = torch.tensor([[1.0, 0.0, 0.0], [0.0, 2.0, 0.0]]), torch.tensor([0, 1])
    creff = build_method(RunConfig.from_dict({**cfg.to_dict(), "task": "tiny"}), tiny_task)
    prior = torch.tensor([0.6, 0.3, 0.1]).log()
    torch.testing.assert_close(creff.supervised_loss(site, logits, targets), torch.nn.functional.cross_entropy(logits + prior, targets))


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


# ----- CReFF: the server's gradient matching and re-training -------------------------------------------------------
def test_the_gradient_distance_sums_one_minus_the_cosine_of_each_row_and_of_the_bias_by_hand():
    synthetic = [torch.tensor([[1.0, 0.0], [0.0, 1.0]]), torch.tensor([1.0, 0.0])]
    real = [torch.tensor([[2.0, 0.0], [1.0, 1.0]]), torch.tensor([0.0, 3.0])]
    # rows: cos 1 and 1/sqrt(2) (with the 1e-6 of the norms' product); bias: orthogonal
    hand = (1 - 2 / (2 + 1e-6)) + (1 - 1 / (math.sqrt(2) + 1e-6)) + 1
    assert float(ff.gradient_distance(synthetic, real)) == pytest.approx(hand, rel=1e-6)


def test_a_class_gradient_is_the_mean_of_softmax_minus_onehot_times_the_feature_by_hand():
    classifier = [torch.tensor([[1.0, 0.0], [0.0, 1.0]])]
    features = torch.tensor([[1.0, 0.0], [0.0, 2.0]])  # both of class 0
    p1, p2 = math.e / (math.e + 1), 1 / (1 + math.e**2)  # softmax_0 of logits (1, 0) and (0, 2)
    # dW = mean_i (p_i - e_0) z_i^T: row 0 = ((p1 - 1) z1 + (p2 - 1) z2) / 2, row 1 = ((1 - p1) z1 + (1 - p2) z2) / 2
    hand = torch.tensor([[(p1 - 1) / 2, (p2 - 1)], [(1 - p1) / 2, (1 - p2)]])
    torch.testing.assert_close(ff.class_gradient(classifier, features, 0)[0], hand)


def test_one_matching_step_moves_a_federated_feature_by_hand():
    # at a zero classifier the softmax is (1/2, 1/2) whatever the feature: class 0's gradient rows are -z/2 and z/2, so
    # the distance to the real rows of z* = (1, 1) is 2 (1 - cos(z, z*)), whose gradient at z = (1, 0) is (0, -sqrt 2)
    classifier = [torch.zeros(2, 2)]
    real = {0: ff.class_gradient(classifier, torch.tensor([[1.0, 1.0]]), 0)}
    features = torch.tensor([[[1.0, 0.0]], [[0.0, 1.0]]])  # m = 1 per class; class 1 has no real gradient
    moved, losses = ff.match_features(features, classifier, real, steps=1, lr=0.1)
    assert losses[0] == pytest.approx(2 * (1 - 1 / math.sqrt(2)), rel=1e-5)
    torch.testing.assert_close(moved[0], torch.tensor([[1.0, 0.1 * math.sqrt(2)]]), atol=1e-5, rtol=0)
    assert torch.equal(moved[1], features[1])  # no gradient of class 1 this round: its feature stays
    assert losses[1] < losses[0]
    many, losses = ff.match_features(features, classifier, real, steps=300, lr=0.1)
    assert losses[-1] < 1e-4 and float(torch.nn.functional.cosine_similarity(many[0], torch.ones(1, 2))) > 0.9999


def test_one_retraining_step_of_the_classifier_on_a_two_class_toy_by_hand():
    features = torch.tensor([[[1.0, 0.0]], [[0.0, 1.0]]])  # class 0 at e_1, class 1 at e_2
    # from W = 0 the softmax is (1/2, 1/2): dW = mean over both of (p - onehot) f^T = [[-1/4, 1/4], [1/4, -1/4]]
    (weight,) = ff.retrain_classifier(features, [torch.zeros(2, 2)], epochs=1, lr=1.0, batch_size=2, generator=torch.Generator())
    torch.testing.assert_close(weight, torch.tensor([[0.25, -0.25], [-0.25, 0.25]]))


def test_the_class_gradients_are_averaged_over_the_sites_that_hold_the_class_each_alike():
    rows = torch.tensor([[[2.0], [0.0]], [[4.0], [6.0]]])  # site A lacks class 1
    present = torch.tensor([[True, False], [True, True]])
    assert {c: float(v) for c, v in ff.average_class_gradients(rows, present).items()} == {0: 3.0, 1: 6.0}


# ----- CReFF: the server's round -----------------------------------------------------------------------------------
def _creff(tiny_task, **args):
    return build_method(RunConfig(task="tiny", method="creff", method_args={**CHEAP_CREFF, **args}), tiny_task)


def _upload(method, site, gradient, at_round=-1, counts=(10, 10, 10)) -> Upload:
    torch.manual_seed(len(site))
    params = {k: torch.randn_like(v) if v.is_floating_point() else v for k, v in method.reference_model.state_dict().items()}
    meta = {
        CLASS_GRADIENTS: [[gradient] * 24 if n else [0.0] * 24 for n in counts],
        CLASS_GRADIENT_PRESENT: [n > 0 for n in counts],
        GRADIENT_CLASSIFIER_ROUND: at_round,
    }
    return Upload(site, params, sum(counts), list(counts), meta)


def test_the_server_sends_the_fedavg_model_with_a_classifier_retrained_on_features_matched_to_the_current_gradients(tiny_task):
    method = _creff(tiny_task)
    a, b = _upload(method, "A", 0.1), _upload(method, "B", -0.3, counts=(10, 0, 5))
    server: dict = {}
    downloads = method.aggregate([a, b], 0, server)
    average = method.average([a, b])
    assert all(torch.equal(downloads["A"].params[k], v) for k, v in average.items())  # the sites train from FedAvg's
    meta = downloads["B"].meta
    assert meta[RETRAINED_ROUND] == 0 and server["classifier_round"] == 0 and len(meta[RETRAINED_CLASSIFIER]) == 24
    assert server["features"].shape == (3, 4, 8) and meta[MATCH_LOSS][1] < meta[MATCH_LOSS][0]
    glob = method.global_params(downloads)  # the global model: FedAvg's with the re-trained classifier
    assert torch.equal(glob["fc2.weight"], torch.tensor(meta[RETRAINED_CLASSIFIER]).reshape(3, 8))
    assert all(torch.equal(glob[k], v) for k, v in average.items() if k != "fc2.weight")
    # the same uploads and seed: the same numbers (a resumed server continues from its saved state)
    again = method.aggregate([a, b], 0, {})
    assert again["A"].meta == downloads["A"].meta
    # a site whose gradients were taken at another classifier (an older download) counts in the average only
    stale = _upload(method, "B", 5.0, at_round=7, counts=(10, 0, 5))
    alone = _upload(method, "B", -9.0, at_round=7, counts=(10, 0, 5))
    assert method.aggregate([a, stale], 0, {})["A"].meta == method.aggregate([a, alone], 0, {})["A"].meta
    # round 1 matches at round 0's re-trained classifier: the gradients taken at it
    later = method.aggregate([_upload(method, "A", 0.1, at_round=0), _upload(method, "B", 0.2, at_round=0)], 1, server)
    assert later["A"].meta[RETRAINED_ROUND] == 1 and MATCH_LOSS in later["A"].meta


def test_a_creff_site_reports_its_gradients_at_the_retrained_classifier_and_trains_from_the_averaged_one(tiny_task, tmp_path):
    site = make_runtime(tiny_task, tmp_path, method="creff", local_epochs=1, eval_test_every_epoch=False, method_args=CHEAP_CREFF)
    method, model = site.method, site.models["local"]
    download = initial(tiny_task, round_idx=1)
    retrained = torch.linspace(-1, 1, 24)
    download.meta = {RETRAINED_CLASSIFIER: retrained.tolist(), RETRAINED_ROUND: 0}
    method.on_download(site.view(), download, first=True)
    assert torch.equal(model.state_dict()["fc2.weight"], retrained.reshape(3, 8))  # scored as the global model
    rows, present, at_round = site.memory["class_gradients"]
    assert at_round == 0 and present.tolist() == [True, True, True]
    # the tiny task's augmentation is deterministic: each draw of up to 32 of a class's 10 images is the whole class
    model.eval()
    with torch.no_grad():
        embedding = model(site.task.eval_transform(site.data.train.images, site.data.train.targets)[0])[1]
    for c in range(3):
        hand = ff.class_gradient([retrained.reshape(3, 8)], embedding[site.data.train.targets == c], c)[0]
        torch.testing.assert_close(rows[c].float(), hand.reshape(-1), rtol=1e-5, atol=1e-6)
    method.before_epoch(site.view(), 0)  # the local update starts from the averaged classifier
    assert torch.equal(model.state_dict()["fc2.weight"], download.params["fc2.weight"])
    upload = method.upload(site.view())
    assert upload.meta[GRADIENT_CLASSIFIER_ROUND] == 0 and upload.meta[CLASS_GRADIENTS] == rows.tolist()
    assert method.upload_meta_problem(upload) is None


# what a hostile CReFF site sends in its method meta -> the reason
HOSTILE_GRADIENTS = {
    "no gradients": (lambda meta: {}, "it sends no class gradients"),
    "a NaN": (lambda meta: {**meta, CLASS_GRADIENTS: [[math.nan] * 24] * 3}, "class_gradients hold NaN or Inf"),
    # finite, but its norm 1e38 * sqrt(24) = 4.9e38 is above float32's largest 3.4e38: the server's cosines would be Inf
    "a huge finite row": (lambda meta: {**meta, CLASS_GRADIENTS: [[1e38] * 24] * 3}, "norm overflows float32 (largest 4.9e+38)"),
    "rows of another width": (lambda meta: {**meta, CLASS_GRADIENTS: [[0.1] * 25] * 3}, "class_gradient rows must hold 24 numbers, got 25"),
    "too few rows": (lambda meta: {**meta, CLASS_GRADIENTS: [[0.1] * 24] * 2}, "class_gradients must have one row per class (3)"),
    "strings": (lambda meta: {**meta, CLASS_GRADIENTS: [["a"] * 24] * 3}, "class_gradients must be numbers, got a str"),
    "a class it does not hold": (
        lambda meta: {**meta, CLASS_GRADIENT_PRESENT: [True, True, False]},
        "class_gradient_present [True, True, False] does not flag the classes of its class counts",
    ),
    "a round that is not one": (
        lambda meta: {**meta, GRADIENT_CLASSIFIER_ROUND: "0"},
        "gradient_classifier_round must be an integer >= -1",
    ),
}


@pytest.mark.parametrize("name", HOSTILE_GRADIENTS)
def test_a_round_rejects_a_creff_sites_bad_class_gradients_by_name_and_goes_on_with_the_others(tiny_task, name):
    change, reason = HOSTILE_GRADIENTS[name]
    fed = federation(tiny_task, method="creff", min_sites=2, method_args=CHEAP_CREFF)
    state = started(fed, tiny_task, ("A", "B", "C"))
    good = {k: torch.full_like(v, 1e-3) for k, v in fed.reference().items()}
    meta = {CLASS_GRADIENTS: [[0.1] * 24] * 3, CLASS_GRADIENT_PRESENT: [True] * 3, GRADIENT_CLASSIFIER_ROUND: -1}
    results = {s: site_result(state, s, dict(good), method_meta=meta) for s in ("A", "B")}
    honest = fed.round(state, 0, round_answers(Answers(results=dict(results), seconds=dict.fromkeys(results, 1.0))))
    results["C"] = site_result(state, "C", dict(good), method_meta=change(meta))
    outcome = fed.round(state, 0, round_answers(Answers(results=results, seconds=dict.fromkeys(results, 1.0))))
    assert_c_alone_rejected(outcome, honest, reason)


def test_creff_options_and_their_refusals(tiny_task):
    method = build_method(RunConfig(task="tiny", method="creff"), tiny_task)
    assert (method.features_per_class, method.match_steps, method.feature_lr) == (100, 100, 0.1)
    assert (method.retrain_epochs, method.retrain_lr, method.retrain_batch_size) == (300, 0.01, 32)
    assert (method.gradient_draws, method.gradient_batch_size) == (10, 32)
    with pytest.raises(ValueError, match="CReFF options need"):
        _creff(tiny_task, feature_lr=0.0)


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


@pytest.mark.parametrize("method, args", [("balancefl", {}), ("creff", CHEAP_CREFF)])
def test_a_short_isic2019_federation_of_sites_that_lack_classes_runs_through_the_server_core(tmp_path, method, args):
    fed, state, runtimes, scalars, rounds = isic2019_federation(tmp_path, method, args)
    assert [r.data.class_counts.count(0) for r in runtimes.values()] == [0, 5, 2]  # the classes each site lacks
    for cohort, runtime in runtimes.items():
        losses = [value for tag, value in scalars[cohort] if tag.startswith("loss/")]
        assert len(losses) == 2 and all(math.isfinite(v) for v in losses), cohort
        assert runtime.best is not None and runtime.best["round"] == 0  # round 0's global model, scored at the round-1 download
        assert math.isfinite(runtime.best["test"]["bacc"])
    _, glob, _ = fed.results(state)
    answers, outcome = rounds[-1]
    last = outcome.downloads
    if method == "creff":
        for cohort, upload in answers.uploads.items():  # round 1's gradients, at round 0's re-trained classifier
            assert upload.meta[GRADIENT_CLASSIFIER_ROUND] == 0
            assert upload.meta[CLASS_GRADIENT_PRESENT] == [n > 0 for n in runtimes[cohort].data.class_counts]
        loss = last["MSK"].meta[MATCH_LOSS]
        assert loss[1] < loss[0]
        retrained = torch.tensor(last["MSK"].meta[RETRAINED_CLASSIFIER]).reshape(8, 64)
        assert torch.equal(glob["fc2.weight"], retrained) and not torch.equal(retrained, last["MSK"].params["fc2.weight"])
        assert all(torch.equal(glob[k], v) for k, v in last["MSK"].params.items() if k != "fc2.weight")
    else:
        assert all(torch.equal(glob[k], v) for k, v in last["MSK"].params.items())  # FedAvg's global model
