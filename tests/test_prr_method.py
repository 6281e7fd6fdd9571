"""PRR's server rule and its site losses, on the tiny task."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from conftest import make_runtime

from prrfl.algorithms import cpa, det
from prrfl.config import RunConfig
from prrfl.messages import Upload
from prrfl.methods.prr import PRR, PRROptions


def uploads(task, n: int = 3) -> list[Upload]:
    method = PRR(RunConfig(task="tiny"), task)
    out = []
    for i in range(n):
        torch.manual_seed(i)
        model = task.build_model()
        params = {k: model.state_dict()[k] for k in method.shared_keys(model)}
        protos = torch.rand(3, 8, generator=torch.Generator().manual_seed(i)).tolist()
        counts = [5, 3, 2 * i]
        meta = {"prototypes": protos, "prototype_present": [True, True, i != 0]}
        out.append(Upload(site=f"s{i}", params=params, num_train=sum(counts), class_counts=counts, meta=meta))
    return out


def test_shared_keys_leave_batchnorm_at_the_site(tiny_task):
    model = tiny_task.build_model()
    keys = PRR(RunConfig(task="tiny"), tiny_task).shared_keys(model)
    assert keys == ["conv.weight", "fc1.weight", "fc2.weight"]


def test_aggregate_sends_each_site_its_own_mix_and_a_sampled_prototype(tiny_task):
    method = PRR(RunConfig(task="tiny", num_rounds=4), tiny_task)
    ups = uploads(tiny_task)
    memory: dict = {}
    downloads = method.aggregate(ups, round_idx=3, server=memory)
    assert sorted(downloads) == ["s0", "s1", "s2"]
    assert downloads["s0"].meta["pfa_r"] == pytest.approx(0.48)
    for key in ups[0].params:
        assert not torch.equal(downloads["s0"].params[key], downloads["s1"].params[key])
        assert not torch.equal(downloads["s0"].params[key], ups[0].params[key])
    protos = torch.tensor(downloads["s0"].meta["global_prototypes"])
    assert protos.shape == (3, 8) and downloads["s0"].meta["global_prototype_present"] == [True, True, True]
    # the prototype stream continues across rounds, from state a restarted server can reload
    again = method.aggregate(ups, round_idx=3, server=memory)
    assert again["s0"].meta["global_prototypes"] != downloads["s0"].meta["global_prototypes"]
    fresh = method.aggregate(ups, round_idx=3, server={})
    assert fresh["s0"].meta["global_prototypes"] == downloads["s0"].meta["global_prototypes"]


def test_aggregate_with_identical_sites_returns_them_unchanged(tiny_task):
    method = PRR(RunConfig(task="tiny", num_rounds=2), tiny_task)
    same = uploads(tiny_task, 1) * 3
    same = [
        Upload(site=f"s{i}", params=u.params, num_train=u.num_train, class_counts=u.class_counts, meta=u.meta) for i, u in enumerate(same)
    ]
    downloads = method.aggregate(same, round_idx=1, server={})
    for d in downloads.values():
        for key, value in same[0].params.items():
            torch.testing.assert_close(d.params[key], value, atol=1e-6, rtol=1e-5)


def test_pfa_off_averages_the_deputies(tiny_task):
    method = PRR(RunConfig(task="tiny", method_args={}), tiny_task, pfa_enabled=False)
    ups = uploads(tiny_task)
    downloads = method.aggregate(ups, round_idx=0, server={})
    for u in ups:
        for k in u.params:  # uniform site weights by default
            torch.testing.assert_close(downloads[u.site].params[k], sum(v.params[k] for v in ups) / 3)
        assert "pfa_r" not in downloads[u.site].meta


def test_losses_follow_the_det_phase(tiny_task, tmp_path):
    method = PRR(RunConfig(task="tiny"), tiny_task)
    site = make_runtime(tiny_task, tmp_path)
    site.memory.update(mask=torch.ones(3, 3, dtype=torch.float64), gamma=torch.ones(3, dtype=torch.float64))
    labels = torch.tensor([0, 1, 2, 1])
    z_p, z_d = torch.randn(4, 3), torch.randn(4, 3)
    outputs = {"personal": (z_p, None), "deputy": (z_d, None)}
    sup_p = cpa.cpa_loss(z_p, labels, torch.ones(3, 3))
    sup_d = cpa.cpa_loss(z_d, labels, torch.ones(3, 3))
    kl_p, kl_d = det.kl_distillation(z_p, z_d), det.kl_distillation(z_d, z_p)
    expected = {
        det.Phase.RECOVER: (sup_p, sup_d + kl_d),
        det.Phase.EXCHANGE: (sup_p + kl_p, sup_d + kl_d),
        det.Phase.SUBLIMATE: (sup_p + kl_p, sup_d),
    }
    for phase, (want_p, want_d) in expected.items():
        site.memory["phase"] = phase
        losses = method.losses(site.view(), labels, outputs)
        torch.testing.assert_close(losses["personal"], want_p)
        torch.testing.assert_close(losses["deputy"], want_d)


def test_bad_options_are_named(tiny_task):
    with pytest.raises(ValueError, match="det_split"):
        PRR(RunConfig(task="tiny"), tiny_task, det_split="test")
    with pytest.raises(ValueError, match="l1"):
        PRR(RunConfig(task="tiny"), tiny_task, l1=0.95, l2=0.9)
    with pytest.raises(TypeError):
        PRR(RunConfig(task="tiny"), tiny_task, lambda1=0.7)


def test_options_are_a_frozen_checked_dataclass_that_config_validation_reads(tiny_task):
    method = PRR(RunConfig(task="tiny"), tiny_task, det_phases=["exchange", "recover"], tau=2.0)
    assert isinstance(method.opt, PRROptions) and method.opt.tau == 2.0
    assert method.opt.det_phases == ("exchange", "recover") and method.opt.phases == (det.Phase.RECOVER, det.Phase.EXCHANGE)
    with pytest.raises(dataclasses.FrozenInstanceError):
        method.opt.tau = 1.0
    params = PRR.option_parameters()
    assert list(params) == [f.name for f in dataclasses.fields(PRROptions)]
    assert params["tau"].default == 3.0 and params["det_split"].annotation == det.MetricSplit
    with pytest.raises(ValueError, match="r0 must lie in"):
        PRROptions(r0=0.6)
