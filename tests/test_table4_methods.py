"""The rules that distinguish FCA's Table 4 competitors (Local Learning, FedLC, FedRS, MOON, FedRep, FedBABU), each
against values worked out by hand on a small example."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch
from conftest import make_runtime

from prrfl.config import ConfigError, RunConfig
from prrfl.messages import Download, Upload
from prrfl.methods.label_skew import calibrated_cross_entropy, restricted_logits
from prrfl.methods.moon import model_contrastive_loss
from prrfl.registry import build_method
from prrfl.site.trainer import run_round

COUNTS = [20, 20, 20]


def initial(task, round_idx: int = 0) -> Download:
    torch.manual_seed(0)
    return Download(params=task.build_model().state_dict(), round=round_idx, global_class_counts=COUNTS)


def state(model) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


@pytest.mark.parametrize("name", ["fedlc", "fedrs", "moon", "fedrep", "fedbabu", "balancefl", "creff"])
def test_the_classification_methods_refuse_segmentation(name, tiny_seg_task):
    with pytest.raises(ConfigError, match=f"method '{name}' cannot run on task 'tinyseg'"):
        build_method(RunConfig(task="tinyseg", method=name), tiny_seg_task)


@pytest.mark.parametrize("name", ["fedlc", "fedrs"])
def test_the_loss_methods_refuse_a_run_wide_balanced_softmax_that_would_replace_their_rule(name):
    from prrfl.registry import validate_config

    with pytest.raises(ConfigError, match="rule is its classification loss; class_loss=balanced_softmax would replace it"):
        validate_config({"task": "derm", "method": name, "class_loss": "balanced_softmax"})


# ----- Local Learning --------------------------------------------------------------------------------------------
def test_local_learning_shares_nothing_and_keeps_each_sites_model(tiny_task, tmp_path):
    site = make_runtime(tiny_task, tmp_path, method="local", local_epochs=1, eval_test_every_epoch=False)
    run_round(site, initial(tiny_task), 0)
    upload = site.method.upload(site.view())
    assert upload.params == {} and upload.class_counts == [10, 10, 10]
    other = Upload(site="B", params={}, num_train=30, class_counts=[10, 10, 10])
    downloads = site.method.aggregate([upload, other], 0, {})
    assert {k: d.params for k, d in downloads.items()} == {"A": {}, "B": {}}
    trained = state(site.models["local"])
    # a later download, even one that carried weights, leaves the site's model as it is
    site.method.on_download(site.view(), initial(tiny_task, 1), first=False)
    assert all(torch.equal(v, trained[k]) for k, v in site.models["local"].state_dict().items())
    assert not torch.equal(trained["fc2.weight"], initial(tiny_task).params["fc2.weight"])  # it did train


# ----- FedLC -----------------------------------------------------------------------------------------------------
def test_fedlc_subtracts_tau_times_the_count_to_the_minus_quarter_by_hand(tiny_task):
    logits, labels = torch.tensor([[1.0, 0.0, 0.0], [0.0, 1.0, 3.0]]), torch.tensor([0, 1])
    counts = [16, 1, 0]  # shifts 16^-1/4 = 0.5, 1^-1/4 = 1, class 2 absent: out of the softmax
    # sample 1: calibrated (0.5, -1, -inf) -> -log(e^0.5 / (e^0.5 + e^-1)) = log(1 + e^-1.5)
    # sample 2: calibrated (-0.5, 0, -inf) -> -log(e^0 / (e^-0.5 + e^0)) = log(1 + e^-0.5)
    hand = (math.log(1 + math.exp(-1.5)) + math.log(1 + math.exp(-0.5))) / 2
    assert float(calibrated_cross_entropy(logits, labels, counts, tau=1.0)) == pytest.approx(hand, rel=1e-6)
    # tau = 2 on sample 1: (1 - 1, 0 - 2) -> log(1 + e^-2)
    assert float(calibrated_cross_entropy(logits[:1], labels[:1], counts, tau=2.0)) == pytest.approx(math.log(1 + math.exp(-2)), rel=1e-6)
    # tau = 0 is plain cross entropy over every class: -log(e^1 / (e^1 + 2))
    assert float(calibrated_cross_entropy(logits[:1], labels[:1], counts, tau=0.0)) == pytest.approx(math.log(1 + 2 / math.e), rel=1e-6)
    fedlc = build_method(RunConfig(task="tiny", method="fedlc"), tiny_task)
    assert fedlc.tau == 1.0
    loss = fedlc.supervised_loss(SimpleNamespace(class_counts=counts), logits, labels)
    assert float(loss) == pytest.approx(hand, rel=1e-6)


# ----- FedRS -----------------------------------------------------------------------------------------------------
def test_fedrs_scales_the_logits_of_the_classes_a_site_lacks_by_alpha_by_hand(tiny_task):
    logits, labels = torch.tensor([[2.0, 4.0, 1.0]]), torch.tensor([0])
    counts = [3, 0, 5]  # class 1 missing: its logit 4 -> 0.5 * 4 = 2
    torch.testing.assert_close(restricted_logits(logits, counts, 0.5), torch.tensor([[2.0, 2.0, 1.0]]))
    fedrs = build_method(RunConfig(task="tiny", method="fedrs"), tiny_task)
    assert fedrs.alpha == 0.5
    hand = -math.log(math.exp(2) / (2 * math.exp(2) + math.exp(1)))  # = log(2 + e^-1)
    assert float(fedrs.supervised_loss(SimpleNamespace(class_counts=counts), logits, labels)) == pytest.approx(hand, rel=1e-6)
    # alpha = 1 (or a site with every class) is plain cross entropy: -log(e^2 / (e^2 + e^4 + e^1))
    plain = -math.log(math.exp(2) / (math.exp(2) + math.exp(4) + math.exp(1)))
    fedrs1 = build_method(RunConfig(task="tiny", method="fedrs", method_args={"alpha": 1.0}), tiny_task)
    assert float(fedrs1.supervised_loss(SimpleNamespace(class_counts=counts), logits, labels)) == pytest.approx(plain, rel=1e-6)


# ----- MOON ------------------------------------------------------------------------------------------------------
def test_moon_contrastive_term_by_hand():
    z = torch.tensor([[1.0, 0.0], [1.0, 1.0]])
    z_glob = torch.tensor([[2.0, 0.0], [1.0, 0.0]])  # cosines 1 and 1/sqrt(2)
    z_prev = torch.tensor([[0.0, 3.0], [0.0, 1.0]])  # cosines 0 and 1/sqrt(2)
    # T = 0.5: sample 1 -log(e^2 / (e^2 + e^0)) = log(1 + e^-2); sample 2: equal similarities, log 2
    hand = (math.log(1 + math.exp(-2)) + math.log(2)) / 2
    assert float(model_contrastive_loss(z, z_glob, z_prev, 0.5)) == pytest.approx(hand, rel=1e-6)
    # T = 1 on sample 1: log(1 + e^-1)
    assert float(model_contrastive_loss(z[:1], z_glob[:1], z_prev[:1], 1.0)) == pytest.approx(math.log(1 + math.exp(-1)), rel=1e-6)


def test_moon_contrasts_with_the_received_global_model_and_the_sites_previous_model(tiny_task, tmp_path):
    site = make_runtime(tiny_task, tmp_path, method="moon", local_epochs=1, eval_test_every_epoch=False, method_args={"mu": 2.0})
    moon, model = site.method, site.models["local"]
    assert (moon.mu, moon.temperature) == (2.0, 0.5)
    run_round(site, initial(tiny_task), 0)
    assert "previous" not in moon.frozen["A"]  # the first round has no previous model: the term is 0
    previous = state(model)
    torch.manual_seed(1)
    received = {k: v.clone() for k, v in tiny_task.build_model().state_dict().items()}
    moon.on_download(site.view(), Download(params=received, round=1), first=False)
    frozen = moon.frozen["A"]
    assert all(torch.equal(frozen["previous"].state_dict()[k], v) for k, v in previous.items())
    assert all(torch.equal(frozen["global"].state_dict()[k], v) for k, v in received.items())
    assert not frozen["global"].training and not any(p.requires_grad for p in frozen["global"].parameters())
    inputs, labels = torch.randn(4, 3, 8, 8), torch.tensor([0, 1, 2, 0])
    model.train()
    moon.inputs = inputs
    out = model(inputs)
    loss = moon.losses(site.view(), labels, {"local": out})["local"]
    moon.inputs = None
    frozen["global"].eval(), frozen["previous"].eval()
    z, zg, zp = out[1], frozen["global"](inputs)[1], frozen["previous"](inputs)[1]
    sg, sp = torch.cosine_similarity(z, zg, dim=1) / 0.5, torch.cosine_similarity(z, zp, dim=1) / 0.5
    term = (-(sg - torch.logsumexp(torch.stack([sg, sp], 1), 1))).mean()
    expected = torch.nn.functional.cross_entropy(out[0], labels) + 2.0 * term
    torch.testing.assert_close(loss, expected)


# ----- FedRep ----------------------------------------------------------------------------------------------------
def test_fedrep_keeps_its_head_and_splits_the_epochs(tiny_task, tmp_path):
    rep = build_method(RunConfig(task="tiny", method="fedrep", local_epochs=3), tiny_task)
    shared = rep.shared_keys(tiny_task.build_model())
    assert "fc2.weight" not in shared and shared == [k for k in tiny_task.build_model().state_dict() if k != "fc2.weight"]
    assert [rep.epoch_parts(e) for e in range(3)] == [("head",), ("head",), ("body",)]  # E - 1 head epochs, 1 body epoch
    one = build_method(RunConfig(task="tiny", method="fedrep", local_epochs=3, method_args={"head_epochs": 1}), tiny_task)
    assert [one.epoch_parts(e) for e in range(3)] == [("head",), ("body",), ("body",)]
    single = build_method(RunConfig(task="tiny", method="fedrep", local_epochs=1), tiny_task)
    assert single.epoch_parts(0) == ("head", "body")  # E = 1: a head step then a body step on every batch
    with pytest.raises(ValueError, match="head_epochs"):
        build_method(RunConfig(task="tiny", method="fedrep", local_epochs=2, method_args={"head_epochs": 3}), tiny_task)


def test_a_fedrep_head_step_moves_the_head_alone_by_minus_lr_times_its_gradient_by_hand(tiny_task, tmp_path):
    site = make_runtime(tiny_task, tmp_path, method="fedrep", lr=0.5, momentum=0.0, weight_decay=0.0)
    site.method.on_download(site.view(), initial(tiny_task), first=True)
    model = site.models["local"].train()
    inputs, labels = torch.randn(4, 3, 8, 8), torch.tensor([0, 1, 2, 0])
    with torch.no_grad():
        _, emb = model(inputs)  # train mode: the same batch statistics as the step's forward
    before = state(model)
    logits = emb @ before["fc2.weight"].T
    # d CE / d W = (softmax - onehot)^T emb / B
    grad = (torch.softmax(logits, 1) - torch.nn.functional.one_hot(labels, 3)).T @ emb / 4
    site.method.parts = ("head",)
    site.method.train_batch(site.view(), inputs, labels)
    after = state(model)
    torch.testing.assert_close(after["fc2.weight"], before["fc2.weight"] - 0.5 * grad)
    assert all(torch.equal(after[k], before[k]) for k in ("conv.weight", "fc1.weight", "bn.weight", "bn.bias"))
    site.method.parts = ("body",)
    head = state(model)["fc2.weight"]
    site.method.train_batch(site.view(), inputs, labels)
    assert torch.equal(model.state_dict()["fc2.weight"], head) and not torch.equal(model.state_dict()["fc1.weight"], after["fc1.weight"])


# ----- FedBABU ---------------------------------------------------------------------------------------------------
def _babu(tiny_task, tmp_path, **args):
    return make_runtime(tiny_task, tmp_path, method="fedbabu", num_rounds=2, local_epochs=1, eval_test_every_epoch=False, method_args=args)


def test_fedbabu_never_trains_nor_shares_its_random_head_before_the_last_round(tiny_task, tmp_path):
    site = _babu(tiny_task, tmp_path)
    assert (site.method.finetune_epochs, site.method.finetune) == (5, "full")
    upload = run_round(site, initial(tiny_task), 0)
    assert "fc2.weight" not in upload.params
    state_now = site.models["local"].state_dict()
    assert torch.equal(state_now["fc2.weight"], initial(tiny_task).params["fc2.weight"])  # the initial random head
    assert not torch.equal(state_now["fc1.weight"], initial(tiny_task).params["fc1.weight"])  # the body trained


@pytest.mark.parametrize("finetune", ["full", "head"])
def test_fedbabu_fine_tunes_at_the_end_and_uploads_the_body_from_before(tiny_task, tmp_path, finetune):
    sites = {n: _babu(tiny_task, tmp_path / str(n), finetune_epochs=n, finetune=finetune) for n in (0, 2)}
    uploads = {n: run_round(s, initial(tiny_task, round_idx=1), 1) for n, s in sites.items()}  # the last round
    init = initial(tiny_task).params["fc2.weight"]
    assert torch.equal(sites[0].models["local"].state_dict()["fc2.weight"], init)  # 0 epochs: the head as it was
    assert not torch.equal(sites[2].models["local"].state_dict()["fc2.weight"], init)  # fine-tuned
    # the same seeds, the same local epochs: the uploads are the body before the fine-tuning
    assert all(torch.equal(uploads[2].params[k], v) for k, v in uploads[0].params.items())
    body_moved = not torch.equal(sites[2].models["local"].state_dict()["fc1.weight"], uploads[2].params["fc1.weight"])
    assert body_moved == (finetune == "full")
