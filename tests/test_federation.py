"""The server's round logic in-process (prrfl.server.federation): what the FLARE workflow does with the answers of a
round, without a simulator. Sites are TinyTask runtimes running the real site loop, or hand-made uploads
where a test needs a site that misbehaves in one exact way."""

from __future__ import annotations

import copy
import math

import pytest
import torch
from conftest import make_runtime

from prrfl.algorithms import pfa
from prrfl.config import RunConfig
from prrfl.flare import task_protocol as P
from prrfl.messages import PrepareReply, Upload
from prrfl.registry import build_method
from prrfl.server.federation import Federation, RoundAnswers, ServerState
from prrfl.site.trainer import run_round

SITES = ("A", "B")


def federation(task, **cfg) -> Federation:
    config = RunConfig.from_dict({"task": "tiny", "num_rounds": 3, "local_epochs": 1, "batch_size": 8, "lr": 0.05, **cfg})
    return Federation(config, task, build_method(config, task))


def reply(task, site: str, **changes) -> PrepareReply:
    data = task.load_site(site, torch.device("cpu"))
    fields = {"cohort": site, "num_train": data.num_train, "class_counts": data.class_counts, "state_dir": f"/state/{site}"}
    return PrepareReply(**{**fields, **changes})


def started(fed: Federation, task, sites=SITES) -> ServerState:
    outcome = fed.start({s: reply(task, s) for s in sites}, {}, {}, list(sites), run_id="run")
    assert outcome.stop is None, outcome.stop
    return outcome.state


def as_download(fed: Federation, state: ServerState, site: str, round_idx: int):
    """What the site receives: the state's download through the FLARE message and back."""
    common = {
        P.CONFIG: fed.cfg.to_dict(),
        P.RUN_ID: state.run_id,
        P.NUM_SITES: len(state.site_counts),
        P.GLOBAL_COUNTS: state.global_counts,
    }
    return P.model_to_download(P.download_to_model(state.downloads[site], common, round_idx, fed.cfg.num_rounds))


def difference(upload: Upload, sent: dict[str, torch.Tensor]) -> Upload:
    """An upload as the server receives it: the trained weights minus what the site was sent."""
    return Upload(upload.site, {k: v - sent[k] for k, v in upload.params.items()}, upload.num_train, upload.class_counts, upload.meta)


def honest_answers(fed: Federation, state: ServerState, round_idx: int, runtimes: dict) -> RoundAnswers:
    """Every site runs the real site loop on its download and answers with its difference."""
    answers = RoundAnswers()
    for site, runtime in runtimes.items():
        upload = run_round(runtime, as_download(fed, state, site, round_idx), round_idx)
        answers.uploads[site] = difference(upload, state.downloads[site].params)
        answers.summaries[site] = {"round": round_idx}
        answers.seconds[site] = 1.0
    return answers


def scaled(upload: Upload, factor: float) -> Upload:
    params = {k: v * factor if v.is_floating_point() else v for k, v in upload.params.items()}  # counters stay integers
    return Upload(upload.site, params, upload.num_train, upload.class_counts, upload.meta)


def test_start_sums_the_counts_gives_every_site_the_seeds_model_and_leaves_out_bad_statistics(tiny_task):
    fed = federation(tiny_task, seed=5, min_sites=1)
    a, b = reply(tiny_task, "A"), reply(tiny_task, "B")
    bad = reply(tiny_task, "C", class_counts=[-1, 0, 0])
    outcome = fed.start(
        {"A": a, "B": b, "C": bad}, {"D": "ValueError: no data"}, {"E": "no result within the deadline (60 s)"}, list("ABCDE")
    )
    state = outcome.state
    assert sorted(state.site_counts) == ["A", "B"] and state.global_counts == [x + y for x, y in zip(a.class_counts, b.class_counts)]
    torch.manual_seed(5)
    expected = fed.method.build_model().state_dict()
    for site in ("A", "B"):
        assert all(torch.equal(state.downloads[site].params[k], v) for k, v in expected.items())
    lines = [text for _, text in outcome.events]
    assert any(line.startswith("C did not report usable statistics or settings (class_counts must be 3 non-negative") for line in lines)
    assert "D cannot take part in this run: ValueError: no data" in lines
    assert "E cannot take part in this run: no answer to prepare: no result within the deadline (60 s)" in lines
    stopped = federation(tiny_task, min_sites="all").start({"A": a}, {}, {}, ["A", "B"])
    assert stopped.state is None and stopped.stop == "only 1 of 2 sites prepared their data, fewer than min_sites=all (2)"


def test_a_prr_round_gives_each_site_its_own_pfa_of_the_trained_deputies_and_does_not_touch_the_input_state(tiny_task, tmp_path):
    fed = federation(tiny_task, method="prr")
    state = started(fed, tiny_task)
    before = copy.deepcopy(state.to_dict())
    runtimes = {s: make_runtime(tiny_task, tmp_path, site=s, method="prr", num_rounds=3, local_epochs=1) for s in SITES}
    answers = honest_answers(fed, state, 0, runtimes)
    outcome = fed.round(state, 0, answers)

    new = outcome.state
    assert outcome.stop is None and new.next_round == 1 and outcome.summary.sites == ["A", "B"]
    trained = [{k: state.downloads[s].params[k] + d for k, d in answers.uploads[s].params.items()} for s in SITES]
    expected = pfa.pfa_aggregate(trained, pfa.pfa_threshold(0, 3), classifier_key="fc2.weight", bn_keys=set())
    for site, want in zip(SITES, expected):
        assert all(torch.equal(new.downloads[site].params[k], want[k]) for k in want), site
    assert not torch.equal(new.downloads["A"].params["fc2.weight"], new.downloads["B"].params["fc2.weight"])  # personalized
    assert new.history[-1]["round"] == 0 and set(new.history[-1]["norms"]) == {"A", "B"}
    assert torch.equal(state.to_dict()["downloads"]["A"].params["fc2.weight"], before["downloads"]["A"].params["fc2.weight"])
    assert state.history == before["history"] == [] and state.next_round == 0 and state.method_memory == before["method_memory"]


def test_malformed_uploads_and_a_failed_site_are_left_out_and_keep_their_download(tiny_task):
    fed = federation(tiny_task, method="prr", min_sites=1)
    sites = ("A", "B", "C", "D")
    state = started(fed, tiny_task, sites)
    good = {k: torch.full_like(v, 1e-3) for k, v in fed.reference().items()}
    meta = {"prototypes": [[0.1] * 8] * 3, "prototype_present": [True] * 3}
    counts = state.site_counts

    def upload(site, params=good, class_counts=None, meta=meta):
        return Upload(site, dict(params), sum(counts[site]), class_counts or counts[site], dict(meta))

    nan = {**good, "fc1.weight": torch.full_like(good["fc1.weight"], math.nan)}
    answers = RoundAnswers(
        uploads={
            "A": upload("A"),
            "B": upload("B", params=nan),
            "C": upload("C", meta={**meta, "prototypes": meta["prototypes"][:2]}),
        },
        failed={"D": "RuntimeError: out of memory"},
    )
    outcome = fed.round(state, 0, answers)
    assert outcome.summary.sites == ["A"] and outcome.summary.failed == {"D": "RuntimeError: out of memory"}
    assert outcome.summary.rejected == {"B": "parameter fc1.weight holds NaN or Inf", "C": "prototypes must have one row per class (3)"}
    for site in ("B", "C", "D"):
        assert outcome.state.downloads[site] is state.downloads[site]  # its previous download
    lines = [text for _, text in outcome.events]
    assert "round 0: rejected the upload of B: parameter fc1.weight holds NaN or Inf" in lines
    assert "round 0: D failed: RuntimeError: out of memory; it keeps its previous download" in lines
    negative = fed.round(state, 0, RoundAnswers(uploads={"A": upload("A", class_counts=[-1, 0, 0])}))
    assert negative.stop and negative.state is None  # its only upload refused: none usable
    assert any(
        text.startswith("round 0: rejected the upload of A: class_counts must be 3 non-negative integers") for _, text in negative.events
    )


def test_with_two_sites_a_huge_update_is_refused_and_the_honest_model_is_not_poisoned(tiny_task, tmp_path):
    """One of 2 sites scales its update by 1e4 every round: the round's rule (lower median of 2) refuses the
    larger; min_sites 1 lets the honest site go on, and the norm history keeps only its accepted norms."""
    fed = federation(tiny_task, method="fedavg", min_sites=1)
    state = started(fed, tiny_task)
    runtimes = {s: make_runtime(tiny_task, tmp_path, site=s, method="fedavg", local_epochs=1) for s in SITES}
    for round_idx in (0, 1):
        answers = honest_answers(fed, state, round_idx, runtimes)
        honest_norm = math.sqrt(
            sum(float(v.double().square().sum()) for v in answers.uploads["B"].params.values() if v.is_floating_point())
        )
        answers.uploads["B"] = scaled(answers.uploads["B"], 1e4)
        outcome = fed.round(state, round_idx, answers)
        (reason,) = outcome.summary.rejected.values()
        assert list(outcome.summary.rejected) == ["B"] and outcome.summary.sites == ["A"]
        assert "x the round's median" in reason and "update_norm_ratio=10" in reason
        assert outcome.summary.norms["B"] == pytest.approx(1e4 * honest_norm, rel=1e-5)
        state = outcome.state
    assert list(state.update_norms) == ["A"] and len(state.update_norms["A"]) == 2
    weights = state.downloads["A"].params
    assert max(float(v.abs().max()) for v in weights.values() if v.is_floating_point()) < 1e3


def test_fewer_usable_uploads_than_min_sites_stop_the_job_without_a_new_state(tiny_task):
    fed = federation(tiny_task, method="fedavg")  # majority of 2 = 2
    state = started(fed, tiny_task)
    good = {k: torch.zeros_like(v) for k, v in fed.reference().items()}
    a = Upload("A", good, sum(state.site_counts["A"]), state.site_counts["A"])
    outcome = fed.round(state, 0, RoundAnswers(uploads={"A": a}, missing={"B": "no result within the deadline (60 s)"}))
    assert outcome.state is None and outcome.downloads == {}
    assert (
        outcome.stop
        == "round 0: only 1 of 2 sites sent a usable upload (left out: ['B']), fewer than min_sites=majority (2); the job stops"
    )
    assert state.next_round == 0 and state.history == []


def test_results_mark_participation_and_give_fedavgs_global_model(tiny_task, tmp_path):
    fed = federation(tiny_task, method="fedavg", min_sites=1)
    state = started(fed, tiny_task)
    runtimes = {s: make_runtime(tiny_task, tmp_path, site=s, method="fedavg", local_epochs=1) for s in SITES}
    answers = honest_answers(fed, state, 0, runtimes)
    state = fed.round(state, 0, answers).state
    answers = honest_answers(fed, state, 1, {"A": runtimes["A"]})
    state = fed.round(state, 1, RoundAnswers(**{**vars(answers), "missing": {"B": "no result within the deadline (60 s)"}})).state
    results, global_params, table = fed.results(state)
    assert results["sites"]["B"]["participation"] == {"rounds": 2, "aggregated": [0], "missed": [1], "stale": True}
    assert results["sites"]["A"]["participation"]["aggregated"] == [0, 1]
    assert all(torch.equal(global_params[k], state.downloads["A"].params[k]) for k in global_params)  # the average A got
    assert "| A | - | 2/2 |" in table and "| B (stale) | - | 1/2 |" in table


def test_a_saved_state_round_trips_and_an_old_one_takes_the_new_fields_defaults(tiny_task):
    state = started(federation(tiny_task), tiny_task)
    assert ServerState.from_dict(state.to_dict()) == state
    old = {k: v for k, v in state.to_dict().items() if k not in ("update_norms", "round_estimates")}
    assert ServerState.from_dict(old).update_norms == {}
    with pytest.raises(ValueError, match=r"lacks \['downloads', 'global_counts'\]"):
        ServerState.from_dict({k: v for k, v in old.items() if k not in ("downloads", "global_counts")})


def test_uploads_are_aggregated_in_cohort_order_whatever_the_flare_client_names(tiny_task, tmp_path):
    """A deployment names its clients after hospitals; the server orders them by cohort (the task's table), so
    its float sums, and every later number, are the simulator's (site-1 = the first cohort, ...)."""
    fed = federation(tiny_task, method="prr")
    state = started(fed, tiny_task)
    runtimes = {s: make_runtime(tiny_task, tmp_path, site=s, method="prr", num_rounds=3, local_epochs=1) for s in SITES}
    answers = honest_answers(fed, state, 0, runtimes)
    named = {"zz-hospital": "A", "aa-hospital": "B"}  # by name, the second cohort would come first
    deployed = fed.start({n: reply(tiny_task, c) for n, c in named.items()}, {}, {}, list(named), run_id="run").state
    renamed = RoundAnswers()
    for name, cohort in named.items():
        up = answers.uploads[cohort]
        renamed.uploads[name] = Upload(name, up.params, up.num_train, up.class_counts, up.meta)
    assert fed.in_cohort_order(deployed, ["aa-hospital", "zz-hospital"]) == ["zz-hospital", "aa-hospital"]
    simulated, deployment = fed.round(state, 0, answers), fed.round(deployed, 0, renamed)
    assert deployment.summary.sites == ["aa-hospital", "zz-hospital"]  # who took part, by name
    for name, cohort in named.items():
        ours, theirs = deployment.state.downloads[name].params, simulated.state.downloads[cohort].params
        assert all(torch.equal(ours[k], theirs[k]) for k in theirs), name
