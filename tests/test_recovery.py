"""Faults without a federation: unreadable checkpoints, the per-round deadline, resume modes, site
settings files, site start-up checks and the stale marks of the results table."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
import torch
from conftest import make_runtime, tiny_derm_config
from test_site_loop import initial_download, next_download

from prrfl.flare import places
from prrfl.flare.liveness import Deadline
from prrfl.flare.site_app import build_runtime
from prrfl.flare.site_config import SiteConfig
from prrfl.flare.workflow import PREVIOUS_STATE_FILE, STATE_FILE, PersonalizedWorkflow
from prrfl.report import participation, results_table
from prrfl.site.state import CHECKPOINT, PREVIOUS_CHECKPOINT
from prrfl.site.trainer import run_round
from prrfl.storage import save_torch


def truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[:100])


# ----- site checkpoints ----------------------------------------------------------------------
def test_a_truncated_site_checkpoint_falls_back_to_the_previous_round_with_a_warning(tiny_task, tmp_path, caplog):
    site = make_runtime(tiny_task, tmp_path)
    up0 = run_round(site, initial_download(tiny_task), 0)
    up1 = run_round(site, next_download(up0, 1), 1)
    truncate(site.state_dir / CHECKPOINT)

    restarted = make_runtime(tiny_task, tmp_path)
    with caplog.at_level(logging.WARNING):
        assert restarted.restore(before_round=2)
    assert restarted.round_idx == 0  # the previous checkpoint, of round 0
    assert "cannot read checkpoint" in caplog.text and "continuing from" in caplog.text
    kept = sorted(p.name for p in site.state_dir.glob(f"{CHECKPOINT}.corrupt-*"))
    assert len(kept) == 1 and not (site.state_dir / CHECKPOINT).exists()  # set aside, not deleted
    run_round(restarted, next_download(up1, 2), 2)
    results = json.loads((site.state_dir / "results.json").read_text())
    assert results["rounds_missed"] == [1] and results["rounds_completed"] == 3  # the lost round is reported
    # the next save rotates a readable checkpoint into the previous slot, never the unreadable one
    assert torch.load(site.state_dir / PREVIOUS_CHECKPOINT, weights_only=False)["round_idx"] == 0


def test_no_readable_checkpoint_says_what_to_do(tiny_task, tmp_path):
    site = make_runtime(tiny_task, tmp_path)
    up0 = run_round(site, initial_download(tiny_task), 0)
    run_round(site, next_download(up0, 1), 1)
    truncate(site.state_dir / CHECKPOINT)
    truncate(site.state_dir / PREVIOUS_CHECKPOINT)
    with pytest.raises(RuntimeError, match="no readable checkpoint of run run .*restore that folder from a backup"):
        make_runtime(tiny_task, tmp_path).restore(before_round=2)


def test_a_site_whose_state_is_gone_cannot_silently_restart_mid_run(tiny_task, tmp_path):
    site = make_runtime(tiny_task, tmp_path)
    up0 = run_round(site, initial_download(tiny_task), 0)
    shared_only = next_download(up0, 1)
    shared_only.params = {k: v for k, v in shared_only.params.items() if not k.startswith("bn.")}
    fresh = make_runtime(tiny_task, tmp_path / "elsewhere")  # an empty state folder
    assert not fresh.restore(before_round=1)
    with pytest.raises(RuntimeError, match="no checkpoint of run run in .* sends only the shared weights"):
        run_round(fresh, shared_only, 1)


# ----- server state ---------------------------------------------------------------------------
def workflow(**args) -> PersonalizedWorkflow:
    return PersonalizedWorkflow(config=tiny_derm_config().to_dict(), **args)


def saved_state(next_round: int) -> dict:
    return {"run_id": f"r{next_round}", "config": tiny_derm_config().to_dict(), "next_round": next_round, "history": []}


def test_resume_modes(tmp_path, caplog):
    caplog.set_level(logging.INFO)
    state_dir = tmp_path / "derm_prr"
    with pytest.raises(FileNotFoundError, match=r"resume=true but there is no saved state of run 'derm_prr' in .*nothing to resume"):
        workflow(resume=True)._load_state(state_dir)
    assert workflow(resume="auto")._load_state(state_dir) is None
    assert "resume=auto: no saved state" in caplog.text
    save_torch(saved_state(1), state_dir / STATE_FILE)
    assert workflow(resume="auto")._load_state(state_dir)["run_id"] == "r1"
    assert workflow(resume=True)._load_state(state_dir)["run_id"] == "r1"
    assert workflow(resume=False)._load_state(state_dir) is None  # a new run as asked...
    assert not state_dir.exists()
    aside = list(tmp_path.glob("derm_prr.replaced-*"))  # ...and the old one kept, with a warning
    assert len(aside) == 1 and torch.load(aside[0] / STATE_FILE, weights_only=False)["run_id"] == "r1"
    assert "starting a new run as asked (resume=false)" in caplog.text
    with pytest.raises(ValueError, match="workflow argument 'resume'"):
        workflow(resume="yes")


def test_a_new_run_sets_the_earlier_runs_folder_aside_keeping_the_latest_only(tmp_path):
    folder = tmp_path / "site-1" / "derm_prr"
    assert places.set_aside_previous_run(folder) is None  # nothing there yet
    folder.mkdir(parents=True)
    assert places.set_aside_previous_run(folder) is None  # an empty folder holds no run
    (folder / "site_state.pt").write_text("first run")
    first = places.set_aside_previous_run(folder)
    assert first.name.startswith("derm_prr.replaced-") and (first / "site_state.pt").read_text() == "first run"
    assert not folder.exists()
    folder.mkdir()
    (folder / "site_state.pt").write_text("second run")
    first.rename(first.with_name("derm_prr.replaced-20000101-000000"))  # an older copy
    second = places.set_aside_previous_run(folder)
    assert [p.name for p in folder.parent.iterdir()] == [second.name]  # only the latest is kept
    assert (second / "site_state.pt").read_text() == "second run"


def test_an_unreadable_server_state_falls_back_to_the_previous_round(tmp_path, caplog):
    wf = workflow(resume=True)
    wf._save_state(saved_state(1), tmp_path)
    wf._save_state(saved_state(2), tmp_path)
    truncate(tmp_path / STATE_FILE)
    with caplog.at_level(logging.WARNING):
        state = wf._load_state(tmp_path)
    assert state["next_round"] == 1  # round 1 is trained again
    assert "round 1 is trained again" in caplog.text
    assert list(tmp_path.glob(f"{STATE_FILE}.corrupt-*"))
    truncate(tmp_path / PREVIOUS_STATE_FILE)
    save_torch(saved_state(2), tmp_path / STATE_FILE)
    truncate(tmp_path / STATE_FILE)
    with pytest.raises(RuntimeError, match="cannot read checkpoint .*restore .* from a backup"):
        wf._load_state(tmp_path)


def test_a_bad_job_is_refused_when_the_workflow_is_built():
    with pytest.raises(ValueError, match="det_enabled"):
        PersonalizedWorkflow(config={**tiny_derm_config().to_dict(), "method_args": {"det_enabled": "flase"}})
    with pytest.raises(ValueError, match="task_timeout"):
        workflow(task_timeout="soon")
    with pytest.raises(ValueError, match="workflow argument 'memory_gc_rounds' must be an integer >= 0, got -1"):
        workflow(memory_gc_rounds=-1)
    assert workflow().memory_gc_rounds == 1  # FLARE's cleanup_memory after every round by default


# ----- deadline ------------------------------------------------------------------------------
def test_the_deadline_follows_the_measured_work():
    auto = Deadline()
    assert auto.seconds([]) == 7200  # nothing measured yet
    assert auto.seconds([4.0, 8.0]) == 60  # 3 x 8 s is below the floor
    assert auto.seconds([100.0, 40.0]) == 300  # 3 x the slowest round
    assert "3 x the slowest round so far, 100 s" in auto.explain([100.0])
    assert auto.seconds([], [2.0, 1.0]) == 60  # round 0: 5 x the sum of the estimates, at least the floor
    assert auto.seconds([], [30.0, 10.0]) == 200
    assert "5 x the sum of the sites' estimates of a round, 40.0 s" in auto.explain([], [30.0, 10.0])
    assert auto.seconds([50.0], [30.0]) == 150  # a measured round wins over estimates
    assert Deadline(timeout=90).seconds([1000.0]) == 90
    assert Deadline(timeout=0).seconds([1.0]) is None
    for bad in ({"timeout": -1}, {"timeout": "soon"}, {"floor": 0}, {"factor": True}):
        with pytest.raises(ValueError):
            Deadline(**bad)


# ----- results table --------------------------------------------------------------------------
def test_the_table_marks_stale_sites_and_missed_rounds():
    history = [{"round": 0, "sites": ["a", "b", "c"]}, {"round": 1, "sites": ["a", "c"]}, {"round": 2, "sites": ["a"]}]
    part = participation(history, ["a", "b", "c"])
    assert part["a"] == {"rounds": 3, "aggregated": [0, 1, 2], "missed": [], "stale": False}
    assert part["b"]["missed"] == [1, 2] and part["b"]["stale"]
    summaries = {s: {"best": {"round": 0, "test": {"f1": 50.0, "auc": 70.0}}, "participation": part[s]} for s in part}
    table = results_table(summaries, ("f1", "auc"))
    assert "| a | 0 | 3/3 | 50.00 | 70.00 |" in table
    assert "| b (stale) | 0 | 1/3 |" in table and "| c (stale) | 0 | 2/3 |" in table
    assert "* b: missed round(s) [1, 2]; its numbers are those of round 0, its last aggregated upload" in table
    history.append({"round": 3, "sites": ["a", "b", "c"]})
    assert "| b (missed rounds) | 0 | 2/4 |" in results_table(
        {"b": {**summaries["b"], "participation": participation(history, ["b"])["b"]}}, ("f1", "auc")
    )


# ----- site settings -------------------------------------------------------------------------
def test_each_site_reads_its_own_settings_file_and_unused_files_are_reported(tmp_path):
    local = tmp_path / "local"
    local.mkdir()
    (local / "prrfl_site.json").write_text(json.dumps({"device": "cpu"}))
    (local / "prrfl_site.site-1.json").write_text(json.dumps({"data_root": "/data/one", "num_threads": 2, "eval_batch_size": 16}))
    (local / "prrfl_site.site-9.json").write_text("{}")
    (tmp_path / "prrfl_site.json").write_text("{}")  # beside local/, not in it

    one, report = SiteConfig.load("site-1", [], workspace=tmp_path)
    assert one.data_root == "/data/one" and one.num_threads == 2 and one.eval_batch_size == 16 and one.device is None
    assert report.used.endswith("local/prrfl_site.site-1.json")
    assert report.per_site_files == ["site-1", "site-9"]
    assert any("prrfl_site.json is not read" in n and "takes precedence" in n for n in report.notes)
    assert any(f"{tmp_path}/prrfl_site.json is not read" in n for n in report.notes)
    two, report = SiteConfig.load("site-2", ["--data-root", "/from/args"], workspace=tmp_path)
    assert two.device == "cpu" and two.data_root == "/from/args" and report.used.endswith("local/prrfl_site.json")


def test_bad_settings_files_name_themselves(tmp_path):
    (tmp_path / "local").mkdir()
    path = tmp_path / "local" / "prrfl_site.site-1.json"
    for content, message in (
        ("{not json", "prrfl_site.site-1.json is not valid JSON"),
        (json.dumps({"dataroot": "/x"}), r"unknown field\(s\) \['dataroot'\]"),
        (json.dumps({"num_threads": "4"}), "field 'num_threads' must be a positive integer"),
        (json.dumps({"eval_batch_size": 0}), "field 'eval_batch_size' must be a positive integer or null, got 0"),
        (json.dumps(["cpu"]), "must hold a JSON object"),
    ):
        path.write_text(content)
        with pytest.raises(ValueError, match=message):
            SiteConfig.load("site-1", [], workspace=tmp_path)


# ----- site start-up checks -------------------------------------------------------------------
def test_a_site_refuses_to_start_with_an_unwritable_state_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    meta = {"prrfl_config": tiny_derm_config().to_dict(), "run_id": "r", "num_sites": 1}
    with pytest.raises(OSError, match=r"site site-1: state folder .*a_file/state is not writable .*set state_dir"):
        build_runtime("site-1", meta, SiteConfig(state_dir=str(blocker / "state")), None)


def test_state_lives_beside_the_simulator_workspace_and_inside_a_deployed_one(tmp_path):
    sim_site = tmp_path / "ws" / "site-2"
    assert places.default_state_dir(sim_site, "site-2", "derm_prr", "simulate_job") == tmp_path / "ws.state" / "site-2" / "derm_prr"
    kit = tmp_path / "msk"
    assert places.default_state_dir(kit, "msk", "derm_prr", "3f2a-job") == kit / "prrfl" / "derm_prr"


def test_the_round_estimate_times_a_step_and_leaves_the_site_untouched(tiny_task, tmp_path):
    from prrfl.site.trainer import estimate_round_seconds

    site = make_runtime(tiny_task, tmp_path)
    models = {r: {k: v.clone() for k, v in m.state_dict().items()} for r, m in site.models.items()}
    generator, global_rng = site.generator.get_state(), torch.get_rng_state()
    estimate = estimate_round_seconds(site)
    assert 0 < estimate < 60  # a tiny net on 30 images
    assert torch.equal(site.generator.get_state(), generator) and torch.equal(torch.get_rng_state(), global_rng)
    for role, state in models.items():
        for key, value in site.models[role].state_dict().items():
            assert torch.equal(value, state[key]), (role, key)
    assert all(p.grad is None for m in site.models.values() for p in m.parameters())
