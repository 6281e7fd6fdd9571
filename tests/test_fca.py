"""FCA's distinguishing rules: two heads, balanced softmax, the consistency term's direction, what
travels and what stays."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from conftest import make_runtime

from prrfl.algorithms.losses import balanced_softmax_loss
from prrfl.config import ConfigError, RunConfig
from prrfl.messages import Download
from prrfl.methods.fca import FCA, authors_consistency
from prrfl.registry import build_method
from prrfl.site.trainer import run_round


def test_balanced_softmax_is_cross_entropy_on_logits_shifted_by_the_log_prior():
    logits, targets = torch.tensor([[0.5, -1.0, 2.0], [1.0, 0.0, 0.0]]), torch.tensor([0, 1])
    counts = torch.tensor([6, 3, 1])
    shifted = logits + torch.log(torch.tensor([0.6, 0.3, 0.1]))
    assert float(balanced_softmax_loss(logits, targets, counts)) == pytest.approx(float(F.cross_entropy(shifted, targets)), rel=1e-6)
    # by hand for sample 2: -log(0.3 e^0 / (0.6 e^1 + 0.3 e^0 + 0.1 e^0))
    hand2 = -math.log(0.3 / (0.6 * math.e + 0.3 + 0.1))
    assert float(balanced_softmax_loss(logits[1:], targets[1:], counts)) == pytest.approx(hand2, rel=1e-6)


def test_a_class_the_site_lacks_drops_out_of_the_softmax():
    logits, targets = torch.tensor([[0.0, 5.0, 1.0]]), torch.tensor([0])
    loss = balanced_softmax_loss(logits, targets, torch.tensor([4, 0, 4]))
    hand = -math.log(0.5 / (0.5 + 0.5 * math.e))  # class 1 (count 0) is not in the denominator
    assert float(loss) == pytest.approx(hand, rel=1e-6)
    logits.requires_grad_(True)
    balanced_softmax_loss(logits, targets, torch.tensor([4, 0, 4])).backward()
    assert torch.isfinite(logits.grad).all() and logits.grad[0, 1] == 0


def test_the_authors_prior_keeps_a_missing_class_in_the_softmax_with_weight_1e_9_by_hand():
    logits, targets = torch.tensor([[0.0, 5.0, 1.0]]), torch.tensor([0])
    counts = torch.tensor([4, 0, 4])
    loss = balanced_softmax_loss(logits, targets, counts, prior_epsilon=1e-9)
    # the authors' CE(logits + log(prior + 1e-9)), prior (0.5, 0, 0.5)
    a, m = 0.5 + 1e-9, 1e-9
    hand = -math.log(a / (a + m * math.exp(5.0) + a * math.e))
    assert float(loss) == pytest.approx(hand, rel=1e-6)
    assert float(loss) != pytest.approx(-math.log(0.5 / (0.5 + 0.5 * math.e)), rel=1e-7)  # not the masked value
    logits.requires_grad_(True)
    balanced_softmax_loss(logits, targets, counts, prior_epsilon=1e-9).backward()
    # the missing class's logit gets the gradient of its softmax share, 1e-9 e^5 / denominator
    assert float(logits.grad[0, 1]) == pytest.approx(m * math.exp(5.0) / (a + m * math.exp(5.0) + a * math.e), rel=1e-4)


def test_fca_takes_the_authors_prior_as_an_option(tiny_task, tmp_path):
    assert _fca_site(tiny_task, tmp_path, prior="authors").method.prior_epsilon == 1e-9
    assert _fca_site(tiny_task, tmp_path / "paper").method.prior_epsilon is None
    with pytest.raises(ConfigError, match="prior"):
        _fca_site(tiny_task, tmp_path / "bad", prior="smoothed")


def test_the_authors_consistency_term_takes_probabilities_as_log_probabilities():
    zf, zp = torch.tensor([[1.0, 0.0]]), torch.tensor([[0.0, 2.0]])
    p, q = torch.softmax(zf, 1) + 1e-11, torch.softmax(zp, 1) + 1e-11
    hand = float((q * (q.log() - p)).mean())  # mean over samples and classes of q (log q - p)
    assert float(authors_consistency(zf, zp)) == pytest.approx(hand, rel=1e-6)


def _fca_site(tiny_task, tmp_path, site="A", **args):
    return make_runtime(tiny_task, tmp_path, site=site, method="fca", local_epochs=1, eval_test_every_epoch=False, method_args=args)


def test_the_consistency_gradient_reaches_the_federated_head_and_the_extractor_not_the_personalized_head(tiny_task, tmp_path):
    site = _fca_site(tiny_task, tmp_path, lam_fed=0.0, lam_personal=0.0)  # the consistency term alone
    model = site.models["local"]
    inputs = torch.randn(6, 3, 8, 8)
    loss = site.method.losses(site.view(), torch.arange(6) % 3, {"local": model(inputs)})["local"]
    loss.backward()
    assert model.personal_head.weight.grad is None or torch.count_nonzero(model.personal_head.weight.grad) == 0
    assert torch.count_nonzero(model.base.fc2.weight.grad) > 0  # the federated head
    assert torch.count_nonzero(model.base.conv.weight.grad) > 0  # the shared extractor


def test_upload_has_no_personalized_head_and_a_download_leaves_it_unchanged(tiny_task, tmp_path):
    site = _fca_site(tiny_task, tmp_path)
    torch.manual_seed(0)
    initial = site.method.build_model().state_dict()
    upload = run_round(site, Download(params=initial, round=0), 0)
    assert upload.params and not any(k.startswith("personal_head.") for k in upload.params)
    assert "base.fc2.weight" in upload.params and "base.bn.running_mean" in upload.params  # BN statistics averaged
    personal = {k: v.clone() for k, v in site.models["local"].personal_head.state_dict().items()}
    shifted = {k: v + 1.0 if v.is_floating_point() else v for k, v in upload.params.items()}
    site.method.on_download(site.view(), Download(params=shifted, round=1), first=False)
    state = site.models["local"].state_dict()
    assert all(torch.equal(state[f"personal_head.{k}"], v) for k, v in personal.items())
    assert torch.equal(state["base.fc2.weight"], shifted["base.fc2.weight"])


def test_the_site_reports_the_personalized_head(tiny_task, tmp_path):
    site = _fca_site(tiny_task, tmp_path)
    model = site.models["local"].eval()
    x = torch.randn(4, 3, 8, 8)
    logits, embedding = model(x)
    assert torch.equal(logits, model.personal_head(embedding))
    assert not torch.equal(logits, model.federated(embedding))


def test_fca_applies_to_classification_only(tiny_seg_task):
    with pytest.raises(ConfigError, match="method 'fca' cannot run on task 'tinyseg': FCA's balanced softmax"):
        build_method(RunConfig(task="tinyseg", method="fca"), tiny_seg_task)


def test_authors_optimizer_and_schedule(tiny_task):
    method = FCA(RunConfig(task="tiny"), tiny_task, optimizer="authors")
    opt = method.build_optimizer(method.build_model())
    assert isinstance(opt, torch.optim.Adam) and opt.defaults["weight_decay"] == 5e-4
    assert [method.lr_at(e) for e in (0, 58, 59, 68, 69)] == pytest.approx([1e-3, 1e-3, 1e-4, 1e-4, 1e-5])
