"""What a hostile site can send in its upload, on both server paths: prrfl's round (prrfl.server.federation, the
results taken through the workflow's transport) and the FLARE components' controller (PersonalizedFedAvg). Each
upload is refused for its round with a reason naming the site and what was expected, never by stopping the
job, and the others are aggregated to exactly the numbers of a round without the hostile site."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from nvflare.app_common.abstract.fl_model import FLModel, ParamsType
from test_components import ScriptedRounds
from test_federation import federation, reply, started

from prrfl.flare.components import (
    CLASS_COUNTS,
    NUM_SAMPLES,
    NUM_STEPS,
    PROTOTYPE_PRESENT,
    PROTOTYPES,
    Answers,
    FedAvgAggregator,
    PrototypeExchange,
)
from prrfl.flare.server_workflow import round_answers
from prrfl.messages import PrepareReply
from prrfl.server.checks import params_problem, round_value

# what a site sends in place of a float weight -> how the refusal goes on after "parameter <key> "
HOSTILE_VALUES = {
    "complex, full of NaN": (
        lambda v: torch.full(v.shape, complex(math.nan, math.nan)),
        "is torch.complex64, expected floating-point values",
    ),
    "integers": (lambda v: torch.zeros(v.shape, dtype=torch.int64), "is torch.int64, expected floating-point values"),
    "booleans": (lambda v: torch.ones(v.shape, dtype=torch.bool), "is torch.bool, expected floating-point values"),
    "a string": (lambda v: "0.001", "is a str, expected a tensor"),
    "an array of objects": (lambda v: np.full(tuple(v.shape), "x", dtype=object), "is a ndarray, expected a tensor"),
    "a sparse tensor": (lambda v: v.to_sparse(), "is a torch.sparse_coo tensor on cpu, expected a dense tensor"),
    "another shape": (lambda v: torch.zeros(3, 3), "has shape (3, 3), expected"),
}


# ----- prrfl's round: the upload is rejected, the round goes on ----------------------------------------------
SITES = ("A", "B", "C")  # C, the hostile one, comes last in cohort order: the round's others are A and B
PROTOS = {PROTOTYPES: [[0.1] * 8] * 3, PROTOTYPE_PRESENT: [True] * 3}


def site_result(state, site: str, params, method_meta=PROTOS, summary=None, **meta) -> FLModel:
    """A site's result as it reaches the workflow (a DIFF with the site's statistics, method meta and summary)."""
    counts = state.site_counts[site]
    fields = {"num_train": sum(counts), "class_counts": counts, "method": method_meta, "summary": {} if summary is None else summary}
    return FLModel(params_type=ParamsType.DIFF, params=params, meta={**fields, **meta})


def rounds_with_and_without_c(tiny_task, hostile: dict):
    """Round 0 of PRR with A, B and a C sent with `hostile` (site_result's arguments), and without C."""
    fed = federation(tiny_task, method="prr", min_sites=2)
    state = started(fed, tiny_task, SITES)
    good = {k: torch.full_like(v, 1e-3) for k, v in fed.reference().items()}
    results = {s: site_result(state, s, dict(good)) for s in ("A", "B")}
    honest = fed.round(state, 0, round_answers(Answers(results=dict(results), seconds=dict.fromkeys(results, 1.0))))
    results["C"] = site_result(state, "C", **{"params": dict(good), **hostile(good)})
    outcome = fed.round(state, 0, round_answers(Answers(results=results, seconds=dict.fromkeys(results, 1.0))))
    return outcome, honest


def assert_c_alone_rejected(outcome, honest, reason: str) -> None:
    assert outcome.stop is None and outcome.summary.sites == ["A", "B"]
    assert list(outcome.summary.rejected) == ["C"] and reason in outcome.summary.rejected["C"], outcome.summary.rejected
    assert any(text.startswith(f"round 0: rejected the upload of C: {outcome.summary.rejected['C']}") for _, text in outcome.events)
    for site in ("A", "B"):  # the numbers of the round without C
        ours, theirs = outcome.downloads[site], honest.downloads[site]
        assert ours.meta == theirs.meta and all(torch.equal(ours.params[k], theirs.params[k]) for k in theirs.params), site


@pytest.mark.parametrize("name", HOSTILE_VALUES)
def test_a_round_rejects_a_weight_of_another_kind_or_form_by_name(tiny_task, name):
    change, reason = HOSTILE_VALUES[name]
    outcome, honest = rounds_with_and_without_c(tiny_task, lambda good: {"params": {**good, "fc1.weight": change(good["fc1.weight"])}})
    assert_c_alone_rejected(outcome, honest, f"parameter fc1.weight {reason}")


HOSTILE_UPLOADS = {  # site_result's arguments from the good params -> the reason
    "a missing key": (lambda good: {"params": {k: v for k, v in good.items() if k != "fc2.weight"}}, "missing ['fc2.weight']"),
    "params that are a list": (lambda good: {"params": list(good.values())}, "its params are a list, expected a dict of tensors"),
    "prototype rows of strings": (
        lambda good: {"method_meta": {**PROTOS, PROTOTYPES: [["a"] * 8] * 3}},
        "prototypes must be numbers, got a str",
    ),
    "prototype rows that are strings": (
        lambda good: {"method_meta": {**PROTOS, PROTOTYPES: ["abcdefgh"] * 3}},
        "prototype rows must be lists of numbers, got a str",
    ),
    "presence flags that are strings": (
        lambda good: {"method_meta": {**PROTOS, PROTOTYPE_PRESENT: ["yes"] * 3}},
        "prototype_present must be a list of 3 booleans",
    ),
    "a presence that is a number": (
        lambda good: {"method_meta": {**PROTOS, PROTOTYPE_PRESENT: 3}},
        "prototype_present must be a list of 3",
    ),
    "a method meta that is a string": (lambda good: {"method_meta": "prototypes"}, "its meta is a str, expected a dict"),
    "prototypes of another width": (
        lambda good: {"method_meta": {**PROTOS, PROTOTYPES: [[0.1] * 9] * 3}},
        "it sends prototypes of width 9, the round's other 2 upload(s) of width 8",
    ),
    "no prototypes": (lambda good: {"method_meta": {}}, "it sends no prototypes, the round's other 2 upload(s) of width 8"),
    "class counts that are strings": (lambda good: {"class_counts": ["1", "2", "3"]}, "class_counts must be 3 non-negative integers"),
    "counts beyond any integer tensor": (
        lambda good: {"num_train": 2**64, "class_counts": [2**64, 0, 0]},
        "num_train must be a non-negative integer, got 18446744073709551616",
    ),
    "a prototype beyond any float": (
        lambda good: {"method_meta": {**PROTOS, PROTOTYPES: [[10**400] * 8] * 3}},
        "prototypes must be numbers, got an int",
    ),
    "a summary that is a list": (lambda good: {"summary": [1]}, "its round summary is a list, expected a dict"),
    "a tensor in the summary": (lambda good: {"summary": {"ood": torch.ones(1)}}, "its round summary is not plain data"),
    "a metric that is a string": (
        lambda good: {"summary": {"last": {"test": {"accuracy": "high"}}}},
        "summary['last']['test'] must map metric names to numbers",
    ),
    "a trained record of strings": (
        lambda good: {"summary": {"trained": {"epochs_done": "ten", "valid": {}}}},
        "summary['trained']['epochs_done'] must be a non-negative integer, got 'ten'",
    ),
}


@pytest.mark.parametrize("name", HOSTILE_UPLOADS)
def test_a_round_rejects_a_malformed_upload_by_name_and_goes_on_with_the_others(tiny_task, name):
    hostile, reason = HOSTILE_UPLOADS[name]
    outcome, honest = rounds_with_and_without_c(tiny_task, hostile)
    assert_c_alone_rejected(outcome, honest, reason)


@pytest.mark.parametrize("settings", [["a.json"], {"per_site_files": 3}, {"notes": [1, 2]}])
def test_a_site_whose_answer_to_prepare_holds_unusable_settings_is_left_out_by_name(tiny_task, settings):
    fed = federation(tiny_task, min_sites=1)
    replies = {site: reply(tiny_task, site) for site in ("A", "B")}
    replies["B"] = PrepareReply.from_meta({**replies["B"].to_meta(), "settings": settings})
    outcome = fed.start(replies, {}, {}, ["A", "B"], run_id="run")
    assert outcome.stop is None and list(outcome.state.site_counts) == ["A"]
    (line,) = [text for _, text in outcome.events if text.startswith("B did not report usable statistics or settings (its settings report")]
    assert line.endswith("; it is left out of this run")


def test_a_counter_takes_integers_or_a_privacy_filters_floats_but_not_booleans_or_complex():
    reference = {"bn.num_batches_tracked": torch.tensor(3)}
    assert params_problem({"bn.num_batches_tracked": torch.tensor(2)}, reference) is None
    assert params_problem({"bn.num_batches_tracked": torch.tensor(2.0)}, reference) is None  # FLARE's PercentilePrivacy returns floats
    expected = "expected integer or floating-point values as the model's torch.int64"
    assert (
        params_problem({"bn.num_batches_tracked": torch.tensor(True)}, reference)
        == f"parameter bn.num_batches_tracked is torch.bool, {expected}"
    )
    assert (
        params_problem({"bn.num_batches_tracked": torch.tensor(1j)}, reference)
        == f"parameter bn.num_batches_tracked is torch.complex64, {expected}"
    )
    assert (
        params_problem({"bn.num_batches_tracked": torch.tensor(math.inf)}, reference) == "parameter bn.num_batches_tracked holds NaN or Inf"
    )


def test_the_round_value_is_the_most_common_and_a_tie_goes_to_the_rank_then_the_first_site():
    assert round_value({"a": 8, "b": 9, "c": 8}) == 8
    assert round_value({"a": 9, "b": 8}) == 9  # a tie, no rank: the first site's
    assert round_value({"a": 0, "b": 8}, rank=lambda width: width > 0) == 8
    assert round_value({}) is None


# ----- the FLARE components: the result is refused, the round goes on ----------------------------------------
INITIAL = {"w": torch.tensor([1.0, 1.0]), "v": torch.tensor([[0.5, -0.5]]), "n": torch.tensor(3)}
STATS = {  # each client's class counts and prototypes
    "a": {CLASS_COUNTS: [1, 2, 0], PROTOTYPES: [[0.1, 0.2]] * 3, PROTOTYPE_PRESENT: [True, True, False]},
    "b": {CLASS_COUNTS: [3, 0, 4], PROTOTYPES: [[0.3, -0.2]] * 3, PROTOTYPE_PRESENT: [True, False, True]},
}


def client_result(client: str, params_type=ParamsType.DIFF, params=None, **meta) -> FLModel:
    """A client's result: its DIFF (or FULL weights), its training-set size and statistics."""
    if params is None:
        step = {"a": 1.0, "b": -3.0, "c": 2.0}[client]
        diff = {"w": torch.tensor([step, 0.5]), "v": torch.tensor([[0.0, step]]), "n": torch.tensor(2)}
        params = diff if params_type == ParamsType.DIFF else {k: INITIAL[k] + d for k, d in diff.items()}
    fields = {"client_name": client, NUM_SAMPLES: {"a": 10, "b": 30, "c": 20}[client], **STATS.get(client, STATS["a"])}
    return FLModel(params_type=params_type, params=params, meta={**fields, **meta})


def two_rounds(c_round0: FLModel | None, min_clients: int = 2, weighting: str = "samples") -> ScriptedRounds:
    """Two rounds of FedAvg with a prototype exchange; in round 0 client c answers `c_round0` (None: nothing)."""
    round0 = {"a": client_result("a"), "b": client_result("b")}
    if c_round0 is not None:
        round0["c"] = c_round0
    rounds = [Answers(results=round0), Answers(results={c: client_result(c) for c in "abc"})]
    controller = ScriptedRounds(
        rounds, num_rounds=2, aggregator=FedAvgAggregator(weighting), model=INITIAL, prototypes=PrototypeExchange(), min_clients=min_clients
    )
    controller.run()
    return controller


def assert_as_without_c(controller: ScriptedRounds, reason: str) -> None:
    """The job went on; c was named with `reason` and kept its model; a and b got what they get without c."""
    honest = two_rounds(None)
    assert controller.panicked is None and controller.saved
    refusals = [m for m in controller.messages if m.startswith("round 0: the result of c cannot be used: ")]
    assert len(refusals) == 1 and reason in refusals[0] and refusals[0].endswith("; it keeps its previous model"), controller.messages
    sent = controller.sent[1]
    assert all(torch.equal(sent["c"].params[k], INITIAL[k]) for k in INITIAL)  # c keeps what it had
    for client in ("a", "b"):
        ours, theirs = sent[client], honest.sent[1][client]
        assert ours.meta == theirs.meta and all(torch.equal(ours.params[k], theirs.params[k]) for k in INITIAL), client


@pytest.mark.parametrize("params_type", [ParamsType.DIFF, ParamsType.FULL])
@pytest.mark.parametrize("name", HOSTILE_VALUES)
def test_a_component_round_refuses_a_weight_of_another_kind_or_form_by_name(name, params_type):
    change, reason = HOSTILE_VALUES[name]
    params = {**client_result("c", params_type).params}
    params["w"] = change(params["w"])
    controller = two_rounds(client_result("c", params_type, params))
    assert_as_without_c(controller, f"c: parameter w {reason}")


def test_a_component_round_refuses_a_client_that_lacks_a_key_and_goes_on_with_the_others():
    """A client that sends fewer keys than the round's others is refused with the key; the others (min_clients of
    them) are aggregated. Before, the aggregation found different keys and the job stopped."""
    lacking = client_result("c", params={k: v for k, v in client_result("c").params.items() if k != "v"})
    assert_as_without_c(two_rounds(lacking), "c: its keys differ from those of the round's other 2 result(s): it lacks ['v']")
    extra = client_result("c", params={**client_result("c").params, "x": torch.ones(1)})
    assert_as_without_c(two_rounds(extra), "a difference for keys that were not sent: ['x']")


def test_too_few_clients_left_after_a_refusal_stop_the_job_naming_them():
    controller = two_rounds(client_result("c", params={"w": torch.ones(2)}), min_clients=3)
    assert controller.panicked.startswith("round 0: only 2 of 3 clients sent a usable result (['a', 'b'])")
    assert any("the result of c cannot be used: c: its keys differ" in m and "it lacks ['n', 'v']" in m for m in controller.messages)


def steps_result(client: str, steps: int, params_type=ParamsType.DIFF) -> FLModel:
    """A client that weights its result by FLARE's count of local steps, not by its training-set size."""
    result = client_result(client, params_type, **{NUM_STEPS: steps})
    del result.meta[NUM_SAMPLES]
    return result


def test_mixed_weight_units_in_one_round_are_refused_by_name():
    """Local steps (FLARE's NUM_STEPS_CURRENT_ROUND) among training-set sizes would weigh that client in the wrong
    unit (~steps/samples of its due): it is refused, naming both units. A round of one unit is aggregated, and
    so is any round with uniform weights."""
    reason = (
        "c: its weight is meta['NUM_STEPS_CURRENT_ROUND'] (local steps) while the round's other 2 result(s) send "
        "meta['num_samples'] (training-set size)"
    )
    assert_as_without_c(two_rounds(steps_result("c", 5)), reason)
    tie = ScriptedRounds(
        [Answers(results={"a": client_result("a"), "c": steps_result("c", 5)})], num_rounds=1, aggregator=FedAvgAggregator(), model=INITIAL
    )
    tie.run()  # one of each: the training-set size wins the tie, and min_clients=1 goes on with a
    assert tie.panicked is None and any("the result of c cannot be used: c: its weight is meta['NUM_STEPS" in m for m in tie.messages)
    huge = client_result("c", **{NUM_SAMPLES: 10**400})  # no float holds it: the weights could not be computed
    assert_as_without_c(two_rounds(huge), "c: weighting='samples' needs meta['num_samples'] (training-set size)")
    only_steps = FedAvgAggregator()
    for client, n in (("a", 4), ("b", 12)):
        only_steps.accept_model(steps_result(client, n, ParamsType.FULL))
    assert only_steps.refuse_disagreeing() == {} and only_steps._num_samples == {"a": 4, "b": 12}
    uniform = two_rounds(steps_result("c", 5), weighting="uniform")
    assert uniform.panicked is None and not any("cannot be used" in m for m in uniform.messages)


HOSTILE_STATISTICS = {  # c's meta -> the reason, and which of its statistics the exchange still uses
    "class counts that are strings": (
        {CLASS_COUNTS: ["1", "2", "3"]},
        "class_counts must be a list of non-negative integers",
        (PROTOTYPES,),
    ),
    "class counts beyond a long": ({CLASS_COUNTS: [2**64, 0, 0]}, "class_counts must be a list of non-negative integers", (PROTOTYPES,)),
    "prototype rows of strings": ({PROTOTYPES: [["a", "b"]] * 3}, "prototypes must be numbers, got a str", (CLASS_COUNTS,)),
    "presence flags that are numbers": ({PROTOTYPE_PRESENT: [1, 0, 1]}, "prototype_present must be a list of 3 booleans", (CLASS_COUNTS,)),
    "prototypes of another width": ({PROTOTYPES: [[0.1, 0.2, 0.3]] * 3}, "they have 3 dimensions, the round's others 2", (CLASS_COUNTS,)),
    "statistics of another number of classes": (
        {CLASS_COUNTS: [1, 2], PROTOTYPES: [[0.1, 0.2]] * 2, PROTOTYPE_PRESENT: [True, True]},
        "they count 2 classes, the round's others 3",
        (),
    ),
}


@pytest.mark.parametrize("name", HOSTILE_STATISTICS)
def test_a_clients_unusable_statistics_are_left_out_by_name_and_the_others_exchanged(name):
    hostile, reason, kept = HOSTILE_STATISTICS[name]
    controller = two_rounds(client_result("c", **hostile))
    assert controller.panicked is None and controller.saved
    warnings = [m for m in controller.messages if m.startswith("round 0: c: its ")]
    assert len(warnings) == 1 and "left out of the global statistics" in warnings[0] and reason in warnings[0], controller.messages
    # c sends a's statistics but for the hostile part; what is kept of them is exchanged with a's and b's
    usable = {k: v for k, v in STATS["a"].items() if k in kept or (k == PROTOTYPE_PRESENT and PROTOTYPES in kept)}
    reference = PrototypeExchange().exchange({"a": STATS["a"], "b": STATS["b"], "c": usable}, ["a", "b", "c"])
    assert {client: controller.sent[1][client].meta for client in "abc"} == reference


def test_metrics_that_are_not_a_dict_do_not_stop_the_job():
    result = client_result("c")
    result.metrics = ["accuracy", 0.9]  # what a hostile script may report as its metrics
    controller = two_rounds(result)
    assert controller.panicked is None and controller.saved
    assert not any("cannot be used" in m for m in controller.messages)
