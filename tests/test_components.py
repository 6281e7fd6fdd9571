"""prrfl.flare.components: per-client aggregators, prototype exchange and the DET pair, without FLARE running."""

from __future__ import annotations

import math

import pytest
import torch
from nvflare.apis.signal import Signal
from nvflare.app_common.abstract.fl_model import FLModel, ParamsType
from torch import nn

from prrfl.algorithms.class_prototypes import sample_global_prototypes
from prrfl.algorithms.det import Phase
from prrfl.algorithms.pfa import pfa_aggregate, pfa_threshold
from prrfl.flare.components import (
    CLASS_COUNTS,
    GLOBAL_CLASS_COUNTS,
    GLOBAL_PROTOTYPE_PRESENT,
    GLOBAL_PROTOTYPES,
    NUM_SAMPLES,
    NUM_STEPS,
    PFA_R,
    PROTOTYPE_PRESENT,
    PROTOTYPES,
    Answers,
    FedAvgAggregator,
    FedBNAggregator,
    FourierAggregator,
    GlobalStatistics,
    PersonalizedFedAvg,
    PersonalizedPair,
    PrototypeExchange,
    PrototypeTracker,
)
from prrfl.flare.components.workflow import full_weights
from prrfl.server.aggregation import as_uploads, local_batchnorm_keys, site_weights

BN = ("bn.weight", "bn.bias", "bn.running_mean", "bn.running_var", "bn.num_batches_tracked")


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, bias=False)
        self.bn = nn.BatchNorm2d(4)
        self.fc1 = nn.Linear(4, 6)
        self.fc2 = nn.Linear(6, 3, bias=False)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(torch.relu(self.bn(self.conv(x))).mean(dim=(2, 3)))))


def random_state(seed: int) -> dict[str, torch.Tensor]:
    torch.manual_seed(seed)
    state = Net().state_dict()
    g = torch.Generator().manual_seed(seed)
    return {
        k: torch.randint(0, 9, v.shape, generator=g) if k.endswith("tracked") else torch.randn(v.shape, generator=g)
        for k, v in state.items()
    }


STATES = {"site-1": random_state(1), "site-2": random_state(2), "site-3": random_state(3)}
SAMPLES = {"site-1": 10, "site-2": 30, "site-3": 60}


# ----- aggregators --------------------------------------------------------------------------------
@pytest.mark.parametrize("components", ["amplitude_phase", "amplitude"])
@pytest.mark.parametrize("weighting", ["uniform", "samples"])
def test_fourier_aggregator_is_pfa_aggregate_with_the_same_arguments(components, weighting):
    aggregator = FourierAggregator(r0=0.2, r1=0.45, components=components, weighting=weighting, classifier_key="fc2.weight")
    aggregator.use_model(Net())  # its BatchNorm layer stays at each client
    out = aggregator.aggregate_states(STATES, SAMPLES, round_idx=1, num_rounds=4)
    r = pfa_threshold(1, 4, r0=0.2, r1=0.45)
    # what PRR.aggregate calls: the weights of site_weights over the uploads in the same order
    expected = pfa_aggregate(
        list(STATES.values()),
        r,
        weights=site_weights(as_uploads(STATES, SAMPLES), weighting),
        components=components,
        classifier_key="fc2.weight",
        bn_keys=local_batchnorm_keys(Net()),
    )
    assert list(out) == list(STATES) and aggregator.r == r == pytest.approx(0.2 + (0.45 - 0.2) / 3)  # linear, round 1 of 0..3
    for client, want in zip(STATES, expected):
        assert out[client].keys() == want.keys()
        assert all(torch.equal(out[client][k], want[k]) for k in want)  # the same computation: no deviation at all
    for key in BN:  # BN stays at each client
        assert all(torch.equal(out[c][key], STATES[c][key]) for c in STATES)
    assert not torch.equal(out["site-1"]["conv.weight"], out["site-2"]["conv.weight"])  # one model per client


def test_fourier_aggregator_uniform_weights_equal_pfa_without_weights():
    aggregator = FourierAggregator()
    aggregator.use_model(Net())
    out = aggregator.aggregate_states(STATES, {}, round_idx=0, num_rounds=3)
    expected = pfa_aggregate(list(STATES.values()), 0.35, bn_keys=local_batchnorm_keys(Net()))
    assert all(torch.equal(out[c][k], e[k]) for c, e in zip(STATES, expected) for k in e)


def test_fourier_aggregator_rejects_bad_settings():
    with pytest.raises(ValueError, match="r1"):
        FourierAggregator(r1=0.6)
    with pytest.raises(ValueError, match="components"):
        FourierAggregator(components="phase")
    with pytest.raises(ValueError, match="weighting"):
        FourierAggregator(weighting="sizes")


def tiny(a: float, b: float, bn: float) -> dict[str, torch.Tensor]:
    """A model's state: float weights and statistics (also from integer arguments), an integer counter."""
    return {
        "fc.weight": torch.tensor([[a, b]], dtype=torch.float32),
        "fc.bias": torch.tensor([b], dtype=torch.float32),
        "bn.running_mean": torch.tensor([bn], dtype=torch.float32),
        "bn.num_batches_tracked": torch.tensor(int(bn)),
    }


def test_fedavg_is_the_hand_computed_weighted_average_for_every_client():
    states = {"a": tiny(1.0, 2.0, 4.0), "b": tiny(5.0, -2.0, 8.0)}
    out = FedAvgAggregator().aggregate_states(states, {"a": 1, "b": 3}, 0, 1)  # weights 1/4, 3/4
    for client in states:
        assert torch.equal(out[client]["fc.weight"], torch.tensor([[4.0, -1.0]]))  # 0.25*1 + 0.75*5, 0.25*2 - 0.75*2
        assert torch.equal(out[client]["fc.bias"], torch.tensor([-1.0]))
        assert torch.equal(out[client]["bn.running_mean"], torch.tensor([7.0]))  # FedAvg averages BN too
        assert out[client]["bn.num_batches_tracked"].item() == 7
    uniform = FedAvgAggregator(weighting="uniform").aggregate_states(states, {}, 0, 1)
    assert torch.equal(uniform["b"]["fc.weight"], torch.tensor([[3.0, 0.0]]))
    assert out["a"]["fc.weight"].data_ptr() != out["b"]["fc.weight"].data_ptr()  # no shared storage between clients


class Tiny(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc, self.bn = nn.Linear(2, 1), nn.BatchNorm1d(1)


def test_fedbn_averages_all_but_batchnorm():
    states = {"a": tiny(1.0, 2.0, 4.0), "b": tiny(5.0, -2.0, 8.0)}
    aggregator = FedBNAggregator()
    with pytest.raises(ValueError, match="which keys stay"):  # no model, no keys: it cannot know what BatchNorm is
        aggregator.aggregate_states(states, {"a": 1, "b": 3}, 0, 1)
    aggregator.use_model(Tiny())  # the BatchNorm layers by type (a key the clients do not send is not there to keep)
    out = aggregator.aggregate_states(states, {"a": 1, "b": 3}, 0, 1)
    for client, own in (("a", 4.0), ("b", 8.0)):
        assert torch.equal(out[client]["fc.weight"], torch.tensor([[4.0, -1.0]]))
        assert torch.equal(out[client]["bn.running_mean"], torch.tensor([own]))
        assert out[client]["bn.num_batches_tracked"].item() == int(own)
    explicit = FedBNAggregator(weighting="uniform", local_keys=["fc.bias"]).aggregate_states(states, {}, 0, 1)
    assert torch.equal(explicit["a"]["fc.bias"], torch.tensor([2.0])) and torch.equal(explicit["b"]["fc.bias"], torch.tensor([-2.0]))
    assert torch.equal(explicit["a"]["bn.running_mean"], torch.tensor([6.0]))  # named keys only: BN averaged here


def result(client: str, state, n: int | None = 5, params_type=ParamsType.FULL) -> FLModel:
    meta = {"client_name": client} if n is None else {"client_name": client, NUM_SAMPLES: n}
    return FLModel(params_type=params_type, params=state, meta=meta)


def test_fedbn_keeps_local_what_prrfls_fedbn_keeps_local():
    """One rule for what stays at a site: the FLARE component and prrfl's FedBN method find the same keys."""
    from prrfl.methods.fedavg import FedBN
    from prrfl.models.deeplab import DeepLabV2ResNet18
    from prrfl.models.vgg import SlimVGG16BN

    for model in (Net(), SlimVGG16BN(num_classes=3), DeepLabV2ResNet18(num_classes=2)):
        aggregator = FedBNAggregator()
        aggregator.use_model(model)
        assert aggregator.kept_keys == FedBN.local_keys(None, model) == local_batchnorm_keys(model) != set()


def test_accept_aggregate_reset_through_flmodels():
    aggregator = FourierAggregator(weighting="samples")
    aggregator.use_model(Net())
    for client, state in STATES.items():
        aggregator.accept_model(result(client, state, SAMPLES[client]))
    models = aggregator.aggregate_models(round_idx=2, num_rounds=3)
    direct = aggregator.aggregate_states(STATES, SAMPLES, 2, 3)
    assert list(models) == list(STATES)
    for client, model in models.items():
        assert model.params_type == ParamsType.FULL and model.current_round == 2 and model.meta == {PFA_R: 0.48}
        assert all(torch.equal(model.params[k], direct[client][k]) for k in direct[client])
    aggregator.reset_stats()
    with pytest.raises(ValueError, match="no result"):
        aggregator.aggregate_models(0, 3)


def test_accept_model_refuses_what_it_cannot_use():
    aggregator = FedAvgAggregator()  # weighting="samples"
    with pytest.raises(ValueError, match="FULL"):
        aggregator.accept_model(result("a", tiny(1, 2, 3), params_type=ParamsType.DIFF))
    with pytest.raises(ValueError, match=NUM_SAMPLES):
        aggregator.accept_model(result("a", tiny(1, 2, 3), n=None))
    with pytest.raises(ValueError, match="client_name"):
        aggregator.accept_model(FLModel(params=tiny(1, 2, 3), meta={NUM_SAMPLES: 3}))
    aggregator.accept_model(result("a", tiny(1, 2, 3)))
    with pytest.raises(ValueError, match="already"):
        aggregator.accept_model(result("a", tiny(1, 2, 3)))
    FedAvgAggregator(weighting="uniform").accept_model(result("a", tiny(1, 2, 3), n=None))  # no size needed
    steps = FedAvgAggregator()
    steps.accept_model(FLModel(params=tiny(1, 2, 3), meta={"client_name": "a", NUM_STEPS: 40}))  # FLARE's count of local steps
    assert steps._num_samples == {"a": 40}


def test_a_non_finite_or_misshaped_result_is_refused_naming_the_client():
    aggregator = FedAvgAggregator()
    aggregator.set_reference(tiny(0, 0, 0))
    bad = tiny(1, 2, 3)
    bad["fc.weight"] = torch.tensor([[float("nan"), 1.0]])
    with pytest.raises(ValueError, match=r"site-2: parameter fc.weight holds NaN or Inf"):
        aggregator.accept_model(result("site-2", bad))
    wide = {**tiny(1, 2, 3), "fc.weight": torch.ones(1, 3)}
    with pytest.raises(ValueError, match=r"site-3: parameter fc.weight has shape \(1, 3\), expected \(1, 2\)"):
        aggregator.accept_model(result("site-3", wide))
    with pytest.raises(ValueError, match=r"site-4: parameter keys differ .*unexpected \['extra'\]"):
        aggregator.accept_model(result("site-4", {**tiny(1, 2, 3), "extra": torch.ones(1)}))
    aggregator.accept_model(result("site-1", {"fc.weight": torch.ones(1, 2)}))  # a subset of the model's keys is fine
    assert list(aggregator._states) == ["site-1"]  # nothing of the refused ones was kept


def test_a_difference_is_added_to_what_was_sent():
    sent = {"w": torch.tensor([1.0, 2.0]), "bn.running_mean": torch.tensor([0.5])}
    diff = FLModel(params_type=ParamsType.DIFF, params={"w": torch.tensor([0.25, -1.0], dtype=torch.float64)})
    full = full_weights(diff, sent)
    assert full.keys() == {"w"} and torch.equal(full["w"], torch.tensor([1.25, 1.0])) and full["w"].dtype == torch.float32
    assert full_weights(FLModel(params_type=ParamsType.FULL, params={"w": torch.ones(2)}), sent)["w"].tolist() == [1.0, 1.0]
    with pytest.raises(KeyError, match="not sent"):
        full_weights(FLModel(params_type=ParamsType.DIFF, params={"x": torch.ones(1)}), sent)


def test_the_controller_checks_its_arguments():
    with pytest.raises(TypeError, match="PerClientAggregator"):
        PersonalizedFedAvg(num_rounds=2, aggregator=object(), model=Net())
    with pytest.raises(ValueError, match="num_rounds"):
        PersonalizedFedAvg(num_rounds=0, aggregator=FedAvgAggregator(), model=Net())
    with pytest.raises(ValueError, match="num_clients must be None or an integer of at least min_clients=2"):
        PersonalizedFedAvg(num_rounds=2, aggregator=FedAvgAggregator(), model=Net(), min_clients=2, num_clients=1)
    with pytest.raises(ValueError, match="timeout must be seconds >= 0"):
        PersonalizedFedAvg(num_rounds=2, aggregator=FedAvgAggregator(), model=Net(), timeout=-1)
    assert PersonalizedFedAvg(num_rounds=2, aggregator=FedAvgAggregator(), model=Net(), timeout=0).round_deadline(0) is None
    controller = PersonalizedFedAvg(num_rounds=2, aggregator=FedAvgAggregator(), model=Net().state_dict())
    assert controller.initial_state().keys() == Net().state_dict().keys()


# ----- prototypes -----------------------------------------------------------------------------------
def client_meta(seed: int, present: list[bool]) -> dict:
    g = torch.Generator().manual_seed(seed)
    return {
        PROTOTYPES: torch.randn(3, 4, generator=g, dtype=torch.float64).tolist(),
        PROTOTYPE_PRESENT: present,
        CLASS_COUNTS: [seed, 2 * seed, 0 if not present[2] else 1],
    }


RESULTS = {"site-1": client_meta(1, [True, True, False]), "site-2": client_meta(2, [True, True, True])}


def test_prototype_exchange_is_sample_global_prototypes_on_one_continued_generator():
    exchange = PrototypeExchange(std="unbiased", std_floor=0.5, seed=11)
    generator = torch.Generator().manual_seed(11)
    protos = torch.tensor([m[PROTOTYPES] for m in RESULTS.values()], dtype=torch.float64)
    present = torch.tensor([m[PROTOTYPE_PRESENT] for m in RESULTS.values()])
    for _ in range(2):  # the second round continues the stream
        metas = exchange.exchange(RESULTS, clients=["site-1", "site-2", "site-3"])
        want, want_present = sample_global_prototypes(protos, present, generator=generator, std="unbiased", std_floor=0.5)
        assert list(metas) == ["site-1", "site-2", "site-3"]  # a client without a result this round gets them too
        for meta in metas.values():
            assert meta[GLOBAL_PROTOTYPES] == want.tolist() and meta[GLOBAL_PROTOTYPE_PRESENT] == want_present.tolist()
            assert meta[GLOBAL_CLASS_COUNTS] == [3, 6, 1]


def test_a_restored_exchange_draws_what_the_original_draws_next():
    original = PrototypeExchange(seed=3)
    original.exchange(RESULTS)
    saved = original.state_dict()
    next_draw = original.exchange(RESULTS)
    resumed = PrototypeExchange(seed=99)
    resumed.load_state_dict(saved)
    assert resumed.exchange(RESULTS) == next_draw
    assert PrototypeExchange(seed=99).exchange(RESULTS) != next_draw  # the state, not the seed, decides


def test_per_client_draws_one_set_per_client_in_order():
    metas = PrototypeExchange(seed=4, per_client=True).exchange(RESULTS)
    shared = PrototypeExchange(seed=4).exchange(RESULTS)
    assert metas["site-1"][GLOBAL_PROTOTYPES] == shared["site-1"][GLOBAL_PROTOTYPES]  # the first draw
    assert metas["site-2"][GLOBAL_PROTOTYPES] != metas["site-1"][GLOBAL_PROTOTYPES]
    assert shared["site-2"][GLOBAL_PROTOTYPES] == shared["site-1"][GLOBAL_PROTOTYPES]


def test_an_exchange_without_prototypes_sends_counts_only():
    metas = PrototypeExchange().exchange({"a": {CLASS_COUNTS: [1, 2]}, "b": {CLASS_COUNTS: [3, 0]}})
    assert metas == {"a": {GLOBAL_CLASS_COUNTS: [4, 2]}, "b": {GLOBAL_CLASS_COUNTS: [4, 2]}}


def test_tracker_attaches_the_class_means_and_the_reader_finds_them():
    tracker = PrototypeTracker(num_classes=3)
    tracker.update(torch.tensor([[1.0, 0.0], [3.0, 2.0]]), torch.tensor([0, 0]))
    tracker.update(torch.tensor([[0.0, 6.0]]), torch.tensor([2]))
    model = tracker.attach(FLModel(params={}, meta={"kept": 1}), class_counts=[5, 0, 2])
    assert model.meta == {
        "kept": 1,
        PROTOTYPES: [[2.0, 1.0], [0.0, 0.0], [0.0, 6.0]],
        PROTOTYPE_PRESENT: [True, False, True],
        CLASS_COUNTS: [5, 0, 2],
    }
    tracker.reset()
    with pytest.raises(RuntimeError, match="update"):
        tracker.attach(FLModel(params={}), class_counts=[1, 1, 1])
    with pytest.raises(ValueError, match="class_counts"):
        PrototypeTracker(2).attach(FLModel(params={}), class_counts=[1, 1, 1])

    assert GlobalStatistics.from_model(FLModel(params={})) == GlobalStatistics(None, None, None)
    sent = PrototypeExchange().exchange({"a": model.meta})["a"]
    stats = GlobalStatistics.from_model(FLModel(params={}, meta=sent))
    assert stats.class_counts.tolist() == [5, 0, 2] and stats.present.tolist() == [True, False, True]
    assert stats.prototypes.tolist() == [[2.0, 1.0], [0.0, 0.0], [0.0, 6.0]]  # one client: sigma 0, the mean itself


def test_prrfls_sites_read_the_global_prototypes_as_a_flare_client_does():
    """One reader of what the server sends: prrfl's methods keep at a site what `GlobalStatistics` reads."""
    from types import SimpleNamespace

    from prrfl.methods import prototype_exchange
    from prrfl.server import class_statistics

    assert issubclass(GlobalStatistics, class_statistics.GlobalStatistics)
    protos = torch.tensor([[0.5, -1.0], [0.0, 0.0], [2.0, 3.25]], dtype=torch.float64)
    sent = class_statistics.download_meta(protos, torch.tensor([True, False, True]))
    stats = GlobalStatistics.from_model(FLModel(params={}, meta=sent))
    site = SimpleNamespace(memory={})
    prototype_exchange.receive(site, sent)
    assert torch.equal(site.memory["global_prototypes"], stats.prototypes) and site.memory["global_prototypes"].dtype == torch.float64
    assert torch.equal(site.memory["global_present"], stats.present) and stats.present.tolist() == [True, False, True]
    prototype_exchange.receive(site := SimpleNamespace(memory={}), {})  # nothing sent (the first round): nothing kept
    assert site.memory == {} and GlobalStatistics.from_meta({}).prototypes is None


# ----- the DET pair ----------------------------------------------------------------------------------
def pair() -> PersonalizedPair:
    torch.manual_seed(0)
    return PersonalizedPair(Net(), Net())


def test_first_model_goes_to_both_later_ones_to_the_deputy_without_bn():
    p = pair()
    first, second = random_state(1), random_state(2)
    assert p.receive(FLModel(params=first)) is True
    for model in (p.personal, p.deputy):
        assert all(torch.equal(v, first[k]) for k, v in model.state_dict().items())
    assert p.receive(FLModel(params=second)) is False
    personal, deputy = p.personal.state_dict(), p.deputy.state_dict()
    for key in deputy:
        assert torch.equal(personal[key], first[key])  # P is never overwritten
        assert torch.equal(deputy[key], first[key] if key in BN else second[key])  # D keeps its own BN
    shared = {k: v for k, v in second.items() if k not in BN}
    p.receive(FLModel(params={k: v + 1 for k, v in shared.items()}))  # only the shared keys: fine
    assert torch.equal(p.deputy.state_dict()["fc2.weight"], second["fc2.weight"] + 1)


def test_phases_follow_the_scores_and_restart_after_a_download():
    p = pair()
    p.receive(FLModel(params=random_state(1)))
    # personal 0.8: l1 * P = 0.56, l2 * P = 0.72
    assert p.phase(0.8, 0.9) == Phase.RECOVER  # just downloaded, whatever the scores
    assert p.phase(0.8, 0.5) == Phase.RECOVER  # 0.5 < 0.56
    assert p.phase(0.8, 0.75) == Phase.EXCHANGE  # from Recover: never straight to Sublimate
    assert p.phase(0.8, 0.75) == Phase.SUBLIMATE  # 0.75 >= 0.72
    assert p.phase(0.8, 0.6) == Phase.EXCHANGE  # 0.56 <= 0.6 < 0.72: falls back
    p.receive(FLModel(params=random_state(2)))
    assert p.phase(0.8, 0.8) == Phase.RECOVER


def test_distillation_goes_from_the_leading_model_to_the_other():
    p = pair()
    z_p = torch.tensor([[0.0, math.log(3.0)]], requires_grad=True)  # softmax [1/4, 3/4]
    z_d = torch.tensor([[0.0, 0.0]], requires_grad=True)  # softmax [1/2, 1/2]
    d_from_p = 0.25 * math.log(0.5) + 0.75 * math.log(1.5)  # KL([1/4, 3/4] || [1/2, 1/2])
    p_from_d = 0.5 * math.log(2.0) + 0.5 * math.log(2.0 / 3.0)  # KL([1/2, 1/2] || [1/4, 3/4])
    with pytest.raises(RuntimeError, match="phase"):
        p.distillation(z_p, z_d)
    expected = {Phase.RECOVER: (0.0, d_from_p), Phase.EXCHANGE: (p_from_d, d_from_p), Phase.SUBLIMATE: (p_from_d, 0.0)}
    for phase, (for_p, for_d) in expected.items():
        p.current_phase = phase
        extra_p, extra_d = p.distillation(z_p, z_d)
        assert extra_p.item() == pytest.approx(for_p, abs=1e-6) and extra_d.item() == pytest.approx(for_d, abs=1e-6)  # float32
    p.current_phase = Phase.RECOVER
    _, extra_d = p.distillation(z_p, z_d)
    extra_d.backward()
    assert z_p.grad is None and z_d.grad is not None  # the teacher (P) is detached


def test_to_send_is_the_deputys_shared_weights_and_save_load_keeps_the_pair(tmp_path):
    p = pair()
    p.receive(FLModel(params=random_state(1)))
    p.receive(FLModel(params=random_state(2)))
    p.phase(0.8, 0.5)
    sent = p.to_send(metrics={"accuracy": 0.5})
    deputy = p.deputy.state_dict()
    assert sent.params.keys() == set(deputy) - set(BN) and sent.params_type == ParamsType.FULL
    assert all(torch.equal(v, deputy[k]) for k, v in sent.params.items()) and sent.metrics == {"accuracy": 0.5}

    p.save(tmp_path / "pair.pt")
    restored = PersonalizedPair(Net(), Net())
    assert restored.load(tmp_path / "missing.pt") is False and restored.load(tmp_path / "pair.pt") is True
    assert restored.current_phase == Phase.RECOVER and restored.downloads == 2
    for a, b in ((restored.personal, p.personal), (restored.deputy, p.deputy)):
        assert all(torch.equal(v, b.state_dict()[k]) for k, v in a.state_dict().items())
    assert restored.receive(FLModel(params=random_state(3))) is False  # a restarted client is not at its first model
    assert restored.phase(0.8, 0.75) == Phase.RECOVER  # the download restarts DET


# ----- the controller's rounds, with send_each scripted -------------------------------------------------
class ScriptedRounds(PersonalizedFedAvg):
    """PersonalizedFedAvg whose clients' answers are given per round (no FLARE engine)."""

    def __init__(self, answers, models_dir=None, **kwargs):
        super().__init__(**kwargs)
        self.models_dir = models_dir
        self.answers, self.sent, self.messages, self.panicked, self.saved = answers, [], [], None, False
        self.events = []
        self.abort_signal = Signal()

    def sample_clients(self, num_clients=None):
        return ["c", "a", "b"]

    def send_each(self, task_name, models, deadline, round_idx):
        self.sent.append({c: FLModel(params={k: v.clone() for k, v in m.params.items()}, meta=dict(m.meta)) for c, m in models.items()})
        return self.answers[round_idx]

    def info(self, message):
        self.messages.append(message)

    warning = error = info

    def panic(self, reason):
        self.panicked = reason

    def _save_models(self):
        self.saved = True

    def _models_dir(self):
        return self.models_dir

    def round_started(self, round_idx, num_rounds):
        self.events.append(f"ROUND_STARTED {round_idx}/{num_rounds}")

    def before_aggregation(self):
        self.events.append("BEFORE_AGGREGATION")

    def after_aggregation(self, outputs):
        self.events.append(f"AFTER_AGGREGATION {sorted(outputs)}")

    def round_done(self):
        self.events.append("ROUND_DONE")


def diff(client: str, w: list[float], **meta) -> FLModel:
    return FLModel(params_type=ParamsType.DIFF, params={"w": torch.tensor(w)}, meta={"client_name": client, **meta})


def test_clients_that_answer_get_the_aggregate_the_others_keep_their_model():
    initial = {"w": torch.tensor([1.0, 1.0]), "bn.running_mean": torch.tensor([3.0])}
    round0 = Answers(
        results={"a": diff("a", [2.0, 0.0], class_counts=[1, 2]), "b": diff("b", [0.0, 4.0], class_counts=[3, 0])},
        missing={"c": "no result within the deadline"},
    )
    round1 = Answers(results={"a": diff("a", [1.0, 1.0]), "b": diff("b", [1.0, 1.0])})
    controller = ScriptedRounds(
        [round0, round1],
        num_rounds=2,
        aggregator=FedAvgAggregator(weighting="uniform"),
        model=initial,
        prototypes=PrototypeExchange(),
    )
    controller.run()
    assert controller.panicked is None and controller.saved
    first, second = controller.sent
    assert sorted(first) == ["a", "b", "c"] and all(m.meta == {} for m in first.values())
    # round 0: a trained to [3, 1], b to [1, 5] (sent + difference); their average [2, 3]; c keeps the initial model
    assert second["a"].params["w"].tolist() == second["b"].params["w"].tolist() == [2.0, 3.0]
    assert second["c"].params["w"].tolist() == [1.0, 1.0]
    assert all(m.params["bn.running_mean"].tolist() == [3.0] for m in second.values())  # never returned: unchanged
    assert all(m.meta == {GLOBAL_CLASS_COUNTS: [4, 2]} for m in second.values())  # c gets the global statistics too
    assert controller.models["a"]["w"].tolist() == [3.0, 4.0] and controller.models["c"]["w"].tolist() == [1.0, 1.0]
    assert any("no result from c" in m and "keeps its previous model" in m for m in controller.messages)
    assert "round 1: a sent no class_counts and no prototypes: it is left out of the global statistics" in " ".join(controller.messages)
    round_events = ["ROUND_STARTED {}/2", "BEFORE_AGGREGATION", "AFTER_AGGREGATION ['a', 'b']", "ROUND_DONE"]
    assert controller.events == [e.format(0) for e in round_events] + [e.format(1) for e in round_events]  # as FLARE's FedAvg


def test_too_few_usable_results_stop_the_job_without_saving():
    bad = FLModel(params_type=ParamsType.DIFF, params={"x": torch.ones(1)}, meta={"client_name": "a"})  # a key never sent
    answers = Answers(results={"a": bad, "b": diff("b", [1.0, 1.0])}, missing={"c": "gone"})
    controller = ScriptedRounds([answers], num_rounds=1, aggregator=FedAvgAggregator("uniform"), model={"w": torch.zeros(2)}, min_clients=2)
    controller.run()
    assert controller.panicked.startswith("round 0: only 1 of 3 clients sent a usable result (['b'])") and not controller.saved
    assert any("the result of a cannot be used" in m for m in controller.messages)
    assert controller.models["b"]["w"].tolist() == [0.0, 0.0]  # nothing of the failed round is kept


def test_a_non_finite_result_is_refused_by_name_and_poisons_no_one():
    initial = {"w": torch.tensor([1.0, 1.0]), "bn.running_mean": torch.tensor([3.0])}
    poisoned = diff("b", [float("nan"), 0.0])
    rounds = [
        Answers(results={"a": diff("a", [2.0, 0.0]), "b": poisoned, "c": diff("c", [0.0, 2.0])}),
        Answers(results={"a": diff("a", [0.0, 0.0]), "b": diff("b", [0.0, 0.0]), "c": diff("c", [0.0, 0.0])}),
    ]
    aggregator = FourierAggregator(bn_keys=["bn.running_mean"], classifier_key="w", classifier_rowwise=False)
    controller = ScriptedRounds(rounds, num_rounds=2, aggregator=aggregator, model=initial)
    controller.run()
    assert controller.panicked is None and controller.saved
    assert any(m.startswith("round 0: the result of b cannot be used: b: parameter w holds NaN or Inf") for m in controller.messages)
    second = controller.sent[1]
    assert torch.equal(second["b"].params["w"], initial["w"])  # b keeps what it had
    assert all(torch.isfinite(m["w"]).all() for m in controller.models.values())  # and no one is poisoned
    assert second["a"].params["w"].tolist() != [1.0, 1.0]  # a and c were aggregated


def test_each_clients_best_model_is_the_one_its_metric_scored_best(tmp_path):
    """key_metric: a result scores the model its client was sent that round; the best such model is saved."""
    initial = {"w": torch.tensor([1.0, 1.0])}

    def scored(client, w, accuracy):
        return FLModel(
            params_type=ParamsType.DIFF, params={"w": torch.tensor(w)}, metrics={"accuracy": accuracy}, meta={"client_name": client}
        )

    rounds = [
        Answers(results={"a": scored("a", [1.0, 0.0], 0.5), "b": scored("b", [0.0, 1.0], 0.7)}),
        Answers(results={"a": scored("a", [1.0, 0.0], 0.8), "b": scored("b", [0.0, 1.0], 0.6)}),  # a improves, b does not
        Answers(results={"a": scored("a", [1.0, 0.0], 0.4), "b": diff("b", [0.0, 1.0])}),  # b reports no metric this round
    ]
    controller = ScriptedRounds(rounds, models_dir=tmp_path, num_rounds=3, aggregator=FedAvgAggregator("uniform"), model=initial)
    controller.run()
    assert controller.best == {"a": (0.8, 1), "b": (0.7, 0)}
    sent = controller.sent  # the best model is the one sent in the best round
    assert torch.equal(torch.load(tmp_path / "a.best.pt")["w"], sent[1]["a"].params["w"])
    assert torch.equal(torch.load(tmp_path / "b.best.pt")["w"], sent[0]["b"].params["w"])
    assert any("round 1: the model a was sent is its best so far (accuracy 0.8)" in m for m in controller.messages)


def test_a_resumed_controller_goes_on_where_the_saved_state_ends(tmp_path):
    """state_dir + resume: a job stopped after round 0 and re-submitted sends round 1 exactly what an
    uninterrupted job sends, and does not redo round 0."""
    initial = {"w": torch.tensor([1.0, 1.0])}
    answers = [Answers(results={"a": diff("a", [2.0, 0.0], class_counts=[1, 2]), "b": diff("b", [0.0, 4.0], class_counts=[3, 0])})] * 2

    def controller(rounds, **kwargs):
        return ScriptedRounds(
            rounds, num_rounds=2, aggregator=FedAvgAggregator("uniform"), model=initial, prototypes=PrototypeExchange(), **kwargs
        )

    whole = controller(answers)
    whole.run()
    first = controller(answers[:1], state_dir=str(tmp_path))
    first.num_rounds = 1  # the job that stopped after round 0
    first.run()
    resumed = controller([None, answers[1]], state_dir=str(tmp_path), resume=True)
    resumed.run()
    assert len(resumed.sent) == 1  # round 1 only
    assert resumed.sent[0]["a"].params["w"].tolist() == whole.sent[1]["a"].params["w"].tolist() == [2.0, 3.0]
    assert resumed.sent[0]["a"].meta == whole.sent[1]["a"].meta  # the global statistics carried over
    assert resumed.models["b"]["w"].tolist() == whole.models["b"]["w"].tolist()
    with pytest.raises(ValueError, match="state_dir"):
        controller(answers, resume=True)


def test_a_resume_from_another_jobs_state_is_refused_in_one_line_naming_the_file_and_what_differs(tmp_path):
    """The saved state records its job (the model's entries, the aggregator's and the exchange's arguments, the task
    name): a job that is not that one, or whose clients are none of the saved ones, stops before sending anything."""
    answers = [Answers(results={"a": diff("a", [2.0, 0.0]), "b": diff("b", [0.0, 4.0])})]

    def job(model=None, aggregator=None, clients=("c", "a", "b"), **kwargs):
        controller = ScriptedRounds(
            answers, num_rounds=1, aggregator=aggregator or FedAvgAggregator("uniform"), model=model or {"w": torch.ones(2)}, **kwargs
        )
        controller.sample_clients = lambda num_clients=None: list(clients)
        controller.run()
        return controller

    job(state_dir=str(tmp_path))
    path = tmp_path / "personalized_fedavg_state.pt"
    refused = f"the job cannot start: cannot resume from {path}: it is the state of another job: "
    other_model = job({"w": torch.ones(3)}, state_dir=str(tmp_path), resume=True)
    assert other_model.panicked == refused + "model.w: '(2,) torch.float32' saved, '(3,) torch.float32' now" and other_model.sent == []
    other_method = job(aggregator=FedBNAggregator("uniform", local_keys=()), state_dir=str(tmp_path), resume=True)
    assert other_method.panicked == refused + (
        "aggregator.class: 'FedAvgAggregator' saved, 'FedBNAggregator' now; aggregator.local_keys: absent saved, [] now"
    )
    other_clients = job(clients=("x", "y"), state_dir=str(tmp_path), resume=True)
    assert other_clients.panicked == refused + "its clients ['a', 'b', 'c'] are none of this job's ['x', 'y']"
    same = job(state_dir=str(tmp_path), resume=True)
    assert same.panicked is None and same.sent == []  # the saved job: nothing left to train
    unrecorded = torch.load(path, weights_only=False)
    del unrecorded["identity"]
    torch.save(unrecorded, path)
    older = job({"w": torch.ones(3)}, state_dir=str(tmp_path), resume=True)
    assert older.panicked is None and any("does not record the job that saved it" in m for m in older.messages)


def test_the_recipes_export_names_prrfl_only_on_the_server_and_copies_none_of_it(tmp_path, monkeypatch, example_net):
    """A stock Client API script needs no prrfl at the client: the exported clients' configuration names no prrfl
    class and the job carries no (partial) copy of the package; the server's configuration names prrfl's classes."""
    import json

    from prrfl.flare.components.recipe import PersonalizedFedAvgRecipe

    (tmp_path / "client.py").write_text("import nvflare.client as flare\n")
    monkeypatch.chdir(tmp_path)
    recipe = PersonalizedFedAvgRecipe(name="export_check", model=example_net(), train_script="client.py", aggregator=FourierAggregator())
    recipe.export("out")
    app = tmp_path / "out/export_check/app"
    assert "prrfl" not in (app / "config/config_fed_client.json").read_text()
    server = json.loads((app / "config/config_fed_server.json").read_text())
    assert server["workflows"][0]["path"] == "prrfl.flare.components.workflow.PersonalizedFedAvg"
    assert sorted(p.name for p in (app / "custom").iterdir()) == ["client.py", "model.py"]
