"""Cross-site evaluation through FLARE's CrossSiteEval (prrfl.flare.cross_site), in process: the sites'
submit_model and validate answers (prrfl.flare.site_app), the server's handling of a site without a model,
and FLARE's matrix in prrfl's crosseval.json layout. The simulator run is in test_e2e_simulator.py."""

from __future__ import annotations

import pytest
import torch
from conftest import tiny_derm_config
from nvflare.app_common.abstract.fl_model import FLModel

from prrfl.crosseval import cross_site_eval_result, summary_line
from prrfl.flare import task_protocol as P
from prrfl.flare.cross_site import CARD, CrossSiteEvaluation, sites_to_evaluate
from prrfl.flare.site_app import build_runtime, submit_best_model, validate_model
from prrfl.flare.site_config import SiteConfig


@pytest.fixture(scope="module")
def trained_site(tmp_path_factory):
    """site-1 of a tiny derm_prr run with a best model (its round-0 model), and its reported test metrics."""
    workspace = tmp_path_factory.mktemp("site-1")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PRRFL_CACHE", str(tmp_path_factory.getbasetemp() / "prrfl_cache"))
        mp.chdir(workspace)
        meta = {P.CONFIG: tiny_derm_config().to_dict(), P.RUN_ID: "run-1", P.NUM_SITES: 1}
        runtime = build_runtime("site-1", meta, SiteConfig(num_threads=1), None)
        role = runtime.method.eval_role
        with torch.no_grad():  # not the initial model
            for p in runtime.models[role].parameters():
                p.add_(0.1 * torch.randn_like(p))
        test = runtime.evaluate(role, "test")
        runtime.save_best(role, 0, runtime.evaluate(role, "valid"), test)
    return runtime, test


def test_a_site_submits_its_best_model_with_its_card_and_a_site_scores_it_on_its_own_test_split(trained_site):
    runtime, reported = trained_site
    submitted = submit_best_model("site-1", runtime.state_dir)
    card = submitted.meta[CARD]
    assert (card["site"], card["cohort"], card["run_id"], card["round"], card["method"]) == ("site-1", "A", "run-1", 0, "prr")
    assert len(card["weights_sha256"]) == 64
    model = runtime.models[runtime.method.eval_role]
    assert submitted.params.keys() == model.state_dict().keys()
    assert all(torch.equal(submitted.params[k], v) for k, v in model.state_dict().items())

    received = FLModel(params=submitted.params, meta={**submitted.meta, "model_owner": "site-1"})  # as CrossSiteEval sends it
    own = validate_model("site-1", received, SiteConfig())
    assert own.metrics == reported  # the model the site reported, on the split it reported it on: the same numbers
    assert own.meta == {"cohort": "A", "test_samples": len(runtime.data.test)}
    other = validate_model("site-2", received, SiteConfig())  # site-2's own split: cohort B
    b_test = runtime.task.load_site("B", torch.device("cpu"), None).test
    assert other.meta["cohort"] == "B" and other.metrics == runtime.task.evaluate(model, b_test)


def test_a_site_without_a_best_model_says_so_and_a_model_without_its_card_or_of_another_network_is_refused(trained_site, tmp_path):
    runtime, _ = trained_site
    with pytest.raises(FileNotFoundError, match=rf"site site-2 has no best model to submit: no best_<role>.pt in {tmp_path}"):
        submit_best_model("site-2", tmp_path)
    submitted = submit_best_model("site-1", runtime.state_dir)
    with pytest.raises(ValueError, match="came without its model card"):
        validate_model("site-2", FLModel(params=submitted.params, meta={}), SiteConfig())
    fewer = dict(list(submitted.params.items())[:-1])
    with pytest.raises(ValueError, match=r"the model of site-1 does not fit the derm/prr network of its card: .*Missing key"):
        validate_model("site-2", FLModel(params=fewer, meta=submitted.meta), SiteConfig())


def server_results() -> dict:
    participation = {"rounds": 2, "missed": [], "stale": False}
    return {
        "run_id": "run-1",
        "config": tiny_derm_config().to_dict(),
        "sites": {
            "site-1": {"cohort": "A", "participation": {**participation, "aggregated": [0, 1]}},
            "site-2": {"cohort": "B", "participation": {**participation, "aggregated": [0, 1]}},
            "site-3": {"cohort": "C", "participation": {**participation, "aggregated": [0], "missed": [1]}},
        },
    }


def test_only_the_sites_that_completed_the_last_round_are_asked():
    assert sites_to_evaluate(server_results()) == ["site-1", "site-2"]  # site-3 may be gone


def test_a_site_without_a_model_is_reported_and_its_answer_not_sent_round(monkeypatch):
    cse = CrossSiteEvaluation()
    cse.results = server_results()
    sent = []
    monkeypatch.setattr(CrossSiteEvaluation.__mro__[1], "_receive_local_model_cb", lambda self, model: sent.append(model))
    cse._receive_local_model_cb(FLModel(params={}, meta={"client_name": "site-2", P.ERROR: "FileNotFoundError: no best model"}))
    stale = {"run_id": "run-0", "cohort": "A", "round": 4}
    cse._receive_local_model_cb(FLModel(params={"w": torch.zeros(1)}, meta={"client_name": "site-1", CARD: stale}))
    assert sent == [] and cse.models == {}
    assert cse.errors == {
        "site-2": "FileNotFoundError: no best model",
        "site-1": "its best model is of run run-0, not of this run run-1",
    }
    card = {"run_id": "run-1", "cohort": "A", "round": 1, "role": "personal", "weights_sha256": "ab"}
    cse._receive_local_model_cb(FLModel(params={"w": torch.zeros(1)}, meta={"client_name": "site-1", CARD: card}))
    assert len(sent) == 1 and cse.models == {"site-1": {"cohort": "A", "round": 1, "role": "personal", "weights_sha256": "ab"}}

    cse.track_results("site-1", "site-2", FLModel(params={}, meta={P.ERROR: "FileNotFoundError: no data"}))
    cse.track_results("site-1", "site-1", FLModel(metrics={"bacc": 50.0, "auc": 60.0}))
    assert cse.errors["site-1 on site-2"] == "FileNotFoundError: no data"
    assert cse._json_val_results == {"site-1": {"site-1": {"bacc": 50.0, "auc": 60.0}}}  # FLARE's: data site -> model site


def test_flares_matrix_in_the_crosseval_layout():
    values = {("site-1", "site-1"): 80.0, ("site-1", "site-2"): 40.0, ("site-2", "site-1"): 30.0, ("site-2", "site-2"): 70.0}
    matrix = {
        d: {m: {"bacc": values[(m, d)], "auc": values[(m, d)] + 1, "f1": 0.0} for m in ("site-1", "site-2")} for d in ("site-1", "site-2")
    }
    result = cross_site_eval_result(server_results(), matrix, errors={"site-3": "not asked"})
    assert result["cross_site"]["site-1"]["site-2"]["bacc"] == 40.0  # rows: the model's site, as prrfl crosseval
    assert result["specialization"]["per_site"] == {"site-1": {"bacc": 80.0, "auc": 81.0}, "site-2": {"bacc": 70.0, "auc": 71.0}}
    assert result["specialization"]["values"] == {"bacc": 75.0, "auc": 76.0}
    assert result["generalization"] is None and result["metrics"] == ["bacc", "auc"]
    assert result["cohorts"] == {"site-1": "A", "site-2": "B", "site-3": "C"} and result["errors"] == {"site-3": "not asked"}
    assert (result["run_id"], result["run_name"], result["method"], result["seed"]) == ("run-1", "derm_prr", "prr", 0)
    assert summary_line(result) == "specialization bacc 75.0 auc 76.0 (no generalization: the test splits are not pooled)"


def test_the_protocol_table_shows_a_deployment_run_without_generalization():
    from prrfl.report import protocol_table

    matrix = {d: {m: {"bacc": 60.0, "auc": 70.0} for m in ("site-1", "site-2")} for d in ("site-1", "site-2")}
    table = protocol_table([cross_site_eval_result(server_results(), matrix)], ["prr"], ("bacc", "auc")).splitlines()
    assert table[2] == "| prr | 1 | not evaluated (FLARE's cross-site evaluation: no pooled test split) | – | – | 60.00 | 70.00 |"


def test_the_site_script_takes_the_run_name_and_leaves_the_site_settings_arguments():
    from prrfl.flare.site_app import job_arguments

    assert job_arguments(["--run-name", "derm_prr", "--data-root", "/data"]) == ("derm_prr", ["--data-root", "/data"])
    assert job_arguments([]) == (None, [])  # a job exported before cross-site evaluation: submit_model says so
