"""Each FL method's distinguishing rule against a small hand-written reference on dummy data, and
every registered method through two rounds of the shared site loop."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from conftest import TinySegTask, TinyTask, make_runtime

from prrfl.algorithms import det, pfa
from prrfl.config import ConfigError, RunConfig
from prrfl.messages import Download, Upload
from prrfl.methods.apfl import mix_parameters
from prrfl.methods.fedproto import average_prototypes, prototype_regulariser
from prrfl.methods.method import proximal_term
from prrfl.methods.perfedavg import first_order_meta_step
from prrfl.methods.pfedme import moreau_step, solve_personalized
from prrfl.methods.prr_variants import count_weights, focal_loss
from prrfl.registry import build_method, method_class, method_names
from prrfl.server.checks import upload_problem
from prrfl.site.trainer import run_round

COUNTS = [20, 20, 20]


def method(task, name: str, **options):
    return build_method(RunConfig(task="tiny", method=name, method_args=options), task)


def initial(task) -> Download:
    torch.manual_seed(0)
    return Download(params=task.build_model().state_dict(), round=0, global_class_counts=COUNTS)


def constant_uploads(task, values, counts=((5, 5, 5),) * 3, keys=None, meta=None) -> list[Upload]:
    """Sites whose every float tensor is filled with one value each."""
    model = task.build_model()
    out = []
    for i, (value, c) in enumerate(zip(values, counts)):
        state = {k: v.clone() for k, v in model.state_dict().items() if keys is None or k in keys}
        params = {k: torch.full_like(v, value) if v.is_floating_point() else v for k, v in state.items()}
        out.append(Upload(site=f"s{i}", params=params, num_train=sum(c), class_counts=list(c), meta=meta[i] if meta else {}))
    return out


# ----- FedAvg family ---------------------------------------------------------------------------------
def test_fedavg_averages_by_sample_counts_and_sends_everyone_the_average(tiny_task):
    ups = constant_uploads(tiny_task, [1.0, 2.0, 4.0], counts=[(1, 0, 0), (1, 1, 0), (1, 1, 1)])
    downloads = method(tiny_task, "fedavg").aggregate(ups, 0, {})
    assert sorted(downloads) == ["s0", "s1", "s2"]
    for d in downloads.values():
        torch.testing.assert_close(d.params["conv.weight"], torch.full_like(d.params["conv.weight"], (1 + 2 * 2 + 3 * 4) / 6))
    uniform = method(tiny_task, "fedavg", weighting="uniform").aggregate(ups, 0, {})
    assert torch.allclose(uniform["s0"].params["fc2.weight"], torch.tensor(7 / 3))


def test_fedprox_gradient_of_the_proximal_term_is_mu_times_the_drift(tiny_task, tmp_path):
    site = make_runtime(tiny_task, tmp_path, method="fedprox", method_args={"mu": 0.5})
    site.method.on_download(site.view(), initial(tiny_task), first=True)
    model = site.models["local"]
    anchor = {n: p.detach().clone() for n, p in model.named_parameters()}
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p))
    model.zero_grad()
    pull = proximal_term(model, site.memory["global_params"], 0.5)
    pull.backward()
    for n, p in model.named_parameters():
        torch.testing.assert_close(p.grad, 0.5 * (p.detach() - anchor[n]))
    labels = torch.tensor([0, 1, 2, 0])
    out = model(torch.randn(4, 3, 8, 8))
    loss = site.method.losses(site.view(), labels, {"local": out})["local"]
    torch.testing.assert_close(loss, F.cross_entropy(out[0], labels) + proximal_term(model, anchor, 0.5))


def test_fedbn_keeps_batchnorm_at_the_site(tiny_task, tmp_path):
    site = make_runtime(tiny_task, tmp_path, method="fedbn")
    model = site.models["local"]
    assert site.method.shared_keys(model) == ["conv.weight", "fc1.weight", "fc2.weight"]
    site.method.on_download(site.view(), initial(tiny_task), first=True)
    bn_before = {k: v.clone() for k, v in model.state_dict().items() if k.startswith("bn.")}
    download = Download(params={k: torch.ones_like(model.state_dict()[k]) for k in site.method.shared_keys(model)}, round=1)
    site.method.on_download(site.view(), download, first=False)
    state = model.state_dict()
    assert all(torch.equal(state[k], v) for k, v in bn_before.items())
    assert torch.equal(state["conv.weight"], torch.ones_like(state["conv.weight"]))
    assert set(site.method.upload(site.view()).params) == {"conv.weight", "fc1.weight", "fc2.weight"}


def test_silobn_shares_batchnorm_affine_but_keeps_running_statistics(tiny_task, tmp_path):
    site = make_runtime(tiny_task, tmp_path, method="silobn")
    model = site.models["local"]
    shared = site.method.shared_keys(model)
    assert {"bn.weight", "bn.bias"} <= set(shared)
    assert not {"bn.running_mean", "bn.running_var", "bn.num_batches_tracked"} & set(shared)
    site.method.on_download(site.view(), initial(tiny_task), first=True)
    with torch.no_grad():
        model.bn.running_mean.fill_(3.0)
    download = Download(params={k: torch.full_like(model.state_dict()[k], 2.0) for k in shared}, round=1)
    site.method.on_download(site.view(), download, first=False)
    assert torch.equal(model.bn.weight.detach(), torch.full((4,), 2.0)) and torch.equal(model.bn.running_mean, torch.full((4,), 3.0))


def test_ida_weights_are_normalised_inverse_distances_to_the_mean(tiny_task):
    ups = constant_uploads(tiny_task, [0.0, 1.0, 5.0])  # mean 2: distances 2, 1, 3 (times sqrt(#params))
    ups[0].params["bn.running_var"].fill_(1e6)  # running statistics are not in the distance
    ida = method(tiny_task, "ida")
    expected = torch.tensor([1 / 2, 1, 1 / 3], dtype=torch.float64) / (1 / 2 + 1 + 1 / 3)  # = (3, 6, 2) / 11
    torch.testing.assert_close(ida.site_weights(ups), expected)
    downloads = ida.aggregate(ups, 0, {})
    torch.testing.assert_close(downloads["s2"].params["fc1.weight"], torch.full((8, 4), (0 * 3 + 1 * 6 + 5 * 2) / 11))


# ----- FedProto, FML ---------------------------------------------------------------------------------
def test_fedproto_regulariser_and_server_averaging(tiny_task):
    emb = torch.tensor([[1.0, 2.0], [0.0, 0.0], [3.0, 1.0]])
    labels = torch.tensor([0, 1, 2])
    glob = torch.tensor([[0.0, 2.0], [5.0, 5.0], [0.0, 0.0]])
    present = torch.tensor([True, True, False])  # class 2 has no global prototype yet
    expected = ((1 - 0) ** 2 + 0 + 25 + 25) / 6  # mean over all B*D entries
    torch.testing.assert_close(prototype_regulariser(emb, labels, glob, present), torch.tensor(expected))

    site_protos = torch.tensor([[[1.0, 0.0], [2.0, 2.0]], [[3.0, 4.0], [0.0, 0.0]]])  # [K=2, C=2, D=2]
    counts = torch.tensor([[1, 3], [3, 0]])  # site 1 has no class-1 sample
    mean, has = average_prototypes(site_protos, counts)
    torch.testing.assert_close(mean, torch.tensor([[(1 + 9) / 4, 12 / 4], [2.0, 2.0]], dtype=torch.float64))
    assert has.tolist() == [True, True]


def test_fedproto_sends_only_prototypes(tiny_task, tmp_path):
    fedproto = method(tiny_task, "fedproto")
    assert fedproto.shared_keys(tiny_task.build_model()) == []
    protos = [[[1.0] * 8, [0.0] * 8, [2.0] * 8], [[3.0] * 8, [4.0] * 8, [0.0] * 8]]
    ups = constant_uploads(
        tiny_task,
        [0, 0],
        counts=[(1, 1, 2), (3, 1, 0)],
        keys=(),
        meta=[{"prototypes": p, "prototype_present": [c > 0 for c in n]} for p, n in zip(protos, [(1, 1, 2), (3, 1, 0)])],
    )
    d = fedproto.aggregate(ups, 0, {})["s1"]
    assert d.params == {}
    assert [row[0] for row in d.meta["global_prototypes"]] == [2.5, 2.0, 2.0]


def test_fml_is_weighted_mutual_learning_with_cross_entropy(tiny_task, tmp_path):
    site = make_runtime(tiny_task, tmp_path, method="fml", method_args={"alpha": 0.3, "beta": 0.6})
    z_p, z_d = torch.randn(5, 3), torch.randn(5, 3)
    labels = torch.tensor([0, 1, 2, 2, 1])

    def kl(teacher, student):  # sum_c q log(q / p), batch mean
        q, p = teacher.softmax(1), student.softmax(1)
        return (q * (q.log() - p.log())).sum(1).mean()

    losses = site.method.losses(site.view(), labels, {"personal": (z_p, None), "deputy": (z_d, None)})
    torch.testing.assert_close(losses["personal"], 0.3 * F.cross_entropy(z_p, labels) + 0.7 * kl(z_d, z_p))
    torch.testing.assert_close(losses["deputy"], 0.6 * F.cross_entropy(z_d, labels) + 0.4 * kl(z_p, z_d))
    assert site.method.upload_role == "deputy" and site.method.eval_role == "personal"


# ----- PRR-FL and the imbalance losses inside PRR ------------------------------------------------------
def test_prrfl_is_amplitude_only_pfa_with_the_classifier_as_a_matrix_and_cross_entropy(tiny_task, tmp_path):
    site = make_runtime(tiny_task, tmp_path, method="prrfl")
    prrfl = site.method
    assert prrfl.opt.pfa_components == "amplitude" and not prrfl.opt.classifier_rowwise
    logits, labels = torch.randn(4, 3), torch.tensor([0, 1, 2, 1])
    torch.testing.assert_close(prrfl.supervised_loss(site.view(), logits, labels), F.cross_entropy(logits, labels))
    torch.manual_seed(1)
    ups = [
        Upload(f"s{i}", {k: torch.randn_like(v) for k, v in u.params.items()}, 15, [5, 5, 5])
        for i, u in enumerate(constant_uploads(tiny_task, [0, 0], keys=prrfl.shared_keys(tiny_task.build_model())))
    ]
    downloads = prrfl.aggregate(ups, 0, {})
    r = pfa.pfa_threshold(0, prrfl.cfg.num_rounds)
    want = pfa.pfa_aggregate([u.params for u in ups], r, components="amplitude", classifier_rowwise=False, bn_keys=set())
    for u, w in zip(ups, want):
        assert all(torch.allclose(downloads[u.site].params[k], w[k]) for k in w)
        assert "global_prototypes" not in downloads[u.site].meta  # no CPA: no prototypes travel


def test_fedeamc_weights_classes_by_inverse_counts(tiny_task, tmp_path):
    torch.testing.assert_close(count_weights([6, 3, 1]), torch.tensor([10 / 18, 10 / 9, 10 / 3], dtype=torch.float64))
    assert count_weights([4, 0, 4]).tolist() == [1.0, 0.0, 1.0]  # C counts the classes present
    site = make_runtime(tiny_task, tmp_path, method="fedeamc")
    site.method.on_download(site.view(), Download(params=initial(tiny_task).params, round=0, global_class_counts=[6, 3, 1]), first=True)
    logits, labels = torch.randn(4, 3), torch.tensor([0, 1, 2, 2])
    ce = F.cross_entropy(logits, labels, reduction="none")
    expected = (ce * torch.tensor([10 / 18, 10 / 9, 10 / 3, 10 / 3])).mean()
    torch.testing.assert_close(site.method.supervised_loss(site.view(), logits, labels), expected)
    with pytest.raises(ValueError, match="cpa_local"):
        method(tiny_task, "fedeamc", cpa_local=True)


def test_fed_focal_is_cross_entropy_at_gamma_zero_and_down_weights_easy_samples(tiny_task):
    logits, labels = torch.randn(6, 3), torch.tensor([0, 1, 2, 0, 1, 2])
    torch.testing.assert_close(focal_loss(logits, labels, gamma=0.0), F.cross_entropy(logits, labels))
    easy, hard = torch.tensor([[4.0, 0.0, 0.0]]), torch.tensor([[0.5, 0.0, 0.0]])
    y = torch.tensor([0])
    ratio_easy = focal_loss(easy, y, 2.0) / F.cross_entropy(easy, y)
    ratio_hard = focal_loss(hard, y, 2.0) / F.cross_entropy(hard, y)
    p_easy = easy.softmax(1)[0, 0]
    torch.testing.assert_close(ratio_easy, (1 - p_easy) ** 2)
    assert ratio_easy < ratio_hard < 1
    focal = method(tiny_task, "fedfocal", gamma=0.0)
    assert not focal.opt.uses_cpa and focal.roles == ("personal", "deputy")


# ----- personalized FL: Per-FedAvg, pFedMe, APFL ----------------------------------------------------------
def test_perfedavg_first_order_step_on_a_quadratic():
    a, b, w0 = torch.tensor([1.0, -2.0]), torch.tensor([3.0, 0.5]), torch.tensor([0.2, 0.4])
    alpha, beta = 0.1, 0.3
    w = torch.nn.Parameter(w0.clone())
    opt = torch.optim.SGD([w], lr=beta)
    first_order_meta_step([w], lambda: 0.5 * ((w - a) ** 2).sum(), lambda: 0.5 * ((w - b) ** 2).sum(), alpha, opt)
    w_inner = w0 - alpha * (w0 - a)  # w' = w - alpha grad f_D(w)
    torch.testing.assert_close(w.detach(), w0 - beta * (w_inner - b))  # w - beta grad f_D'(w')


def test_perfedavg_evaluates_the_one_step_adapted_model(tiny_task, tmp_path):
    site = make_runtime(tiny_task, tmp_path, method="perfedavg")
    site.method.on_download(site.view(), initial(tiny_task), first=True)
    shared, personal = site.models["shared"].state_dict(), site.models["personal"].state_dict()
    assert not torch.equal(shared["fc2.weight"], personal["fc2.weight"])
    assert site.method.eval_role == "personal" and site.method.upload_role == "shared"


def test_pfedme_personalized_solve_moreau_step_and_server_mixing(tiny_task):
    a, w0, theta0 = torch.tensor([2.0, -1.0]), torch.tensor([0.0, 1.0]), torch.tensor([0.5, 0.5])
    lam, lr = 3.0, 0.05
    theta = torch.nn.Parameter(theta0.clone())
    solve_personalized([theta], [w0], lambda: 0.5 * ((theta - a) ** 2).sum(), lam, lr, steps=4)
    ref = theta0.clone()
    for _ in range(4):
        ref = ref - lr * ((ref - a) + lam * (ref - w0))
    torch.testing.assert_close(theta.detach(), ref)
    solve_personalized([theta], [w0], lambda: 0.5 * ((theta - a) ** 2).sum(), lam, lr, steps=500)
    torch.testing.assert_close(theta.detach(), (a + lam * w0) / (1 + lam))  # the Moreau envelope's minimiser
    w = w0.clone()
    moreau_step([w], [theta.detach()], lam, eta=0.1)
    torch.testing.assert_close(w, w0 - 0.1 * lam * (w0 - theta.detach()))

    pfedme = method(tiny_task, "pfedme", beta=0.5)
    server: dict = {}
    first = pfedme.aggregate(constant_uploads(tiny_task, [1.0, 3.0]), 0, server)  # no earlier global: the average
    assert torch.allclose(first["s0"].params["fc2.weight"], torch.tensor(2.0))
    second = pfedme.aggregate(constant_uploads(tiny_task, [5.0, 7.0]), 1, server)
    assert torch.allclose(second["s1"].params["fc2.weight"], torch.tensor(0.5 * 2.0 + 0.5 * 6.0))


def test_apfl_mixed_model_and_alpha_update(tiny_task, tmp_path):
    site = make_runtime(tiny_task, tmp_path, method="apfl", method_args={"alpha": 0.3})
    apfl = site.method
    apfl.on_download(site.view(), initial(tiny_task), first=True)
    shared, personal, mixed = (site.models[r] for r in ("shared", "personal", "mixed"))
    with torch.no_grad():
        for p in personal.parameters():
            p.add_(0.1 * torch.randn_like(p))
    apfl.refresh_mixed(site.view())
    for m, v, w in zip(mixed.parameters(), personal.parameters(), shared.parameters()):
        torch.testing.assert_close(m.detach(), 0.3 * v.detach() + 0.7 * w.detach())

    inputs, labels = torch.randn(6, 3, 8, 8), torch.tensor([0, 1, 2, 0, 1, 2])
    # hand reference: the gradient of f at v_bar, then alpha - lr * <v - w, grad>
    reference = tiny_task.build_model()
    reference.load_state_dict(mixed.state_dict())
    reference.train()
    F.cross_entropy(reference(inputs)[0], labels).backward()
    inner = sum(
        ((v.detach() - w.detach()) * r.grad).sum() for v, w, r in zip(personal.parameters(), shared.parameters(), reference.parameters())
    )
    lr = site.optimizers["personal"].param_groups[0]["lr"]
    v_expected = [v.detach() - lr * 0.3 * r.grad for v, r in zip(personal.parameters(), reference.parameters())]
    apfl.train_batch(site.view(), inputs, labels)
    assert math.isclose(site.memory["alpha"], 0.3 - lr * float(inner), rel_tol=1e-5, abs_tol=1e-7)
    for v, want in zip(personal.parameters(), v_expected):
        torch.testing.assert_close(v.detach(), want)
    mixed_params = mix_parameters(personal, shared, 0.5)
    torch.testing.assert_close(mixed_params["fc2.weight"], 0.5 * (personal.fc2.weight + shared.fc2.weight))


# ----- PRR ablation switches ----------------------------------------------------------------------------
def test_prr_without_det_keeps_one_model_that_receives_the_download(tiny_task, tmp_path):
    site = make_runtime(tiny_task, tmp_path, method_args={"det_enabled": False})
    prr = site.method
    assert prr.roles == ("local",) and prr.eval_role == prr.upload_role == "local"
    assert list(site.models) == ["local"]
    upload = run_round(site, initial(tiny_task), 0)
    assert set(upload.params) == {"conv.weight", "fc1.weight", "fc2.weight"}
    shift = {k: v + 1.0 for k, v in upload.params.items()}
    prr.on_download(site.view(), Download(params=shift, round=1, global_class_counts=COUNTS), first=False)
    assert torch.equal(site.models["local"].state_dict()["fc2.weight"], shift["fc2.weight"])
    z, labels = torch.randn(4, 3), torch.tensor([0, 1, 2, 0])
    site.memory["gamma"] = torch.ones(3, dtype=torch.float64)
    assert set(prr.losses(site.view(), labels, {"local": (z, None)})) == {"local"}


def test_prr_cpa_switches(tiny_task, tmp_path):
    site = make_runtime(tiny_task, tmp_path, method_args={"cpa_global": False})
    site.method.on_download(site.view(), Download(params=initial(tiny_task).params, round=0, global_class_counts=[50, 5, 1]), first=True)
    assert torch.equal(site.memory["mask"], torch.ones(3, 3, dtype=torch.float64))
    no_local = make_runtime(tiny_task, tmp_path / "nl", method_args={"cpa_local": False})
    upload = run_round(no_local, initial(tiny_task), 0)
    assert "prototypes" not in upload.meta and "prototypes" not in no_local.memory
    assert "global_prototypes" not in no_local.method.aggregate([upload], 0, {})["A"].meta
    with pytest.raises(ValueError, match="needs the federation's class counts"):
        site.method.on_download(site.view(), Download(params=initial(tiny_task).params), first=True)


@pytest.mark.parametrize(
    "allowed, expected",
    [
        (("recover",), [1, 1, 1]),
        (("recover", "exchange"), [1, 2, 2]),
        (("exchange",), [2, 2, 2]),
        (("recover", "exchange", "sublimate"), [1, 2, 3]),
        (("recover", "sublimate"), [1, 1, 3]),
    ],
)
def test_det_phases_cap_the_phase(allowed, expected):
    phases = [det.Phase.RECOVER, det.Phase.EXCHANGE, det.Phase.SUBLIMATE]
    order = sorted(det.Phase[p.upper()] for p in allowed)
    assert [int(det.allowed_phase(p, order)) for p in phases] == expected


def test_det_phases_are_respected_in_training(tiny_task, tmp_path):
    site = make_runtime(tiny_task, tmp_path, local_epochs=3, method_args={"det_phases": ["exchange"]})
    run_round(site, initial(tiny_task), 0)
    assert [v for tag, v, _ in site.scalars if tag == "det/exchange"] == [1.0, 1.0, 1.0]
    assert [v for tag, v, _ in site.scalars if tag in ("det/recover", "det/sublimate")] == [0.0] * 6
    with pytest.raises(ValueError, match="det_phases"):
        method(tiny_task, "prr", det_phases=["recovery"])


# ----- every method through the shared loop ----------------------------------------------------------------
APPLICABLE = [  # every (method, tiny task) pair the method applies to
    (name, fixture)
    for fixture, task in (("tiny_task", TinyTask({})), ("tiny_seg_task", TinySegTask({})))
    for name in method_names()
    if method_class(name).unsupported_reason(task) is None
]


@pytest.mark.parametrize("name, task_fixture", APPLICABLE)
def test_every_method_runs_two_rounds_through_the_shared_loop(name, task_fixture, request, tmp_path):
    tiny_task = request.getfixturevalue(task_fixture)
    sites = [make_runtime(tiny_task, tmp_path, site=s, method=name, local_epochs=1, eval_test_every_epoch=False) for s in ("A", "B")]
    counts = [sum(s.data.class_counts[c] for s in sites) for c in range(tiny_task.num_classes)]
    method = sites[0].method
    reference = {k: v for k, v in method.reference_model.state_dict().items() if k in method.shared_keys(method.reference_model)}
    torch.manual_seed(0)
    downloads = {s.name: Download(params=method.build_model().state_dict(), round=0, global_class_counts=counts) for s in sites}
    server: dict = {}
    for round_idx in range(2):
        uploads = [run_round(s, downloads[s.name], round_idx) for s in sites]
        for s, u in zip(sites, uploads):
            assert list(u.params) == s.method.shared_keys(s.models[s.method.upload_role])
            assert upload_problem(u, reference, tiny_task) is None
        out = sites[0].method.aggregate(uploads, round_idx, server)
        assert sorted(out) == ["A", "B"]
        downloads = {k: Download(params=d.params, meta=d.meta, round=round_idx + 1, global_class_counts=counts) for k, d in out.items()}
    for s in sites:
        losses = [v for tag, v, _ in s.scalars if tag.startswith("loss/")]
        assert losses and all(math.isfinite(v) for v in losses)
        assert s.round_idx == 1 and s.best is not None
        assert set(s.best["test"]) == set(tiny_task.recorded_metrics)


def test_a_method_that_cannot_apply_to_a_task_is_refused_when_the_job_is_built(tiny_seg_task, monkeypatch):
    from prrfl.methods.fedavg import FedAvg

    monkeypatch.setattr(FedAvg, "unsupported_reason", classmethod(lambda cls, task: "needs class labels per image"))
    with pytest.raises(ConfigError, match="method 'fedavg' cannot run on task 'tinyseg': needs class labels per image"):
        build_method(RunConfig(task="tinyseg", method="fedavg"), tiny_seg_task)


@pytest.mark.parametrize("name", ["fedavg", "fedbn", "prr"])
def test_the_flare_component_and_prrfls_method_give_the_same_outputs_on_the_same_uploads(tiny_task, name):
    """One server path: the FLARE component that a FLARE job uses (FLModels through accept / aggregate) and prrfl's
    method (Uploads) compute the same tensors, bit for bit."""
    from nvflare.app_common.abstract.fl_model import FLModel

    from prrfl.flare.components import NUM_SAMPLES, FedAvgAggregator, FedBNAggregator, FourierAggregator

    m = method(tiny_task, name)
    model = tiny_task.build_model()
    torch.manual_seed(3)
    shared = m.shared_keys(model)
    ups = [
        Upload(
            f"s{i}",
            {k: torch.randn_like(v) if v.is_floating_point() else v for k, v in model.state_dict().items() if k in shared},
            n,
            [n, 0, 0],
        )
        for i, n in enumerate((5, 9, 20))
    ]
    downloads = m.aggregate(ups, 1, {})
    if name == "prr":
        o = m.opt
        component = FourierAggregator(
            o.r0, o.r1, o.r_schedule, o.pfa_components, o.conv_layout, m.classifier_keys, o.classifier_rowwise, o.site_weights
        )
    else:
        component = (FedAvgAggregator if name == "fedavg" else FedBNAggregator)(weighting=m.weighting)
    component.use_model(model)
    for u in ups:
        component.accept_model(FLModel(params=u.params, meta={"client_name": u.site, NUM_SAMPLES: u.num_train}))
    outputs = component.aggregate_models(1, m.cfg.num_rounds)
    for u in ups:
        assert downloads[u.site].params.keys() == outputs[u.site].params.keys()
        assert all(torch.equal(downloads[u.site].params[k], outputs[u.site].params[k]) for k in shared)
