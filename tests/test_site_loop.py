"""The shared site loop with PRR on a tiny task: downloads, DET, checkpoints, determinism."""

from __future__ import annotations

import copy
import dataclasses
import json

import numpy as np
import pytest
import torch
from conftest import as_numpy, make_runtime, untimed

from prrfl.messages import Download
from prrfl.methods.view import SiteView
from prrfl.metrics import download_drops, shared_model_drops
from prrfl.site.trainer import PHASES, run_round, score_last_download

COUNTS = [20, 20, 20]


def initial_download(task) -> Download:
    torch.manual_seed(0)
    return Download(params=task.build_model().state_dict(), round=0, global_class_counts=COUNTS)


def next_download(upload, round_idx: int, shift: float = 0.0) -> Download:
    params = {k: v + shift if v.is_floating_point() else v for k, v in upload.params.items()}
    protos = upload.meta["prototypes"]
    return Download(
        params=params,
        round=round_idx,
        global_class_counts=COUNTS,
        meta={
            "pfa_r": 0.4,
            "global_prototypes": protos,
            "global_prototype_present": upload.meta["prototype_present"],
        },
    )


def test_first_round_starts_both_models_from_the_download_and_uploads_the_deputy(tiny_task, tmp_path):
    site = make_runtime(tiny_task, tmp_path)
    download = initial_download(tiny_task)
    upload = run_round(site, download, 0)
    bn_keys = {k for k in download.params if k.startswith("bn.")}
    assert set(upload.params) == set(download.params) - bn_keys  # BN never leaves the site
    deputy = site.models["deputy"].state_dict()
    assert all(torch.equal(upload.params[k], deputy[k]) for k in upload.params)
    assert np.array(upload.meta["prototypes"]).shape == (3, 8)
    assert upload.class_counts == [10, 10, 10] and upload.num_train == 30
    # P and D start from the same download and, with the teacher's KL term zero at equal models, round 0 keeps
    # them equal up to float rounding. The next download (shifted) goes to D only, so P and D differ from
    # there on by construction: what is uploaded is D's, not P's
    upload = run_round(site, next_download(upload, 1, shift=0.5), 1)
    deputy, personal = site.models["deputy"].state_dict(), site.models["personal"].state_dict()
    assert all(torch.equal(upload.params[k], deputy[k]) for k in upload.params)
    assert (upload.params["fc2.weight"] - personal["fc2.weight"]).abs().max() > 0.1


def test_download_overwrites_only_the_deputys_shared_weights(tiny_task, tmp_path):
    site = make_runtime(tiny_task, tmp_path)
    upload = run_round(site, initial_download(tiny_task), 0)
    personal_before = as_numpy(site.models["personal"].state_dict())
    deputy_bn_before = as_numpy({k: v for k, v in site.models["deputy"].state_dict().items() if k.startswith("bn.")})
    download = next_download(upload, 1, shift=0.5)
    site.method.on_download(site.view(), download, first=False)
    deputy = site.models["deputy"].state_dict()
    for key, value in download.params.items():
        assert torch.equal(deputy[key], value)
    for key, value in deputy_bn_before.items():
        np.testing.assert_array_equal(deputy[key].numpy(), value)
    for key, value in site.models["personal"].state_dict().items():
        np.testing.assert_array_equal(value.numpy(), personal_before[key])  # P is never overwritten
    assert site.memory["phase"] is None  # DET restarts at the download


def test_every_round_opens_in_recover_and_logs_the_expected_scalars(tiny_task, tmp_path):
    site = make_runtime(tiny_task, tmp_path)
    upload = run_round(site, initial_download(tiny_task), 0)
    run_round(site, next_download(upload, 1), 1)
    phases: dict[int, list[str]] = {}  # step -> the DET phases marked 1 (by name) at that epoch
    for tag, value, step in site.scalars:
        if tag in ("det/recover", "det/exchange", "det/sublimate"):
            assert value in (0.0, 1.0)
            phases.setdefault(step, []).extend([tag[4:]] if value else [])
    assert sorted(phases) == [0, 1, 2, 3] and all(len(names) == 1 for names in phases.values())
    assert phases[0] == phases[2] == ["recover"]  # first epoch of rounds 0 and 1 (2 local epochs per round)
    tags = {tag for tag, _, _ in site.scalars}
    for expected in ("loss/personal", "loss/deputy", "cpa/gamma_a", "valid/f1", "test/auc", "epoch_test/f1", "retrogress/f1_drop"):
        assert expected in tags
    assert "pfa/r" not in tags  # the server logs it once, in the federation run
    drops = [(value, step) for tag, value, step in site.scalars if tag == "retrogress/f1_drop"]
    assert drops == [(pytest.approx(site.download_drop(1)), 2)]  # at the epoch the download of round 1 is used
    gammas = [value for tag, value, step in site.scalars if tag.startswith("cpa/gamma") and step >= 2]
    assert any(g != 1.0 for g in gammas)  # prototypes refine the loss once a global prototype arrived


def test_the_deputy_is_measured_as_uploaded_and_right_after_the_download_overwrites_it(tiny_task, tmp_path):
    """PRR reports P but uploads D: D's test metrics are recorded at the end of a round (what it uploads) and
    right after the next download (the download's weights under the site's own BN), and their difference
    is the shared model's retrogress, which PFA is meant to soften."""
    site = make_runtime(tiny_task, tmp_path)
    upload = run_round(site, initial_download(tiny_task), 0)
    as_uploaded = site.evaluate("deputy", "test")
    assert site.history[-1]["kind"] == "round" and site.history[-1]["shared_test"] == as_uploaded
    download = next_download(upload, 1, shift=0.05)
    received, personal = copy.deepcopy(site.models["deputy"]), copy.deepcopy(site.models["personal"])
    received.load_state_dict(download.params, strict=False)  # what on_download does to D, done by hand
    test_split = site.data.split("test")
    expected_shared, expected_reported = (tiny_task.evaluate(m, test_split, site.eval_batch_size) for m in (received, personal))
    run_round(site, download, 1)
    entry = next(h for h in site.history if h["kind"] == "download")
    assert entry["shared_test"] == expected_shared and entry["test"] == expected_reported
    assert entry["shared_test"] != entry["test"]  # two models
    assert shared_model_drops(site.history, "f1") == {1: (as_uploaded["f1"], expected_shared["f1"])}
    logged = [(value, step) for tag, value, step in site.scalars if tag == "retrogress/shared_f1_drop"]
    assert logged == [(pytest.approx(as_uploaded["f1"] - expected_shared["f1"]), 2)]


def test_a_method_that_uploads_its_reported_model_records_that_model_as_the_shared_one(tiny_task, tmp_path):
    site = make_runtime(tiny_task, tmp_path, method="fedavg")
    upload = run_round(site, Download(params=site.models["local"].state_dict(), round=0), 0)
    run_round(site, Download(params=upload.params, round=1), 1)
    shared = [h for h in site.history if "shared_test" in h]
    assert [h["kind"] for h in shared] == ["round", "download", "round"]
    assert all(h["shared_test"] == h["test"] for h in shared)
    assert shared_model_drops(site.history, "f1") == download_drops(site.history, "f1")
    assert not any(tag == "retrogress/shared_f1_drop" for tag, _, _ in site.scalars)  # it would repeat retrogress/f1_drop


def test_checkpoint_resume_reproduces_an_uninterrupted_run(tiny_task, tmp_path):
    straight = make_runtime(tiny_task, tmp_path / "straight")
    up0 = run_round(straight, initial_download(tiny_task), 0)
    up1 = run_round(straight, next_download(up0, 1), 1)

    first = make_runtime(tiny_task, tmp_path / "restarted")
    up0_b = run_round(first, initial_download(tiny_task), 0)
    restarted = make_runtime(tiny_task, tmp_path / "restarted")  # a new process: fresh objects
    assert restarted.restore() and restarted.round_idx == 0
    up1_b = run_round(restarted, next_download(up0_b, 1), 1)
    for key in up1.params:
        torch.testing.assert_close(up1.params[key], up1_b.params[key], rtol=0, atol=0)
    assert untimed(restarted.history) == untimed(straight.history)


def test_a_round_the_server_did_not_record_is_redone_from_the_previous_checkpoint(tiny_task, tmp_path):
    """The server died after the site finished round 1: the resumed job sends round 1 again."""
    site = make_runtime(tiny_task, tmp_path)
    round1 = next_download(run_round(site, initial_download(tiny_task), 0), 1)
    up1 = run_round(site, round1, 1)
    again = make_runtime(tiny_task, tmp_path)
    assert again.restore(before_round=1) and again.round_idx == 0  # not the round-1 checkpoint
    up1_again = run_round(again, round1, 1)
    for key in up1.params:
        torch.testing.assert_close(up1.params[key], up1_again.params[key], rtol=0, atol=0)
    assert untimed(again.history) == untimed(site.history)  # round 1 once, not twice
    fresh = make_runtime(tiny_task, tmp_path)
    assert not fresh.restore(before_round=0) and fresh.round_idx == -1  # a new run's prepare task


def test_rounds_a_site_missed_are_reported(tiny_task, tmp_path):
    site = make_runtime(tiny_task, tmp_path)
    up0 = run_round(site, initial_download(tiny_task), 0)
    run_round(site, next_download(up0, 2), 2)  # down during round 1
    results = json.loads((site.state_dir / "results.json").read_text())
    assert results["rounds_completed"] == 3 and results["rounds_missed"] == [1]


def test_a_checkpoint_of_another_run_is_ignored(tiny_task, tmp_path):
    site = make_runtime(tiny_task, tmp_path, run_id="old")
    run_round(site, initial_download(tiny_task), 0)
    other = make_runtime(tiny_task, tmp_path, run_id="new")
    assert not other.restore() and other.round_idx == -1


def test_results_and_best_model_are_written(tiny_task, tmp_path):
    site = make_runtime(tiny_task, tmp_path)
    upload = run_round(site, initial_download(tiny_task), 0)
    run_round(site, next_download(upload, 1), 1)
    results = json.loads((site.state_dir / "results.json").read_text())
    assert results["rounds_completed"] == 2 and results["best"]["round"] in (0, 1)
    assert {"f1", "auc"} <= set(results["best"]["test"])
    kinds = [h["kind"] for h in results["history"]]
    assert kinds == ["epoch", "epoch", "round", "download", "epoch", "epoch", "round"]
    assert [h["epochs_done"] for h in results["history"]] == [1, 2, 2, 2, 3, 4, 4]
    assert (site.state_dir / "best_personal.pt").exists()
    from prrfl.site.state import code_commit

    # what produced the numbers: the code's commit (this checkout's), the model they score, the selection rule
    assert results["code_commit"] == code_commit() and results["reported_model"] == "personal" and results["select_from_round"] == 0


def test_every_best_model_has_a_model_card_beside_it(tiny_task, tmp_path):
    site = make_runtime(tiny_task, tmp_path)
    upload = run_round(site, initial_download(tiny_task), 0)
    run_round(site, next_download(upload, 1), 1)
    card = json.loads((site.state_dir / "best_personal.json").read_text())
    best = site.best
    assert card["format"] == "prrfl-model-card/2" and card["model_file"] == "best_personal.pt"
    assert (card["task"], card["method"], card["role"], card["site"], card["cohort"]) == ("tiny", "prr", "personal", "A", "A")
    assert card["round"] == best["round"] and card["metrics"] == {"valid": best["valid"], "test": best["test"]}
    assert card["config"] == site.cfg.to_dict() and card["run_id"] == site.run_id
    assert card["class_names"] == ["a", "b", "c"] and card["preprocessing"] == tiny_task.preprocessing()
    model = site.method.build_model()
    model.load_state_dict(torch.load(site.state_dir / card["model_file"]))  # the card names a loadable model


def test_training_learns_the_tiny_task(tiny_task, tmp_path):
    site = make_runtime(tiny_task, tmp_path, local_epochs=12, lr=0.2)
    upload = run_round(site, initial_download(tiny_task), 0)
    assert site.evaluate("personal", "train")["f1"] > 80
    assert isinstance(upload.num_train, int)


def test_same_seed_same_numbers(tiny_task, tmp_path):
    a = make_runtime(tiny_task, tmp_path / "a")
    b = make_runtime(tiny_task, tmp_path / "b")
    ua, ub = run_round(a, initial_download(tiny_task), 0), run_round(b, initial_download(tiny_task), 0)
    assert all(torch.equal(ua.params[k], ub.params[k]) for k in ua.params)
    assert untimed(a.history) == untimed(b.history)
    timing = a.history[-1]["timing"]
    assert timing["train_images_per_second"] > 0
    assert list(timing["phases"]) == list(PHASES) and timing["phases"]["train"] == pytest.approx(timing["train_seconds"], abs=1e-4)
    assert timing["phases"]["before_epoch"] > 0 and timing["phases"]["epoch_test"] > 0  # DET's scoring, the test curve
    assert sum(timing["phases"].values()) <= timing["round_seconds"] + 1e-3  # the phases lie inside the round


def test_the_sites_evaluation_chunk_bounds_every_evaluation(tiny_task, tmp_path, monkeypatch):
    site = make_runtime(tiny_task, tmp_path)
    whole = site.evaluate(site.method.eval_role, "test")
    chunks: list[int] = []
    original = type(tiny_task).eval_batches

    def recorded(task, split, batch_size=None):
        for inputs, targets, index in original(task, split, batch_size):
            chunks.append(len(targets))
            yield inputs, targets, index

    monkeypatch.setattr(type(tiny_task), "eval_batches", recorded)
    site.eval_batch_size = 5
    assert site.evaluate(site.method.eval_role, "test") == pytest.approx(whole)  # the same numbers, in chunks of 5
    assert chunks == [5, 5, 2]  # the tiny test split holds 12 images


def test_hooks_see_the_site_through_one_narrow_view_per_round(tiny_task, tmp_path):
    site = make_runtime(tiny_task, tmp_path)
    seen = []
    before_epoch = site.method.before_epoch
    site.method.before_epoch = lambda view, epoch: (seen.append(view), before_epoch(view, epoch))
    run_round(site, initial_download(tiny_task), 0)
    view = seen[0]
    assert isinstance(view, SiteView) and len(seen) == site.cfg.local_epochs and all(v is view for v in seen)
    assert view.memory is site.memory and view.models is site.models and view.optimizers is site.optimizers
    assert view.num_train == site.data.num_train and view.class_counts == site.data.class_counts
    assert not any(hasattr(view, name) for name in ("history", "best", "save", "cfg", "method", "state_dir"))
    with pytest.raises(dataclasses.FrozenInstanceError):
        view.memory = {}


def shared_download(site, params: dict[str, torch.Tensor], round_idx: int, shift: float = 0.0) -> Download:
    """What the server sends a FedAvg-family site: the shared entries only, here shifted by `shift`."""
    keys = site.method.shared_keys(site.models["local"])
    return Download(params={k: params[k] + shift if params[k].is_floating_point() else params[k].clone() for k in keys}, round=round_idx)


def three_rounds(site, shifts=(0.0, 0.01)) -> list[Download]:
    """Rounds 0-2 of a global-model method at one site; returns the downloads of rounds 1 and 2."""
    upload = run_round(site, Download(params=site.models["local"].state_dict(), round=0), 0)
    sent = []
    for r, shift in zip((1, 2), shifts):
        sent.append(shared_download(site, upload.params, r, shift))
        upload = run_round(site, sent[-1], r)
    return sent


@pytest.mark.parametrize("method", ["fedavg", "fedbn", "silobn", "fedprox", "ida"])
def test_a_global_model_method_reports_its_download_selected_on_validation(tiny_task, tmp_path, method):
    site = make_runtime(tiny_task, tmp_path, method=method, eval_test_every_epoch=False)
    sent = three_rounds(site)
    downloads = [h for h in site.history if h["kind"] == "download"]
    assert [(h["round"], h["global_round"]) for h in downloads] == [(1, 0), (2, 1)]
    # the best is the download record with the highest validation F1 (the first on a tie), scored as its aggregate's round
    chosen = max(downloads, key=lambda h: (h["valid"]["f1"], -h["round"]))
    assert site.best == {"round": chosen["global_round"], "valid": chosen["valid"], "test": chosen["test"]}
    results = json.loads((site.state_dir / "results.json").read_text())
    assert results["reported_at"] == "download" and results["last"]["round"] == 2 and results["last"]["kind"] == "download"
    # the saved best model holds the download's shared entries exactly
    best = torch.load(site.state_dir / "best_local.pt")
    params = sent[chosen["round"] - 1].params
    assert all(torch.equal(best[k], params[k]) for k in params)


@pytest.mark.parametrize("method", ["fedavg", "fedbn"])
def test_the_last_rounds_global_model_is_scored_and_may_become_the_best(tiny_task, tmp_path, method):
    # 3 rounds: downloads 1 and 2 score the aggregates of rounds 0 and 1; the score after the last round that of round 2
    site = make_runtime(tiny_task, tmp_path, method=method, eval_test_every_epoch=False)
    upload = run_round(site, Download(params=site.models["local"].state_dict(), round=0), 0)
    for r in (1, 2):
        upload = run_round(site, shared_download(site, upload.params, r), r)
    trained = copy.deepcopy(site.models["local"].state_dict())
    last = shared_download(site, upload.params, 3)
    score_last_download(site, last, 3)
    downloads = [h for h in site.history if h["kind"] == "download"]
    assert [(h["round"], h["global_round"]) for h in downloads] == [(1, 0), (2, 1), (3, 2)]
    assert [h["kind"] for h in site.history].count("round") == 3  # no training
    # the site now holds the last aggregate (FedBN: with its own BatchNorm layers, as after any download)
    now = site.models["local"].state_dict()
    assert all(torch.equal(now[k], last.params[k]) for k in last.params)
    assert all(torch.equal(now[k], trained[k]) for k in set(now) - set(last.params))
    chosen = max(downloads, key=lambda h: (h["valid"]["f1"], -h["round"]))
    assert site.best == {"round": chosen["global_round"], "valid": chosen["valid"], "test": chosen["test"]}
    results = json.loads((site.state_dir / "results.json").read_text())
    assert results["last"]["round"] == 3 and results["last"]["global_round"] == 2 and results["rounds_completed"] == 3
    # asked again (a resumed server): nothing changes
    before = copy.deepcopy(site.history)
    score_last_download(site, shared_download(site, upload.params, 3, shift=0.5), 3)
    assert site.history == before


def test_a_personalized_method_has_no_global_model_to_score(tiny_task, tmp_path):
    site = make_runtime(tiny_task, tmp_path, method="fml", eval_test_every_epoch=False, num_rounds=1)
    upload = run_round(site, Download(params=site.method.build_model().state_dict(), round=0), 0)
    with pytest.raises(ValueError, match="no global model to score"):
        score_last_download(site, Download(params=upload.params, round=1), 1)


def test_silobns_reported_model_is_the_download_with_the_sites_own_batchnorm_statistics(tiny_task, tmp_path):
    site = make_runtime(tiny_task, tmp_path, method="silobn", eval_test_every_epoch=False, num_rounds=2)
    upload = run_round(site, Download(params=site.models["local"].state_dict(), round=0), 0)
    own = {k: v.clone() for k, v in site.models["local"].state_dict().items() if "running" in k}
    sent = shared_download(site, upload.params, 1, shift=0.5)
    assert own and not set(own) & set(sent.params)  # the statistics never travel
    run_round(site, sent, 1)
    best = torch.load(site.state_dir / "best_local.pt")
    assert site.best["round"] == 0
    assert all(torch.equal(best[k], v) for k, v in own.items())  # not averaged: the site's own
    assert all(torch.equal(best[k], v) for k, v in sent.params.items())  # the rest as received, affine BN included


def test_report_global_model_false_reports_the_model_after_the_local_epochs(tiny_task, tmp_path):
    site = make_runtime(tiny_task, tmp_path, method="fedavg", eval_test_every_epoch=False, report_global_model=False)
    three_rounds(site)
    assert not [h for h in site.history if h["kind"] == "download"]
    rounds = [h for h in site.history if h["kind"] == "round"]
    chosen = max(rounds, key=lambda h: (h["valid"]["f1"], -h["round"]))
    assert site.best == {"round": chosen["round"], "valid": chosen["valid"], "test": chosen["test"]}
    assert json.loads((site.state_dir / "results.json").read_text())["reported_at"] == "round"


@pytest.mark.parametrize("method", ["fml", "fca", "apfl", "pfedme", "perfedavg"])
def test_a_personalized_method_reports_its_model_after_the_local_epochs(tiny_task, tmp_path, method):
    site = make_runtime(tiny_task, tmp_path, method=method, eval_test_every_epoch=False, num_rounds=2)
    assert not site.method.reports_download()
    upload = run_round(site, Download(params=site.method.build_model().state_dict(), round=0), 0)
    run_round(site, Download(params=upload.params, round=1), 1)
    assert [h["kind"] for h in site.history] == ["round", "round"] and site.best is not None


def test_a_model_is_scored_again_only_once_its_weights_changed(tiny_task, tmp_path, monkeypatch):
    site = make_runtime(tiny_task, tmp_path)
    calls: list[str] = []
    original = type(tiny_task).evaluate

    def counted(task, model, split, batch_size=None):
        calls.append(next(r for r, m in site.models.items() if m is model))
        return original(task, model, split, batch_size)

    monkeypatch.setattr(type(tiny_task), "evaluate", counted)
    first = site.evaluate("personal", "valid")
    assert site.evaluate("personal", "valid") == first and calls == ["personal"]  # the same weights: not scored again
    site.evaluate("personal", "test")
    site.evaluate("deputy", "valid")
    assert calls == ["personal", "personal", "deputy"]  # another split, another model: scored
    with torch.no_grad():
        next(site.models["personal"].parameters()).add_(1.0)  # any in-place write (an optimizer step) bumps its version
    changed = site.evaluate("personal", "valid")
    assert calls[-1] == "personal" and len(calls) == 4 and changed != first
    site.models["personal"].load_state_dict(site.models["deputy"].state_dict())
    site.evaluate("personal", "valid")
    assert len(calls) == 5
    site.models["personal"].train()(torch.zeros(2, *site.data.train.images.shape[1:]))  # BatchNorm's running statistics
    site.evaluate("personal", "valid")
    assert len(calls) == 6


def test_rounds_that_reuse_scores_record_the_numbers_of_rounds_that_recompute_them(tiny_task, tmp_path, monkeypatch):
    """PRR's P is scored on test after its last epoch, at the round's end and at the next download, and on valid at the
    round's end and by DET before the next epoch, with the same weights: the site scores it once; its history is the
    history of a site that scores every time."""
    import prrfl.site.state as state

    def two_rounds(path):
        site = make_runtime(tiny_task, path)
        calls = []
        original = site.task.evaluate
        site.task = dataclasses.replace(site.task) if dataclasses.is_dataclass(site.task) else copy.copy(site.task)
        site.task.evaluate = lambda *a, **k: calls.append(1) or original(*a, **k)
        upload = run_round(site, initial_download(tiny_task), 0)
        run_round(site, next_download(upload, 1), 1)
        return untimed(site.history), len(calls)

    cached, cached_calls = two_rounds(tmp_path / "cached")
    counter = iter(range(10**9))
    monkeypatch.setattr(state, "weights_stamp", lambda model: (next(counter),))  # every stamp new: nothing reused
    recomputed, all_calls = two_rounds(tmp_path / "recomputed")
    assert cached == recomputed
    # 2 epochs a round. Round 0: DET 2 x (P, D) on valid, 2 epoch tests of P, the round's end P and D on valid and
    # test: 10, of which P's round-end test is its last epoch test: 9. Round 1: the download's test of P and D, then
    # the same 10: 12, of which P's download test and its valid at DET's first scoring are round 0's end and its
    # round-end test is again its last epoch test: 9. 18 of 22.
    assert (cached_calls, all_calls) == (18, 22)
