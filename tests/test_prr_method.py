"""PRR's server rule and its site losses, on the tiny task."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from conftest import make_runtime, untimed

from prrfl.algorithms import cpa, det
from prrfl.config import RunConfig
from prrfl.messages import Download, Upload
from prrfl.methods import prototype_exchange as protos
from prrfl.methods.method import proximal_term
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


def test_the_authors_segmentation_distillation_is_ten_times_the_mse_of_the_softmax_maps(tiny_task, tmp_path):
    method = PRR(RunConfig(task="tiny"), tiny_task, distillation="mse", distill_weight=10.0)
    site = make_runtime(tiny_task, tmp_path)
    site.memory.update(mask=torch.ones(3, 3, dtype=torch.float64), gamma=torch.ones(3, dtype=torch.float64), phase=det.Phase.EXCHANGE)
    labels = torch.tensor([0, 1])
    z_p, z_d = torch.tensor([[0.0, 0.0, 0.0], [1.0, 0.0, 0.0]]), torch.tensor([[0.0, 0.0, 0.0], [0.0, 0.0, 0.0]])
    losses = method.losses(site.view(), labels, {"personal": (z_p, None), "deputy": (z_d, None)})
    # sample 1: equal maps; sample 2: softmax(1, 0, 0) = (e, 1, 1) / (e + 2) against (1/3, 1/3, 1/3)
    e = torch.e
    p2 = torch.tensor([e, 1.0, 1.0]) / (e + 2)
    mse = ((p2 - 1 / 3) ** 2).sum() / 6  # mean over 2 samples x 3 classes
    torch.testing.assert_close(losses["personal"], cpa.cpa_loss(z_p, labels, torch.ones(3, 3)) + 10 * mse)
    torch.testing.assert_close(losses["deputy"], cpa.cpa_loss(z_d, labels, torch.ones(3, 3)) + 10 * mse)


@pytest.mark.parametrize("optimizers", ["per_round", "kept"])
def test_optimisers_are_recreated_at_every_download_unless_kept(tiny_task, tmp_path, optimizers):
    from test_site_loop import initial_download, next_download

    from prrfl.site.trainer import run_round

    site = make_runtime(tiny_task, tmp_path, optimizer="adam", lr=1e-3, method_args={"optimizers": optimizers})
    upload = run_round(site, initial_download(tiny_task), 0)
    steps = site.optimizers["personal"].state_dict()["state"][0]["step"]
    assert steps == 8  # 2 epochs x 4 batches of the 30 training images
    site.method.on_download(site.view(), next_download(upload, 1), first=False)
    for role, opt in site.optimizers.items():
        state = opt.state_dict()["state"]
        if optimizers == "kept":
            assert state[0]["step"] == steps, role
        else:  # what a new Adam on the same parameters holds
            assert state == torch.optim.Adam(site.models[role].parameters()).state_dict()["state"] == {}, role


def test_a_site_may_report_its_deputy_and_records_both_models_every_round(tiny_task, tmp_path):
    from test_site_loop import initial_download

    from prrfl.site.trainer import run_round

    with pytest.raises(ValueError, match="report_model='deputy' needs det_enabled"):
        PRR(RunConfig(task="tiny"), tiny_task, report_model="deputy", det_enabled=False)
    for report, other in (("personal", "deputy"), ("deputy", "personal")):
        site = make_runtime(tiny_task, tmp_path / report, method_args={"report_model": report})
        assert site.method.eval_role == report and site.method.upload_role == "deputy"
        run_round(site, initial_download(tiny_task), 0)
        entry = site.history[-1]
        assert entry["valid"] == site.evaluate(report, "valid") and entry["test"] == site.evaluate(report, "test")
        assert entry["other_models"] == {other: {"valid": site.evaluate(other, "valid"), "test": site.evaluate(other, "test")}}
        assert (site.state_dir / f"best_{report}.pt").exists() and not (site.state_dir / f"best_{other}.pt").exists()
        assert site.results()["reported_model"] == report
        tags = {tag for tag, _, _ in site.scalars}
        assert {"valid/f1", f"valid_{other}/f1", f"test_{other}/auc"} <= tags and f"valid_{report}/f1" not in tags


@pytest.mark.parametrize(
    "epoch, personal, deputy, rescued",
    [
        (1, 50.0, 80.0, True),  # 50 < 0.7 x 80 = 56: P has fallen out of reach of distillation
        (1, 56.0, 80.0, False),  # the l1 boundary: no rescue
        (1, 79.0, 80.0, False),  # D a little ahead: P distils from D as the paper says
        (0, 10.0, 80.0, False),  # a round's first epoch: D was just overwritten by the download
    ],
)
def test_det_rescue_gives_p_the_deputys_weights_only_when_p_falls_below_l1_times_d(tiny_task, tmp_path, epoch, personal, deputy, rescued):
    from test_site_loop import initial_download

    from prrfl.site.trainer import run_round

    site = make_runtime(tiny_task, tmp_path, optimizer="adam", lr=1e-3, method_args={"optimizers": "kept", "det_rescue": 0.7})
    run_round(site, initial_download(tiny_task), 0)
    with torch.no_grad():  # make the two models differ
        for p in site.models["deputy"].parameters():
            p.add_(0.1)
    site.optimizers["deputy"].state_dict()["state"][0]["exp_avg"].add_(1.0)
    scores = {"personal": personal, "deputy": deputy}
    view = dataclasses.replace(site.view(), evaluate=lambda role, split: {"f1": scores[role]})
    before_p = copy_state(site.models["personal"])
    site.memory["phase"] = det.Phase.RECOVER  # as after a round's first epoch
    site.method.before_epoch(view, epoch)
    after_p, deputy_state = copy_state(site.models["personal"]), copy_state(site.models["deputy"])
    same_as_d = all(torch.equal(after_p[k], deputy_state[k]) for k in after_p)
    unchanged = all(torch.equal(after_p[k], before_p[k]) for k in after_p)
    assert (same_as_d, unchanged) == (rescued, not rescued)
    p_moments = site.optimizers["personal"].state_dict()["state"][0]["exp_avg"]
    d_moments = site.optimizers["deputy"].state_dict()["state"][0]["exp_avg"]
    assert torch.equal(p_moments, d_moments) == rescued
    logged = [v for tag, v, _ in site.scalars if tag == "det/rescue"]
    assert logged[-1] == float(rescued)
    # the phase is chosen from the scores after the rescue: P equal to D is Exchange (coming from Recover)
    if rescued:
        assert site.memory["phase"] == det.Phase.EXCHANGE
    assert PRR(RunConfig(task="tiny"), tiny_task, det_rescue=None).opt.det_rescue is None
    with pytest.raises(ValueError, match="det_rescue must lie in"):
        PRROptions(det_rescue=1.5)


def copy_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in model.state_dict().items()}


def test_personal_prox_pulls_only_p_towards_the_downloads_shared_weights(tiny_task, tmp_path):
    """personal_prox = 0.5, P's shared weights 0.2 away from the download everywhere: P's loss gains
    (0.5 / 2) * 0.2^2 per shared weight; D's loss and P's BatchNorm get nothing of it."""
    from test_site_loop import initial_download

    args = {"personal_prox": 0.5, "cpa_global": False, "cpa_local": False}
    site = make_runtime(tiny_task, tmp_path, method_args=args)
    view = site.view()
    site.method.on_download(view, initial_download(tiny_task), first=True)
    personal = site.models["personal"]
    shared = site.method.shared_keys(personal)
    assert shared == ["conv.weight", "fc1.weight", "fc2.weight"]
    params = {k: personal.state_dict()[k] - 0.2 for k in shared}
    site.method.on_download(view, Download(params=params, round=1, global_class_counts=[4, 4, 4]), first=False)
    n = sum(params[k].numel() for k in shared)
    x, y = torch.randn(4, 3, 8, 8), torch.tensor([0, 1, 2, 0])
    outputs = {role: site.models[role](x) for role in ("personal", "deputy")}
    losses = site.method.losses(view, y, outputs)
    plain = {role: tiny_task.loss(z, y) for role, (z, _) in outputs.items()}
    torch.testing.assert_close(losses["personal"], plain["personal"] + 0.25 * 0.04 * n)
    torch.testing.assert_close(losses["deputy"], plain["deputy"])
    personal.zero_grad()
    (losses["personal"] - plain["personal"]).backward()
    for name, p in personal.named_parameters():
        expected = 0.5 * 0.2 * torch.ones_like(p) if name in shared else torch.zeros_like(p)
        torch.testing.assert_close(p.grad if p.grad is not None else torch.zeros_like(p), expected)
    with pytest.raises(ValueError, match="personal_prox must be a finite number"):
        PRROptions(personal_prox=-1.0)
    with pytest.raises(ValueError, match="personal_prox needs det_enabled"):
        PRROptions(personal_prox=0.1, det_enabled=False)


class SpelledOutDET(PRR):
    """PRR with DET written out in its site hooks from the rules alone (`det.next_phase`, `det.allowed_phase`,
    `det.distillation_targets`, `det.distillation`), the phase kept in the site's memory: the specification that
    PRR's sites, which run DET through `det.DeputyPair`, meet bit for bit."""

    def on_download(self, site, download, first):
        if first:
            for role in self.roles:
                site.models[role].load_state_dict(download.params)
        else:
            site.models[self.upload_role].load_state_dict(download.params, strict=False)
        if self.opt.optimizers == "per_round":
            for optimizer in site.optimizers.values():
                optimizer.state.clear()
        mem = site.memory
        if self.opt.det_enabled:
            mem["phase"] = None
        if self.opt.personal_prox:
            personal = site.models["personal"]
            shared, device = self.shared_keys(personal), next(personal.parameters()).device
            mem["prox_anchor"] = {k: v.detach().to(device, copy=True) for k, v in download.params.items() if k in shared}
        mem["round"] = download.round
        if self.opt.uses_cpa:
            counts = torch.tensor(download.global_class_counts, dtype=torch.float64)
            mask = cpa.conjoint_mask(counts, beta=self.opt.beta)
            mem["mask"] = mask if self.opt.cpa_global else torch.ones(len(counts), len(counts), dtype=torch.float64)
        protos.receive(site, download.meta)

    def before_epoch(self, site, epoch):
        mem, o = site.memory, self.opt
        step = mem["round"] * self.cfg.local_epochs + epoch
        if o.det_enabled:
            metric = site.task.primary_metric
            personal = site.evaluate("personal", o.det_split)[metric]
            deputy = site.evaluate("deputy", o.det_split)[metric]
            rescue = o.det_rescue is not None and epoch > 0 and personal < o.det_rescue * deputy
            if rescue:
                site.models["personal"].load_state_dict(site.models["deputy"].state_dict())
                site.optimizers["personal"].load_state_dict(site.optimizers["deputy"].state_dict())
                personal = deputy
            if o.det_rescue is not None:
                site.log_scalar("det/rescue", float(rescue), step)
            phase = det.next_phase(mem["phase"], deputy, personal, l1=o.l1, l2=o.l2, just_downloaded=epoch == 0)
            mem["phase"] = det.allowed_phase(phase, o.phases)
            for name in det.PHASE_NAMES:
                site.log_scalar(f"det/{name}", float(mem["phase"].name.lower() == name), step)
            site.log_scalar("det/personal_score", personal, step)
            site.log_scalar("det/deputy_score", deputy, step)
        if o.uses_cpa:
            mem["gamma"] = self._gamma(site)
            for c, name in enumerate(site.task.class_names):
                site.log_scalar(f"cpa/gamma_{name}", float(mem["gamma"][c]), step)

    def losses(self, site, targets, outputs):
        losses = {role: self.supervised_loss(site, z, targets) for role, (z, _) in outputs.items()}
        phase = site.memory["phase"] if self.opt.det_enabled else None
        if phase is not None:
            (z_p, _), (z_d, _) = outputs["personal"], outputs["deputy"]
            p_learns, d_learns = det.distillation_targets(phase)
            form, weight = self.opt.distillation, self.opt.distill_weight
            if p_learns:
                losses["personal"] = losses["personal"] + weight * det.distillation(z_p, z_d, form)
            if d_learns:
                losses["deputy"] = losses["deputy"] + weight * det.distillation(z_d, z_p, form)
        if self.opt.personal_prox:
            losses["personal"] = losses["personal"] + proximal_term(
                site.models["personal"], site.memory["prox_anchor"], self.opt.personal_prox
            )
        return losses


def federate(task, tmp_path, method_class: type[PRR], args: dict, rounds: int = 3):
    """Sites A and B of `task` and PRR's server (`PRR.aggregate`) for `rounds` rounds of 3 local epochs, the sites'
    hooks those of `method_class`: the sites' runtimes after the last round."""
    from prrfl.site.state import SiteRuntime
    from prrfl.site.trainer import run_round

    cfg = RunConfig.from_dict({"task": task.name, "method": "prr", "num_rounds": rounds, "local_epochs": 3, "batch_size": 8, "lr": 0.05})
    sites = {}
    for name in ("A", "B"):
        scalars: list[tuple[str, float, int]] = []
        sites[name] = SiteRuntime.start(
            name,
            cfg,
            task,
            method_class(cfg, task, **args),
            task.load_site(name, torch.device("cpu")),
            tmp_path / method_class.__name__ / name,
            model_seed=123,
            generator_seed=7,
            run_id="run",
            log_scalar=lambda tag, value, step, scalars=scalars: scalars.append((tag, value, step)),
        )
        sites[name].scalars = scalars
    counts = [sum(c) for c in zip(*(site.data.class_counts for site in sites.values()))]
    torch.manual_seed(0)
    downloads = dict.fromkeys(sites, Download(params=task.build_model().state_dict(), global_class_counts=counts))
    server, method = {}, PRR(cfg, task, **args)
    for r in range(rounds):
        uploads = [run_round(site, downloads[name], r) for name, site in sites.items()]
        mixed = method.aggregate(uploads, r, server)
        downloads = {name: dataclasses.replace(d, round=r + 1, global_class_counts=counts) for name, d in mixed.items()}
    return sites


@pytest.mark.parametrize(
    "task_fixture, args",
    [
        ("tiny_task", {}),
        ("tiny_seg_task", {"distillation": "mse", "distill_weight": 10.0, "det_split": "train", "optimizers": "kept"}),
        ("tiny_task", {"det_phases": ["recover", "sublimate"], "det_rescue": 0.95, "personal_prox": 0.1, "l1": 0.5, "l2": 0.6}),
    ],
)
def test_prr_sites_run_det_through_the_deputy_pair_with_the_numbers_of_det_spelled_out(task_fixture, args, request, tmp_path, monkeypatch):
    """Three rounds of two sites: every model, optimiser state, record and logged value of PRR's sites (DET through
    `det.DeputyPair`, as a FLARE client's PersonalizedPair) equals, bit for bit, those of `SpelledOutDET`."""
    task = request.getfixturevalue(task_fixture)
    reference = federate(task, tmp_path, SpelledOutDET, args)
    phase_calls = []
    choose = det.DeputyPair.phase
    monkeypatch.setattr(det.DeputyPair, "phase", lambda pair, *a, **k: phase_calls.append(1) or choose(pair, *a, **k))
    ours = federate(task, tmp_path, PRR, args)
    assert len(phase_calls) == 2 * 3 * 3  # sites x rounds x epochs
    for name, site in ours.items():
        other = reference[name]
        for role, model in site.models.items():
            theirs = other.models[role].state_dict()
            assert all(torch.equal(v, theirs[k]) for k, v in model.state_dict().items()), (name, role)
            assert same(site.optimizers[role].state_dict(), other.optimizers[role].state_dict()), (name, role)
        assert untimed(site.history) == untimed(other.history)
        assert [s for s in site.scalars if not s[0].startswith("speed/")] == [s for s in other.scalars if not s[0].startswith("speed/")]
        assert site.memory.keys() == other.memory.keys() and site.memory["phase"] == other.memory["phase"]
    if not args:  # the default run goes through every phase
        phases = {
            tag
            for site in ours.values()
            for tag, value, _ in site.scalars
            if tag in ("det/recover", "det/exchange", "det/sublimate") and value
        }
        assert phases == {"det/recover", "det/exchange", "det/sublimate"}


def same(a, b) -> bool:
    """Whether two nested containers of tensors and plain values are equal, tensors bit for bit."""
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return a == b
