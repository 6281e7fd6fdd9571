"""FCA's generalization/specialization protocol (prrfl.crosseval): pooled splits, which model scores
generalization, and the whole path on FCA and HarmoFL runs in the simulator."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from conftest import SimulatorRun, session_cache, tiny_derm_config
from sklearn.metrics import balanced_accuracy_score
from test_e2e_simulator import scalars_of

from prrfl.config import RunConfig
from prrfl.crosseval import find_runs, write_crosseval
from prrfl.messages import Download
from prrfl.registry import build_method, build_task
from prrfl.report import protocol_table
from prrfl.tasks.contract import Split


def method_on(task, method: str, **args):
    return build_method(RunConfig.from_dict({"task": task.name, "method": method, "method_args": args}), task)


# ----- pooling ----------------------------------------------------------------------------------------------
def test_pooled_split_keeps_each_sites_volumes_apart():
    a = Split(torch.zeros(3, 1, 2, 2), torch.zeros(3, 2, 2, dtype=torch.long), torch.tensor([0, 0, 1]))
    b = Split(torch.ones(3, 1, 2, 2), torch.ones(3, 2, 2, dtype=torch.long), torch.tensor([0, 1, 1]))
    pooled = Split.pooled([a, b])
    assert pooled.groups.tolist() == [0, 0, 1, 2, 3, 3]
    assert pooled.images[:3].sum() == 0 and pooled.images[3:].min() == 1 and len(pooled) == 6
    plain = Split.pooled([Split(torch.zeros(2, 1), torch.zeros(2)), Split(torch.zeros(1, 1), torch.zeros(1))])
    assert plain.groups is None and len(plain) == 3
    with pytest.raises(ValueError, match="empty"):
        Split.pooled([])


def test_pooled_dice_is_the_volume_weighted_mean_of_the_sites(tiny_seg_task):
    torch.manual_seed(0)
    model = tiny_seg_task.build_model().eval()
    a, b = (tiny_seg_task.load_site(c, torch.device("cpu")).test for c in "AB")
    b = Split(b.images[:6], b.targets[:6], b.groups[:6])  # 2 volumes here, 3 at A
    dice_a, dice_b = (tiny_seg_task.evaluate(model, s)["dice"] for s in (a, b))
    pooled = tiny_seg_task.evaluate(model, Split.pooled([a, b]))["dice"]
    assert pooled == pytest.approx((3 * dice_a + 2 * dice_b) / 5, abs=1e-4)


def test_pooled_bacc_is_sklearns_on_the_concatenated_predictions(tiny_task):
    torch.manual_seed(0)
    model = tiny_task.build_model().eval()
    splits = [tiny_task.load_site(c, torch.device("cpu")).test for c in "AB"]
    preds, labels = [], []
    with torch.no_grad():
        for s in splits:
            inputs, targets = tiny_task.eval_transform(s.images, s.targets)
            preds.append(model(inputs)[0].argmax(1))
            labels.append(targets)
    expected = 100 * balanced_accuracy_score(torch.cat(labels), torch.cat(preds))
    assert tiny_task.evaluate(model, Split.pooled(splits))["bacc"] == pytest.approx(expected)


# ----- which model scores generalization --------------------------------------------------------------------
def test_fedavg_family_has_a_global_model_and_local_layer_methods_do_not(tiny_task):
    fedavg = method_on(tiny_task, "fedavg")
    whole = fedavg.build_model().state_dict()
    downloads = {"A": Download(params=whole), "B": Download(params=whole)}
    assert fedavg.global_params(downloads).keys() == whole.keys()
    assert method_on(tiny_task, "fedprox").global_params(downloads) is not None
    without_bn = {k: v for k, v in whole.items() if not k.startswith("bn.")}
    assert method_on(tiny_task, "fedbn").global_params({"A": Download(params=without_bn)}) is None
    assert method_on(tiny_task, "prr").global_params(downloads) is None  # one PFA model per site
    assert method_on(tiny_task, "fedproto").global_params(downloads) is None


def test_fcas_global_model_is_the_extractor_with_the_federated_head(tiny_task):
    fca = method_on(tiny_task, "fca")
    torch.manual_seed(0)
    two_heads = fca.build_model()
    upload = {k: v for k, v in two_heads.state_dict().items() if k in fca.shared_keys(two_heads)}
    assert not any(k.startswith("personal_head.") for k in upload)
    params = fca.global_params({"A": Download(params=upload)})
    global_model = fca.build_global_model()
    global_model.load_state_dict(params)  # strict: every entry of the task's network, no other
    x = torch.randn(4, 3, 8, 8)
    two_heads.eval(), global_model.eval()
    logits, embedding = two_heads(x)
    assert torch.allclose(global_model(x)[0], two_heads.federated(embedding))
    assert not torch.allclose(global_model(x)[0], logits)  # not the personalized head
    local_bn = method_on(tiny_task, "fca", bn_statistics="local")
    shared = {k: v for k, v in two_heads.state_dict().items() if k in local_bn.shared_keys(two_heads)}
    assert local_bn.global_params({"A": Download(params=shared)}) is None


def test_protocol_table_has_fcas_layout():
    runs = [
        {
            "method": "fca",
            "seed": s,
            "generalization": {"model": "global", "values": {"bacc": g, "auc": 70.0}},
            "specialization": {"values": {"bacc": 60.0 + s, "auc": 80.0}},
        }
        for s, g in ((0, 50.0), (1, 52.0))
    ]
    runs.append(
        {
            "method": "prr",
            "seed": 0,
            "generalization": {"model": "sites", "values": {"bacc": 40.0, "auc": 65.0}},
            "specialization": {"values": {"bacc": 70.0, "auc": 85.0}},
        }
    )
    table = protocol_table(runs, ["prr", "fca"], ("bacc", "auc")).splitlines()
    assert table[0] == "| method | seeds | generalization scored by | Gen bACC | Gen bAUC | Spec bACC | Spec bAUC |"
    assert table[2] == "| prr | 1 | each site's reported model (best round), mean over sites | 40.00 | 65.00 | 70.00 | 85.00 |"
    assert table[3] == "| fca | 2 | one global model (last round) | 51.00 ± 1.41 | 70.00 ± 0.00 | 60.50 ± 0.71 | 80.00 ± 0.00 |"


# ----- end to end ---------------------------------------------------------------------------------------------
def assert_specialization_is_what_the_sites_reported(ws, result):
    for site, values in result["specialization"]["per_site"].items():
        reported = json.loads(next(ws.glob(f"{site}/prrfl/*/results.json")).read_text())["best"]["test"]
        assert values == {k: reported[k] for k in result["metrics"]}  # the same model on the same split
        assert result["cross_site"][site][site] == reported
    means = {k: float(np.mean([v[k] for v in result["specialization"]["per_site"].values()])) for k in result["metrics"]}
    assert result["specialization"]["values"] == pytest.approx(means)


@pytest.fixture(scope="module")
def global_model_runs(tmp_path_factory):
    """The FCA and HarmoFL jobs in FLARE's simulator, started together (tests/conftest.py's SimulatorRun): method ->
    its SimulatorRun, whose workspace the tests read once it has ended."""
    from prrfl.flare.job_recipe import export_job

    runs = {}
    for method in ("fca", "harmofl"):
        root = tmp_path_factory.mktemp(method)
        job = export_job(f"derm_{method}", root / "jobs", cfg=tiny_derm_config(method=method, run_name=f"derm_{method}", method_args={}))
        runs[method] = SimulatorRun(job, root / "ws", 2, session_cache(tmp_path_factory))
    yield runs
    for run in runs.values():
        run.stop()


@pytest.mark.e2e
def test_fca_run_scores_generalization_with_its_global_model(global_model_runs):
    ws, _ = global_model_runs["fca"].finished()
    server = json.loads((ws / "server/simulate_job/results.json").read_text())
    saved = torch.load(server["global_model"]["file"])
    assert server["global_model"]["round"] == 1 and not any("personal_head" in k for k in saved)
    [path] = write_crosseval(ws)
    result = json.loads(path.read_text())
    assert path == ws / "prrfl/derm_fca/crosseval.json"
    assert result["generalization"]["model"] == "global" and result["metrics"] == ["bacc", "auc"]
    assert all(0 <= v <= 100 for v in result["generalization"]["values"].values())
    assert set(result["cross_site"]) == {"site-1", "site-2"} and set(result["cross_site"]["site-1"]) == {"site-1", "site-2"}
    assert_specialization_is_what_the_sites_reported(ws, result)
    [run] = find_runs(ws)
    task = build_task(run.cfg)
    tests = [task.load_site(r["cohort"], torch.device("cpu"), r["data_root"]).test for r in run.sites.values()]
    assert result["pooled_test_samples"] == sum(map(len, tests))


@pytest.mark.e2e
def test_harmofl_run_shares_one_frozen_amplitude_and_scores_with_its_global_model(global_model_runs):
    ws, _ = global_model_runs["harmofl"].finished()
    state = ws.with_name("ws.state")
    amplitudes = [
        torch.load(state / s / "derm_harmofl/site_state.pt", weights_only=False)["models"]["local"]["norm.amplitude"]
        for s in ("site-1", "site-2")
    ]
    server = json.loads((ws / "server/simulate_job/results.json").read_text())
    global_amplitude = torch.load(server["global_model"]["file"])["norm.amplitude"]
    # after the last round each site scored the last aggregate too, and the server's results hold that score
    rounds = server["config"]["num_rounds"]
    for site, summary in server["sites"].items():
        history = json.loads(next(ws.glob(f"{site}/prrfl/*/results.json")).read_text())["history"]
        assert [h["global_round"] for h in history if h["kind"] == "download"] == list(range(rounds))
        assert summary["last"] == next(h for h in reversed(history) if h["kind"] == "download")
    # the federation's tracking run: the last aggregate's mean test at the last epoch, and the sites' models after
    # their local epochs (valid/..., test/...) at each round's end, beside the reported global model
    fed = scalars_of(ws / "server/simulate_job/tb_events/federation")
    epochs, metric = server["config"]["local_epochs"], "bacc" if "test_global/bacc" in fed else "f1"
    last_step = rounds * epochs - 1
    scored = [s["last"]["test"][metric] for s in server["sites"].values()]
    assert fed[f"test_global/{metric}"][last_step] == pytest.approx(sum(scored) / len(scored), abs=1e-4)
    assert sorted(fed[f"test/{metric}"]) == [r * epochs + epochs - 1 for r in range(rounds)]
    assert global_amplitude.abs().sum() > 0
    for amplitude in amplitudes:  # frozen after round 0: round 1 trained with the average, unchanged
        assert torch.equal(amplitude, global_amplitude)
    [path] = write_crosseval(ws)
    result = json.loads(path.read_text())
    assert result["generalization"]["model"] == "global"
    assert_specialization_is_what_the_sites_reported(ws, result)


def test_summary_line_lists_the_metrics_in_the_tasks_order():
    from prrfl.crosseval import summary_line

    result = {
        "metrics": ["bacc", "auc"],
        "generalization": {"model": "global", "values": {"auc": 70.25, "bacc": 51.0}},
        "specialization": {"values": {"auc": 75.0, "bacc": 60.04}},
    }
    assert summary_line(result) == "generalization (global) bacc 51.0 auc 70.2; specialization bacc 60.0 auc 75.0"


def test_cross_site_matrix_rows_are_models_and_columns_test_splits_by_cohort():
    from prrfl.report import cross_site_table

    def run(seed, ab):
        return {
            "method": "prr",
            "seed": seed,
            "cohorts": {"site-1": "A", "site-2": "B"},
            "cross_site": {
                "site-1": {"site-1": {"f1": 80.0}, "site-2": {"f1": ab}},
                "site-2": {"site-1": {"f1": 30.0}, "site-2": {"f1": 70.0 + seed}},
            },
        }

    table = cross_site_table([run(0, 40.0), run(1, 44.0), {"method": "fedavg"}], "prr", "f1", ("B", "A")).splitlines()
    assert table[0] == "| prr: F1 on → | site-2_B | site-1_A |"  # each site by its label, in the task's order of cohorts
    assert table[2] == "| site-2_B's model | 70.50 ± 0.71 | 30.00 ± 0.00 |"
    assert table[3] == "| site-1_A's model | 42.00 ± 2.83 | 80.00 ± 0.00 |"
