"""Faults without a federation: unreadable checkpoints, the per-round deadline, resume modes, site
settings files, site start-up checks and the stale marks of the results table."""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import pytest
import torch
from conftest import make_runtime, tiny_derm_config
from nvflare.apis.fl_context import FLContext
from test_site_loop import initial_download, next_download

from prrfl.flare import liveness, places
from prrfl.flare.liveness import Deadline, WorkerWatch
from prrfl.flare.server_workflow import PREVIOUS_STATE_FILE, STATE_FILE, PersonalizedWorkflow
from prrfl.flare.site_app import build_runtime
from prrfl.flare.site_config import SiteConfig
from prrfl.server.federation import ServerState
from prrfl.site.state import CHECKPOINT, PREVIOUS_CHECKPOINT
from prrfl.site.trainer import run_round
from prrfl.storage import save_torch
from prrfl.summary import participation, results_table


def truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[:100])


@pytest.fixture
def fill_disk(monkeypatch):
    """Call it to send every atomic write to /dev/full, where each write fails with ENOSPC, as on a full disk."""
    import os

    import prrfl.storage

    def mkstemp(prefix="", suffix="", dir=None):
        return os.open("/dev/full", os.O_WRONLY), str(Path(dir) / f"{prefix}x{suffix}")

    return lambda: monkeypatch.setattr(prrfl.storage.tempfile, "mkstemp", mkstemp)


def test_a_full_disk_is_named_as_such_not_as_torchs_internal_error(tmp_path, fill_disk):
    from prrfl.storage import DiskFullError, save_json

    fill_disk()
    target = tmp_path / "state" / "server_state.pt"
    with pytest.raises(DiskFullError) as caught:
        save_torch({"w": torch.zeros(100_000)}, target)  # torch itself says "[enforce fail at inline_container.cc]"
    assert str(caught.value).startswith(f"no space left on device: cannot write {target} (")
    assert "MiB free there); free some space or move the folder" in str(caught.value)
    assert not target.exists() and not list(target.parent.iterdir())  # no partial file, no temp left
    with pytest.raises(DiskFullError, match="no space left on device: cannot write .*results.json"):
        save_json({"a": 1}, tmp_path / "results.json")


def test_a_site_whose_state_folder_is_full_reports_it_in_one_line(tiny_task, tmp_path, fill_disk):
    site = make_runtime(tiny_task, tmp_path)
    run_round(site, initial_download(tiny_task), 0)
    fill_disk()
    with pytest.raises(OSError) as caught:
        site.save()
    # what the site sends the server as its error (prrfl.flare.site_app.main), and the server logs
    sent = f"{type(caught.value).__name__}: {caught.value}"
    assert sent.startswith(f"DiskFullError: no space left on device: cannot write {site.state_dir / CHECKPOINT} (")
    assert torch.load(site.state_dir / CHECKPOINT, weights_only=False)["round_idx"] == 0  # round 0's state intact


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
    """A server state as saved (a plain dict, ServerState.to_dict)."""
    return ServerState(
        run_id=f"r{next_round}", config=tiny_derm_config().to_dict(), global_counts=[], site_counts={}, downloads={}, next_round=next_round
    ).to_dict()


def test_resume_modes(tmp_path, caplog):
    caplog.set_level(logging.INFO)
    state_dir = tmp_path / "derm_prr"
    with pytest.raises(FileNotFoundError, match=r"resume=true but there is no saved state of run 'derm_prr' in .*nothing to resume"):
        workflow(resume=True)._load_state(state_dir)
    assert workflow(resume="auto")._load_state(state_dir) is None
    assert "resume=auto: no saved state" in caplog.text
    save_torch(saved_state(1), state_dir / STATE_FILE)
    assert workflow(resume="auto")._load_state(state_dir).run_id == "r1"
    assert workflow(resume=True)._load_state(state_dir).run_id == "r1"
    assert workflow(resume=False)._load_state(state_dir) is None  # a new run as asked...
    assert not state_dir.exists()
    aside = list(tmp_path.glob("derm_prr.replaced-*"))  # ...and the old one kept, with a warning
    assert len(aside) == 1 and torch.load(aside[0] / STATE_FILE, weights_only=False)["run_id"] == "r1"
    assert "starting a new run as asked (resume=false)" in caplog.text
    assert workflow(resume="yes").refusal == "workflow argument 'resume' must be false, true or \"auto\", got 'yes'"


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
    wf._save_state(ServerState.from_dict(saved_state(1)), tmp_path)
    wf._save_state(ServerState.from_dict(saved_state(2)), tmp_path)
    truncate(tmp_path / STATE_FILE)
    with caplog.at_level(logging.WARNING):
        state = wf._load_state(tmp_path)
    assert state.next_round == 1  # round 1 is trained again
    assert "round 1 is trained again" in caplog.text
    assert list(tmp_path.glob(f"{STATE_FILE}.corrupt-*"))
    truncate(tmp_path / PREVIOUS_STATE_FILE)
    save_torch(saved_state(2), tmp_path / STATE_FILE)
    truncate(tmp_path / STATE_FILE)
    with pytest.raises(RuntimeError, match="cannot read checkpoint .*restore .* from a backup"):
        wf._load_state(tmp_path)


def test_a_resume_from_another_runs_state_is_refused_in_one_line_naming_the_file_and_what_differs(tmp_path):
    """The saved state records its run (its config: run_name, task, method, seed, ...; the sites that prepared their
    data): a job that is not that run is refused before any site is asked, instead of failing at every site."""
    clients = ["site-1", "site-2", "site-3"]
    path = tmp_path / STATE_FILE

    def saved(config=None, sites=clients, next_round=1):
        state = saved_state(next_round)
        state.update(config=config or tiny_derm_config().to_dict(), site_counts={s: [1, 0, 0] for s in sites})
        save_torch(state, path)

    def refusal() -> str:
        with pytest.raises(ValueError) as refused:
            workflow(resume=True)._load_state(tmp_path, clients)
        (line,) = str(refused.value).splitlines()
        return line

    saved(tiny_derm_config(method="fedavg", run_name="derm_fedavg", seed=3).to_dict())
    assert refusal() == (
        f"cannot resume from {path}, the state of run r1 ('derm_fedavg'): the config differs from the saved run's in "
        "['method', 'run_name', 'seed'] (method: 'fedavg' saved, 'prr' now; run_name: 'derm_fedavg' saved, 'derm_prr' now; "
        "seed: 3 saved, 0 now); only num_rounds may change"
    )
    saved(sites=["hospital-a", "hospital-b", "site-3"])
    assert refusal() == (
        f"cannot resume from {path}, the state of run r1 ('derm_prr'): its sites ['hospital-a', 'hospital-b', 'site-3'] are "
        "not this job's: 1 of them among its clients ['site-1', 'site-2', 'site-3'], fewer than min_sites=majority (2)"
    )
    saved({**tiny_derm_config().to_dict(), "num_rounds": 5}, next_round=4)
    assert refusal().endswith("('derm_prr'): num_rounds=2 but 4 rounds are already completed")
    save_torch({"models": {}, "next_round": 1}, path)  # a file that is not a prrfl run's state
    assert refusal().startswith(f"cannot resume from {path}: the saved server state lacks [")
    saved(sites=["site-1", "site-2", "site-4"])  # the same run, one site gone: a majority is there
    state = workflow(resume=True)._load_state(tmp_path, clients)
    assert state.run_id == "r1" and state.next_round == 1


def test_a_bad_job_is_refused_in_one_line_naming_its_file_when_it_runs():
    """A hand-edited job folder: FLARE builds the workflow (raising there would bury the cause in FLARE's traceback
    about its components), and `run` refuses the job in one line naming the file and the field."""
    bad = PersonalizedWorkflow(config={**tiny_derm_config().to_dict(), "method_args": {"det_enabled": "flase"}})
    assert "'det_enabled' must be true or false, got 'flase'" in bad.refusal and "method_args.det_enabled" in bad.refusal
    assert "task_timeout" in workflow(task_timeout="soon").refusal
    assert workflow(memory_gc_rounds=-1).refusal == "workflow argument 'memory_gc_rounds' must be an integer >= 0, got -1"
    assert workflow().refusal is None and workflow().memory_gc_rounds == 1  # FLARE's cleanup_memory after every round
    said = []
    bad.panic = said.append
    bad._config_file = lambda: "/ws/server/simulate_job/app_server/config/config_fed_server.json"
    bad.run()  # refused before any state is read or any site is asked
    assert said == [
        "the job cannot start: /ws/server/simulate_job/app_server/config/config_fed_server.json, component 'workflow': " + bad.refusal
    ]


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


def test_a_simulator_site_whose_process_died_before_the_task_is_not_waited_for_until_the_deadline(monkeypatch):
    """In the simulator a site's process can die before the task reaches it (a worker unable to connect at
    start): WorkerWatch never sees it. Once another site answered and no site owing an answer has a process
    for max(60 s, 3 x the slowest answer), it is gone; a site merely waiting for a simulator thread gets one
    before that, and a seen site that ends is gone after 10 s as before."""
    table: dict[str, list] = {}
    monkeypatch.setattr(liveness, "simulator_workers", lambda: table)
    watch = WorkerWatch()
    table.update({"site-2": [object()], "site-3": [object()]})  # site-1's process died before the task
    assert watch.gone({"site-1", "site-2", "site-3"}, now=0.0) == set()
    assert watch.gone({"site-1", "site-2", "site-3"}, now=500.0) == set()  # the others work: site-1 may be waiting
    del table["site-2"], table["site-3"]  # both answered (site-3 after 30 s, the slowest) and idle: not owing
    assert watch.gone({"site-1"}, now=600.0, slowest_answer=30.0) == set()  # no owing site has a process from now
    assert watch.gone({"site-1"}, now=659.0, slowest_answer=30.0) == set()  # 59 s < max(60, 3 x 30)
    assert watch.gone({"site-1"}, now=690.0, slowest_answer=30.0) == {"site-1"}  # 90 s: gone
    assert watch.gone({"site-1"}, now=690.0, slowest_answer=40.0) == set()  # 3 x 40 = 120 s not yet over

    waiting = WorkerWatch()  # fewer simulator threads than sites: site-1 gets a thread once the others answered
    assert waiting.gone({"site-1"}, now=0.0, slowest_answer=30.0) == set()
    table["site-1"] = [object()]
    assert waiting.gone({"site-1"}, now=20.0, slowest_answer=30.0) == set()
    assert waiting.gone({"site-1"}, now=5000.0, slowest_answer=30.0) == set()  # working: only the deadline ends it
    del table["site-1"]  # its process ends without an answer
    assert waiting.gone({"site-1"}, now=5005.0, slowest_answer=30.0) == set()
    assert waiting.gone({"site-1"}, now=5015.0, slowest_answer=30.0) == {"site-1"}  # seen, then absent 10 s
    assert WorkerWatch().gone({"site-1"}, now=1e6) == set()  # nobody answered yet: never judged unseen


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


def test_a_device_this_machine_cannot_use_is_named_with_its_file_and_field(tmp_path, monkeypatch):
    path = tmp_path / "local" / "prrfl_site.site-3.json"
    path.parent.mkdir()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # a CPU machine, whatever this one is
    for device, message in (
        ("gpu", 'must be "cpu", "cuda" or "cuda:N" (a torch device), got \'gpu\''),
        ("cuda:3", "is 'cuda:3' but this machine has no usable CUDA device: set it to \"cpu\""),
    ):
        path.write_text(json.dumps({"device": device}))
        with pytest.raises(ValueError) as caught:
            SiteConfig.load("site-3", [], workspace=tmp_path)
        assert str(caught.value) == f"field 'device' of {path} {message}" + (
            "" if device == "gpu" else " (or leave it out: CUDA when there is one)"
        )
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    path.write_text(json.dumps({"device": "cuda:3"}))
    with pytest.raises(ValueError, match=r"is 'cuda:3' but this machine has 2 CUDA device\(s\): cuda:0..cuda:1$"):
        SiteConfig.load("site-3", [], workspace=tmp_path)
    path.write_text(json.dumps({"device": "cpu"}))
    assert SiteConfig.load("site-3", [], workspace=tmp_path)[0].device == "cpu"
    with pytest.raises(ValueError, match="^the site script's argument --device must be"):
        SiteConfig.load("site-2", ["--device", "gpu"], workspace=tmp_path)  # no file of site-2: its argument


def test_a_settings_file_in_the_simulator_workspace_instead_of_its_local_folder_is_reported(tmp_path):
    site_ws = tmp_path / "ws" / "site-3"
    site_ws.mkdir(parents=True)
    (tmp_path / "ws" / "prrfl_site.site-3.json").write_text(json.dumps({"cohort": "C"}))
    config, report = SiteConfig.load("site-3", [], workspace=site_ws)
    assert config.cohort is None and report.used is None
    assert report.notes == [
        f"{tmp_path / 'ws' / 'prrfl_site.site-3.json'} is not read: site settings are read from {site_ws / 'local'}/; "
        f"in the simulator, put them in {tmp_path / 'ws' / 'local'}/, which it copies into every site"
    ]


def test_a_cohort_the_task_does_not_have_or_the_data_does_not_hold_is_named_with_the_advice(tmp_path, monkeypatch):
    from prrfl.registry import build_task

    monkeypatch.chdir(tmp_path)
    cfg = tiny_derm_config()
    meta = {"prrfl_config": cfg.to_dict(), "run_id": "r", "num_sites": 1}
    settings = tmp_path / "local" / "prrfl_site.site-3.json"
    settings.parent.mkdir()
    settings.write_text(json.dumps({"cohort": "Z"}))
    with pytest.raises(ValueError) as caught:
        build_runtime("site-3", meta, SiteConfig.load("site-3", [], workspace=tmp_path)[0], None)
    assert (
        str(caught.value)
        == f"field 'cohort' of {settings} is 'Z', not a cohort of the derm task: expected one of ['A', 'B', 'C', 'D', 'OOD']"
    )

    prepared = tmp_path / "prepared"  # a prepared folder without cohort C (site-3's by its name)
    (prepared / "A").mkdir(parents=True)
    (prepared / "OOD").mkdir()
    (prepared / "manifest.json").write_text("{}")
    settings.write_text(json.dumps({"data_root": str(prepared)}))
    with pytest.raises(FileNotFoundError) as caught:
        build_runtime("site-3", meta, SiteConfig.load("site-3", [], workspace=tmp_path)[0], None)
    assert str(caught.value) == (
        f"site site-3 is cohort 'C' (from the site name site-3) but {prepared} (field 'data_root' of {settings}) holds no prepared "
        "cohort 'C', only ['A', 'OOD']: set 'cohort' to one of them, or point data_root at data prepared with 'C'"
    )
    assert "I2CVB" in build_task(tiny_derm_config(task="prostate", run_name="p", method_args={}, data={})).cohorts


# ----- site start-up checks -------------------------------------------------------------------
def test_a_site_refuses_to_start_with_an_unwritable_state_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    meta = {"prrfl_config": tiny_derm_config().to_dict(), "run_id": "r", "num_sites": 1}
    with pytest.raises(OSError, match=r"site site-1: state folder .*a_file/state is not writable .*set state_dir"):
        build_runtime("site-1", meta, SiteConfig(state_dir=str(blocker / "state")), None)


def test_a_run_lock_names_its_holder_and_dies_with_its_process(tmp_path):
    import os
    import subprocess
    import sys

    from prrfl.flare.places import RunLock, WorkspaceBusy

    path = tmp_path / "ws.state" / "running.lock"
    first = RunLock(path).acquire(run_name="derm_prr", job_id="simulate_job")
    first.update(run_id="0123456789ab")
    with pytest.raises(WorkspaceBusy) as caught:
        RunLock(path).acquire(run_name="other")
    assert caught.value.holder["run_id"] == "0123456789ab" and caught.value.holder["pid"] == os.getpid()
    assert str(caught.value).startswith(f"{path} is in use by run 0123456789ab of job 'derm_prr' (pid ")
    first.release()
    RunLock(path).acquire(run_name="next").release()  # free again
    # a holder killed with -9 leaves the file but no lock: the operating system releases it with the process
    script = f"from prrfl.flare.places import RunLock; import time; RunLock({str(path)!r}).acquire(run_name='gone'); print('held', flush=True); time.sleep(600)"
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "held"
        with pytest.raises(WorkspaceBusy, match="is in use by job 'gone' \\(pid "):
            RunLock(path).acquire(run_name="x")
    finally:
        proc.kill()
        proc.wait()
    RunLock(path).acquire(run_name="after the kill").release()


def test_a_simulator_job_whose_workspace_was_emptied_ends_naming_what_is_lost_and_where_the_rest_is(tmp_path):
    ws = tmp_path / "ws"
    run_dir = ws / "server" / "simulate_job"
    line = places.emptied_report(
        "run 0123456789ab of 'derm_prr'",
        ws,
        "after round 3",
        tmp_path / "ws.state" / "server" / "derm_prr",
        run_dir,
        "derm_prr",
        tensorboard=run_dir / "tb_events",
        cross_site=True,
    )
    assert "\n" not in line
    assert line.startswith(
        f"run 0123456789ab of 'derm_prr' finished training, but the simulator workspace {ws} was emptied while it ran "
        "(found after round 3; a second `nvflare simulator` on it?). Lost: "
    )
    lost, kept = line.split(". Lost: ")[1].split(". Kept: ")
    assert lost.split("; ") == [
        f"its log files in {ws} (what the simulator printed holds the whole log)",
        f"its TensorBoard events ({run_dir / 'tb_events'})",
        "its cross-site evaluation, not run (the sites' folders are gone)",
    ]
    assert kept.startswith(
        f"the checkpoints and results in {tmp_path / 'ws.state'} (the server's in {tmp_path / 'ws.state/server/derm_prr'})"
    )
    assert f"written again to {run_dir / 'results.json'} and each site's {ws}/<site>/prrfl/derm_prr/results.json" in kept
    assert kept.endswith(f"; `prrfl crosseval {ws}` computes the cross-site matrix from them")
    # no TensorBoard (MLflow keeps its store beside the workspace), no cross-site evaluation: neither is named
    bare = places.emptied_report("run x of 'r'", ws, "at the job's end", tmp_path / "s", run_dir, "r")
    assert "TensorBoard" not in bare and "cross" not in bare and "(found at the job's end;" in bare
    warning = places.emptied_warning(run_dir, "after round 3", tmp_path / "ws.state")
    assert warning.startswith(f"{run_dir} was emptied while this job ran (found after round 3; ")
    assert warning.endswith("and it will end with an error saying what was lost")


def test_the_tensorboard_receiver_says_once_that_its_emptied_folder_lost_the_events_and_stops_writing(tmp_path, caplog):
    from nvflare.apis.analytix import AnalyticsDataType
    from nvflare.apis.utils.analytix_utils import create_analytic_dxo
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from prrfl.flare.tracking import TensorBoardReceiver

    tb = tmp_path / "ws" / "server" / "simulate_job" / "tb_events"
    tb.mkdir(parents=True)
    receiver = TensorBoardReceiver()
    receiver.root_log_dir = str(tb)
    ctx = FLContext()

    def scalar(step: int):
        return create_analytic_dxo(tag="test/f1", value=1.0, data_type=AnalyticsDataType.SCALAR, global_step=step).to_shareable()

    for step in range(3):
        receiver.save(ctx, scalar(step), "federation")
    events = EventAccumulator(str(tb / "federation"))  # each event is in the file as soon as it is received
    events.Reload()
    assert [e.step for e in events.Scalars("test/f1")] == [0, 1, 2]
    assert not receiver.lost()
    shutil.rmtree(tmp_path / "ws")  # a second `nvflare simulator` on the workspace
    assert receiver.lost()
    with caplog.at_level(logging.ERROR):
        for step in range(3, 30):
            receiver.save(ctx, scalar(step), "federation")
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1, errors  # FLARE puts the job's context in front
    assert errors[0].endswith(
        f"{tb} was emptied while the job ran: the TensorBoard events written there are lost; no more events are written there"
    )
    assert receiver.writers_table == {}
    receiver.finalize(ctx)  # nothing left to flush into the removed folder


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
