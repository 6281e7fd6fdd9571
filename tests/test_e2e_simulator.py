"""derm_prr end to end in the FLARE simulator: 2 sites, 2 rounds, tiny synthetic images."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from conftest import SimulatorRun, session_cache, tiny_derm_config
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from prrfl.config import RunConfig
from prrfl.flare.job_recipe import export_job

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def finished_run(tiny_derm_run):
    return tiny_derm_run


def test_sites_and_server_write_results(finished_run):
    ws, proc = finished_run
    server = json.loads((ws / "server/simulate_job/results.json").read_text())
    assert sorted(server["sites"]) == ["site-1", "site-2"]
    for site in ("site-1", "site-2"):
        results = json.loads((ws / site / "prrfl/derm_prr/results.json").read_text())
        assert results["rounds_completed"] == 2 and results["cohort"] == {"site-1": "A", "site-2": "B"}[site]
        assert 0 <= results["best"]["test"]["f1"] <= 100
        assert 0 <= results["ood"]["f1"] <= 100  # best model on the out-of-distribution cohort
        assert server["sites"][site]["best"] == results["best"]
        assert (ws.with_name("ws.state") / site / "derm_prr/site_state.pt").exists()
    assert "| **mean** |" in proc.stdout + proc.stderr  # the job prints the per-site table


def test_the_start_race_guard_is_in_place_before_any_site_starts(finished_run):
    ws, _ = finished_run
    log = (ws / "server/log.txt").read_text()
    guard, start = log.find("each site's process is sent its own name"), log.find("Start the clients run simulation")
    assert 0 <= guard < start, "prrfl.flare.sim_race.install() must patch FLARE's client runner before the simulator creates it"


def test_prrfl_results_prints_the_runs_table_from_the_workspace(finished_run, capsys):
    from test_results_layouts import printed_tables

    ws, _ = finished_run
    server = ws / "server/simulate_job/results.json"
    ((title, table),) = printed_tables(ws, capsys).items()
    assert title == f"derm_prr (run {json.loads(server.read_text())['run_id']}, task derm): {server}"
    per_site, matrix = table.split("\n\nCross-site evaluation: each site's best model (rows) on each site's test split\n\n")
    assert per_site == (ws / "server/simulate_job/results.md").read_text().strip()  # the table the job wrote
    # FLARE's cross-site matrix (crosseval.json beside results.json), each site by its label
    assert matrix.splitlines()[0] == "| prr: F1 on → | site-1_A | site-2_B |"


def test_one_label_names_a_site_in_the_results_table_tensorboard_the_cross_site_matrix_and_the_report(finished_run, capsys, tmp_path):
    """The name the FLARE console gives a site (site-1) and its cohort (A), as one label: the row of the table the
    job printed, its TensorBoard run, its row and column in `prrfl crosseval`'s matrix and in the report's tables."""
    from prrfl.cli import main
    from prrfl.report import build_report

    ws, proc = finished_run
    labels = [f"{s}_{json.loads((ws / s / 'prrfl/derm_prr/results.json').read_text())['cohort']}" for s in ("site-1", "site-2")]
    assert labels == ["site-1_A", "site-2_B"]
    for label in labels:
        assert f"| {label} | " in proc.stdout + proc.stderr  # the results table the job printed
        assert (ws / "server/simulate_job/tb_events" / label).is_dir()
    assert main(["crosseval", str(ws)]) == 0
    matrix = capsys.readouterr().out.split("\n\n")[1].splitlines()
    assert matrix[0] == f"| prr: F1 on → | {labels[0]} | {labels[1]} |"
    assert [row.split("'s personal |")[0] for row in matrix[2:]] == [f"| {label}" for label in labels]
    report = build_report([ws], tmp_path / "report").read_text()
    assert f"| method | seeds | {labels[0]} F1 | {labels[0]} AUC | {labels[1]} F1 |" in report  # Table II
    assert f"| prr: F1 on → | {labels[0]} | {labels[1]} |" in report and f"{labels[0]}, {labels[1]} |" in report  # matrix, runs


def test_prr_has_no_global_model_so_each_sites_model_scores_generalization(finished_run):
    from prrfl.crosseval import write_crosseval

    ws, _ = finished_run
    assert json.loads((ws / "server/simulate_job/results.json").read_text())["global_model"] is None
    [path] = write_crosseval(ws)
    result = json.loads(path.read_text())
    gen = result["generalization"]
    assert gen["model"] == "sites" and set(gen["per_site"]) == {"site-1", "site-2"}
    assert gen["values"]["bacc"] == pytest.approx((gen["per_site"]["site-1"]["bacc"] + gen["per_site"]["site-2"]["bacc"]) / 2)
    for site in ("site-1", "site-2"):
        reported = json.loads((ws / site / "prrfl/derm_prr/results.json").read_text())["best"]["test"]
        assert result["cross_site"][site][site] == reported  # the reported model, re-evaluated: the same numbers
        assert result["specialization"]["per_site"][site] == {"bacc": reported["bacc"], "auc": reported["auc"]}
    # the deputy D, each site's after the last round (its checkpoint), scored both ways: its own test split gives
    # what the site recorded for D in its last round
    assert result["reported_model"] == "personal" and list(result["other_models"]) == ["deputy"]
    deputy = result["other_models"]["deputy"]
    for site in ("site-1", "site-2"):
        last = json.loads((ws / site / "prrfl/derm_prr/results.json").read_text())["last"]["other_models"]["deputy"]["test"]
        assert deputy["specialization"]["per_site"][site] == {"bacc": last["bacc"], "auc": last["auc"]}
    assert set(deputy["generalization"]["per_site"]) == {"site-1", "site-2"}


def test_flares_cross_site_evaluation_scores_every_best_model_on_every_sites_test_split(finished_run):
    """After training, FLARE's CrossSiteEval (prrfl.flare.cross_site): each site's best model travels to every
    site and is scored there; the diagonal is what each site reported for its best model, value for value (the
    same weights on the same split in the same process), and the whole matrix is the one `prrfl crosseval`
    computes with every site's files on one disk."""
    from prrfl.crosseval import write_crosseval

    ws, proc = finished_run
    run = ws / "server/simulate_job"
    flare_matrix = json.loads((run / "cross_site_val/cross_val_results.json").read_text())  # data site -> model site
    assert {d: sorted(m) for d, m in flare_matrix.items()} == {"site-1": ["site-1", "site-2"], "site-2": ["site-1", "site-2"]}
    result = json.loads((run / "crosseval.json").read_text())
    assert result["errors"] == {} and result["generalization"] is None and result["cohorts"] == {"site-1": "A", "site-2": "B"}
    for site in ("site-1", "site-2"):
        reported = json.loads((ws / site / "prrfl/derm_prr/results.json").read_text())
        assert result["cross_site"][site][site] == reported["best"]["test"]
        assert result["models"][site]["round"] == reported["best"]["round"]
        card = json.loads((ws.with_name("ws.state") / site / "derm_prr/best_personal.json").read_text())
        assert result["models"][site]["weights_sha256"] == card["weights_sha256"]
    [offline] = write_crosseval(ws)
    assert result["cross_site"] == json.loads(offline.read_text())["cross_site"]
    assert "cross-site evaluation: specialization bacc" in proc.stdout + proc.stderr


def test_a_saved_best_model_is_evaluated_from_its_card_without_the_federation(finished_run, tmp_path, capsys):
    from prrfl.cli import main
    from prrfl.inference import evaluate_saved_model
    from prrfl.registry import build_task

    ws, _ = finished_run
    best = ws.with_name("ws.state") / "site-1/derm_prr/best_personal.pt"
    reported = json.loads((ws / "site-1/prrfl/derm_prr/results.json").read_text())["best"]["test"]
    card = json.loads(best.with_suffix(".json").read_text())
    data_root = build_task(RunConfig.from_dict(card["config"])).prepared_root(None)  # the run's synthetic data
    result = evaluate_saved_model(best, data_root)
    assert result["cohort"] == "A" and result["metrics"] == reported  # the same model on the same split
    assert evaluate_saved_model(best, data_root, cohort="B")["cohort"] == "B"  # another site's test split
    assert main(["evaluate", "--model", str(best), "--data-root", str(data_root), "--split", "valid"]) == 0
    assert "on A valid" in capsys.readouterr().out

    copy = tmp_path / "best_personal.pt"
    shutil.copy(best, copy)
    with pytest.raises(FileNotFoundError, match="best_personal.json: the model card of best_personal.pt is missing"):
        evaluate_saved_model(copy, data_root)
    card["config"]["data"]["image_size"] = 48
    copy.with_suffix(".json").write_text(json.dumps(card))
    with pytest.raises(ValueError, match=r"best_personal.json: config changed since the card was written"):
        evaluate_saved_model(copy, data_root)  # the card binds its own content
    del card[
        "content_sha256"
    ]  # a card of format 1 of an older prrfl: read only when accepted, what its fields say is checked against the data and network
    card["format"] = "prrfl-model-card/1"
    copy.with_suffix(".json").write_text(json.dumps(card))
    with pytest.raises(ValueError, match=r"A/train.npz holds 32 px images but the job asks for image_size=48"):
        evaluate_saved_model(copy, data_root, accept_unverified_card=True)
    card["config"]["data"]["image_size"] = 32
    card["config"]["method"], card["config"]["run_name"], card["config"]["method_args"] = "fca", "derm_fca", {}
    copy.with_suffix(".json").write_text(json.dumps(card))
    with pytest.raises(ValueError, match=r"best_personal.json: task/method derm/prr but its config says derm/fca"):
        evaluate_saved_model(copy, data_root, accept_unverified_card=True)
    card["method"] = "fca"
    copy.with_suffix(".json").write_text(json.dumps(card))
    with pytest.raises(ValueError, match=r"best_personal.pt: the weights do not fit the derm/fca network its card describes"):
        evaluate_saved_model(copy, data_root, accept_unverified_card=True)


def test_predict_on_the_raw_jpegs_reproduces_the_reported_test_metrics(finished_run, tmp_path):
    """The trained model of site-1 on the raw JPEGs the run's federation was prepared from (the simulator's
    cache): its predicted classes for A's test images give the test metrics the site reported for it, and its
    probabilities are the model's softmax to the CSV's 4 decimals."""
    import csv

    import numpy as np

    from prrfl.data.augment import normalize
    from prrfl.inference import load_saved_model
    from prrfl.metrics import classification_metrics
    from prrfl.predict import predict

    ws, _ = finished_run
    best = ws.with_name("ws.state") / "site-1/derm_prr/best_personal.pt"
    from prrfl.registry import build_task

    federation = build_task(tiny_derm_config()).prepared_root(None).parent  # the run's, in the session's cache
    predict(best, federation / "raw/HAM10000_images", tmp_path / "pred.csv")
    with open(tmp_path / "pred.csv", newline="") as f:
        rows = {Path(r["file"]).stem: r for r in csv.DictReader(f)}
    with np.load(federation / "prepared/A/test.npz") as z:
        ids, labels, images = list(z["image_ids"]), z["labels"], torch.from_numpy(z["images"])
    names = ["nv", "bkl", "mel"]
    decided = np.eye(3)[[names.index(rows[i]["predicted"]) for i in ids]]  # the argmax before rounding
    reported = json.loads(best.with_suffix(".json").read_text())["metrics"]["test"]
    metrics = classification_metrics(decided, labels, 3)
    assert {k: metrics[k] for k in ("f1", "acc", "bacc")} == {k: reported[k] for k in ("f1", "acc", "bacc")}
    # the ranks the reported AUC was computed from are those of the softmax before rounding: a model this little
    # trained gives nearly the same probabilities to every image, which 4 decimals do not tell apart
    probs = np.array([[float(rows[i][f"p_{c}"]) for c in names] for i in ids])
    with torch.no_grad():
        expected = torch.softmax(load_saved_model(best).model(normalize(images))[0], dim=1).numpy()
    np.testing.assert_allclose(probs, expected, atol=1e-4)  # 5e-5 of rounding, float32 sums in another batch order


def test_each_site_gets_its_own_pfa_download(finished_run):
    ws, _ = finished_run
    state = torch.load(ws.with_name("ws.state") / "server/derm_prr/server_state.pt", weights_only=False)
    assert state["next_round"] == 2
    one, two = state["downloads"]["site-1"].params, state["downloads"]["site-2"].params
    assert set(one) == set(two) and not any("bn" in k for k in one)  # BN stays at the sites
    assert any(not torch.equal(one[k], two[k]) for k in one)  # personalised: not one global model
    assert state["downloads"]["site-1"].meta["pfa_r"] == pytest.approx(0.48)  # last round of 2


def scalars_of(run: Path) -> dict[str, dict[int, float]]:
    """A TensorBoard run folder's scalars: tag -> step -> value."""
    acc = EventAccumulator(str(run))
    acc.Reload()
    return {tag: {e.step: e.value for e in acc.Scalars(tag)} for tag in acc.Tags()["scalars"]}


def test_tensorboard_runs_are_named_by_cohort_and_the_server_writes_the_federation_run(finished_run):
    ws, _ = finished_run
    tb = ws / "server/simulate_job/tb_events"
    results = {s: json.loads((ws / s / "prrfl/derm_prr/results.json").read_text()) for s in ("site-1", "site-2")}
    runs = {s: tb / f"{s}_{results[s]['cohort']}" for s in results}
    assert sorted(p.name for p in tb.iterdir()) == sorted([*(r.name for r in runs.values()), "federation"])
    sites = {s: scalars_of(run) for s, run in runs.items()}
    for s, tags in sites.items():
        for expected in (
            "loss/personal",
            "loss/deputy",
            "det/recover",
            "det/exchange",
            "det/sublimate",
            "valid/f1",
            "test/auc",
            "cpa/gamma_mel",
            "retrogress/f1_drop",
            "retrogress/shared_f1_drop",  # D's, beside P's
        ):
            assert expected in tags, (s, expected, sorted(tags))
        assert "pfa/r" not in tags  # logged once, by the server
    fed = scalars_of(tb / "federation")
    # 2 rounds x 1 local epoch (x axis: epochs): round r's results and the use of its download at epoch r
    assert fed["federation/sites_aggregated"] == {0: 2.0, 1: 2.0}
    assert fed["pfa/r"] == {0: pytest.approx(0.35), 1: pytest.approx(0.48)}  # r0 -> r1 over the 2 rounds
    for tag in ("valid/f1", "test/f1", "test/auc"):
        for step in (0, 1):
            mean = sum(sites[s][tag][step] for s in sites) / len(sites)
            assert fed[tag][step] == pytest.approx(mean, abs=1e-4), (tag, step)
    drop = sum(sites[s]["retrogress/f1_drop"][1] for s in sites) / len(sites)
    assert fed["retrogress/f1_drop"] == {1: pytest.approx(drop, abs=1e-4)}


BAD_SITE_SCRIPT = '''"""A site whose first upload holds a NaN weight and that fails in its second round."""
import math

from prrfl.flare import task_protocol as P
from prrfl.flare.site_app import main

honest, sent = P.upload_to_model, []


def malformed(*args):
    sent.append(len(sent))
    if len(sent) == 2:
        raise RuntimeError("a site failure in round 1")
    model = honest(*args)
    key = sorted(model.params)[0]
    model.params[key] = model.params[key].clone().fill_(math.nan)
    return model


P.upload_to_model = malformed

if __name__ == "__main__":
    main()
'''


def with_bad_site(job: Path, script: str, site: str = "site-2", sites: int = 2) -> Path:
    """`site` runs a copy of the client app whose script corrupts what it sends; the other sites run the job's app."""
    shutil.copytree(job / "app", job / "app_bad")
    (job / "app_bad/custom/prrfl_site.py").write_text(script)
    meta = json.loads((job / "meta.json").read_text())
    honest = [f"site-{i}" for i in range(1, sites + 1) if f"site-{i}" != site]
    meta["deploy_map"] = {"app": ["server", *honest], "app_bad": [site]}
    (job / "meta.json").write_text(json.dumps(meta))
    return job


MLFLOW_CASES = {"sqlite": ("sqlite", None), "file-and-privacy-filter": ("file", "percentile")}


@pytest.fixture(scope="module")
def own_runs(tmp_path_factory):
    """The module's FLARE runs of their own (beside the shared tiny_derm_run), started together: each test reads its
    own. name -> (its folder, its SimulatorRun)."""
    cache, runs = session_cache(tmp_path_factory), {}
    root = tmp_path_factory.mktemp("bad_site")
    job = with_bad_site(export_job("derm_prr", root / "jobs", cfg=tiny_derm_config(min_sites=1)), BAD_SITE_SCRIPT)
    runs["bad_site"] = (root, SimulatorRun(job, root / "ws", 2, cache))
    for name, (store, privacy) in MLFLOW_CASES.items():
        root = tmp_path_factory.mktemp(f"mlflow_{store}")
        uri = (root / "mlruns").as_uri() if store == "file" else None
        cfg = tiny_derm_config(method_args={"det_enabled": True})
        job = export_job("derm_prr", root / "jobs", cfg=cfg, tracking="mlflow", tracking_uri=uri, privacy=privacy)
        env = {"MLFLOW_ALLOW_FILE_STORE": "true"} if store == "file" else None  # MLflow 3 keeps the file store behind this switch
        runs[name] = (root, SimulatorRun(job, root / "ws", 2, cache, env))
    yield runs
    for _, run in runs.values():
        run.stop()


def test_a_nan_upload_and_a_site_failure_travel_through_flare_and_leave_the_site_out(own_runs):
    """Through FLARE's messages: a NaN weight arrives as NaN and is refused, a site's exception arrives as its
    error; the other site is aggregated every round. (Every rejection rule: tests/test_federation.py.)"""
    tmp_path, run = own_runs["bad_site"]
    proc = run.result()
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    assert "round 0: rejected the upload of site-2: parameter " in out and " holds NaN or Inf" in out
    assert "round 1: site-2 failed: RuntimeError: a site failure in round 1; it keeps its previous download" in out
    state = torch.load(tmp_path / "ws.state/server/derm_prr/server_state.pt", weights_only=False)
    assert [h["sites"] for h in state["history"]] == [["site-1"]] * 2  # aggregated without it, never crashed
    assert [h["rejected"] for h in state["history"]][0].keys() == {"site-2"}
    for site, download in state["downloads"].items():
        assert all(torch.isfinite(v).all() for v in download.params.values() if v.is_floating_point()), site
    server = json.loads((tmp_path / "ws/server/simulate_job/results.json").read_text())
    assert server["sites"]["site-2"]["participation"] == {"rounds": 2, "aggregated": [], "missed": [0, 1], "stale": True}
    assert "best" not in server["sites"]["site-2"]  # no upload of it was used: no numbers, only the mark
    assert server["sites"]["site-1"]["participation"]["aggregated"] == [0, 1]
    assert "cross-site evaluation without ['site-2']: they did not complete the run's last round" in out
    crosseval = json.loads((tmp_path / "ws/server/simulate_job/crosseval.json").read_text())
    assert list(crosseval["cross_site"]) == ["site-1"] and list(crosseval["cross_site"]["site-1"]) == ["site-1"]


def assert_uploads_were_filtered(tmp_path, out: str) -> None:
    """FLARE's PercentilePrivacy ran on every upload of both sites (it logs on the site), and the server aggregated
    the filtered uploads of both, every round."""
    for site in ("site-1", "site-2"):
        site_log = (tmp_path / "ws" / site / "log.txt").read_text(errors="replace")
        assert site_log.count("PercentilePrivacy - INFO") == 2, f"the filter did not run on every upload of {site}"
    assert "rejected the upload" not in out
    state = torch.load(tmp_path / "ws.state/server/derm_prr/server_state.pt", weights_only=False)
    assert [h["sites"] for h in state["history"]] == [["site-1", "site-2"]] * 2


# the file store's run also carries FLARE's privacy filter (one FLARE run for two features that do not interact:
# the filter changes the uploads' values, the tracking logs whatever the sites measured)
@pytest.mark.parametrize("case", list(MLFLOW_CASES))
def test_mlflow_tracking_through_flares_receiver(own_runs, monkeypatch, case):
    """tracking="mlflow": the sites' runs named by cohort and the federation run, each with the run's config as
    params, in a local MLflow store: by default an SQLite file beside the workspace, out of what the next simulator
    run wipes; or a file store given as tracking_uri. privacy="percentile": the job trains on filtered uploads."""
    from mlflow import MlflowClient

    from prrfl.flare.mlflow_tracking import method_arguments, mlflow_params
    from prrfl.registry import build_task

    store, privacy = MLFLOW_CASES[case]
    tmp_path, run = own_runs[case]
    uri = None
    if store == "file":
        uri = (tmp_path / "mlruns").as_uri()
        monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # the client reads the file store behind this switch too
    cfg = tiny_derm_config(method_args={"det_enabled": True})
    proc = run.result()
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    if privacy:
        assert_uploads_were_filtered(tmp_path, out)
    if uri is None:
        assert [p.relative_to(tmp_path) for p in tmp_path.rglob("mlflow.db")] == [Path("ws.state/server/mlflow.db")]
        uri = f"sqlite:///{tmp_path / 'ws.state/server/mlflow.db'}"
    assert f"MLflow store {uri}: experiment 'derm_prr', runs ['federation', 'site-1', 'site-2'] with " in out  # the server log says where
    client = MlflowClient(tracking_uri=uri)
    experiment = client.get_experiment_by_name("derm_prr")
    cohorts = {s: json.loads((tmp_path / "ws" / s / "prrfl/derm_prr/results.json").read_text())["cohort"] for s in ("site-1", "site-2")}
    found = client.search_runs([experiment.experiment_id])
    runs = {r.info.run_name: r for r in found}
    assert sorted(runs) == ["federation", *(f"{s}_{c}" for s, c in cohorts.items())]
    table = (tmp_path / "ws/server/simulate_job/results.md").read_text()
    assert all(f"| {name} | " in table for name in runs if name != "federation")  # the results table's site labels
    # the data settings the task uses, the options the method runs with
    params = mlflow_params({**cfg.to_dict(), "method_args": method_arguments(cfg), "data": build_task(cfg).data_cfg})
    assert params["method_args.det_enabled"] == "true" and params["data.synthetic_raw_size"] == "[96, 72]"
    assert "data.heldout_min_per_class" in params  # a default the job does not set is logged too
    run_id = json.loads((tmp_path / "ws/server/simulate_job/results.json").read_text())["run_id"]
    for name, run in runs.items():
        assert run.data.tags["mlflow.runName"] == run.data.tags["run_name"] == name  # one name, whatever shows it
        assert run.data.params == params  # the whole config, on every run
        assert run.data.tags["job_id"] == run_id  # the run's id: FLARE's is "simulate_job" for every simulator job
    for s in cohorts:
        assert runs[f"{s}_{cohorts[s]}"].data.tags["prrfl_run_id"] == run_id
    for s, c in cohorts.items():
        run = runs[f"{s}_{c}"]
        assert run.data.tags["cohort"] == c
        assert [m.step for m in client.get_metric_history(run.info.run_id, "test/f1")] == [0, 1]
    fed = runs["federation"].info.run_id
    assert [(m.step, m.value) for m in client.get_metric_history(fed, "federation/sites_aggregated")] == [(0, 2.0), (1, 2.0)]
    site_f1 = [client.get_metric_history(runs[f"{s}_{c}"].info.run_id, "test/f1")[-1].value for s, c in cohorts.items()]
    assert client.get_metric_history(fed, "test/f1")[-1].value == pytest.approx(sum(site_f1) / 2, abs=1e-4)
