"""Faults on a real (POC) deployment with the shipped defaults: a server killed mid-job, a site killed
mid-round that rejoins, a site whose local data is corrupt.

One deployment (server + 3 sites, tiny images) serves all three; with 3 sites the default min_sites
("majority") is 2, so the job goes on without one. Plus the resume rule itself.
"""

from __future__ import annotations

import json
import re
import shutil
import signal
from pathlib import Path

import psutil
import pytest
import torch
from conftest import TINY_DATA, tiny_derm_config, untimed, wait_for

from prrfl.cli import main as prrfl
from prrfl.config import RunConfig
from prrfl.flare.deployment import poc_deployment, with_workflow_args, write_site_config
from prrfl.flare.job_recipe import export_job
from prrfl.flare.jobs import job_config
from prrfl.flare.server_workflow import STATE_FILE, resume_problem
from prrfl.tasks.derm import ensure_synthetic_federation


def test_resume_rule_only_lets_num_rounds_grow():
    saved = RunConfig.from_dict({**job_config("derm_prr").to_dict(), "num_rounds": 2}).to_dict()
    assert resume_problem(saved, saved, next_round=1) is None
    assert resume_problem(saved, {**saved, "num_rounds": 5}, next_round=2) is None  # extend a finished run
    assert "already completed" in resume_problem(saved, {**saved, "num_rounds": 1}, next_round=2)
    assert "['lr']" in resume_problem(saved, {**saved, "lr": 0.5}, next_round=1)
    # a run saved before the numerics fields existed ran with their defaults
    older = {k: v for k, v in saved.items() if k not in ("precision", "channels_last", "torch_compile")}
    assert resume_problem(older, saved, next_round=1) is None
    assert "['precision']" in resume_problem(older, {**saved, "precision": "bf16"}, next_round=1)


def tiny_job(root: Path, run_name: str, **overrides) -> Path:
    return export_job("derm_prr", root / run_name, cfg=tiny_derm_config(run_name=run_name, **overrides))


def server_state(dep, run_name: str) -> dict | None:
    path = dep.kits.kit(dep.kits.server) / "prrfl" / run_name / STATE_FILE
    return torch.load(path, weights_only=False) if path.exists() else None  # written atomically


def server_log(dep, job_id: str) -> str:
    """The live server log of one running job."""
    path = dep.kits.kit(dep.kits.server) / job_id / "log.txt"
    return path.read_text(errors="replace") if path.exists() else ""


def site_results(dep, site: str, run_name: str) -> dict:
    return json.loads((dep.kits.kit(site) / "prrfl" / run_name / "results.json").read_text())


def job_log(dep, job_id: str) -> str:
    """The server log of a finished job, as the admin downloads it (FLARE moves the live one away)."""
    return "".join(p.read_text(errors="replace") for p in Path(dep.sess.download_job_result(job_id)).rglob("log.txt"))


@pytest.fixture(scope="module")
def deployment(tmp_path_factory):
    root = tmp_path_factory.mktemp("faults")
    # FLARE finalizes a job whose site never reports its end (a frozen job process) after this many seconds
    # (default 900); then its heartbeat clean-up kills that process
    env = {"PRRFL_CACHE": str(root / "cache"), "NVFLARE_CLIENT_OUTCOME_WAIT_TIMEOUT": "60"}
    with poc_deployment(root / "poc", 3, env=env) as dep:
        dep.root = root
        yield dep


@pytest.mark.e2e
@pytest.mark.drill
def test_server_killed_mid_job_resumes_from_the_last_completed_round(deployment):
    dep = deployment
    _, status = dep.run_job(tiny_job(dep.root, "uninterrupted"), timeout=240)
    assert status == "FINISHED:COMPLETED"
    reference = server_state(dep, "uninterrupted")

    job = tiny_job(dep.root, "interrupted")
    job_id = dep.sess.submit_job(str(job))
    wait_for(lambda: (server_state(dep, "interrupted") or {}).get("next_round", 0) >= 1, 180, "round 1 to complete")
    dep.kill("server")  # a crash: no shutdown, no chance to save anything more
    before = server_state(dep, "interrupted")
    assert before["next_round"] == 1, "the job ended before the kill; make rounds longer"
    dep.start_server()
    dep.wait_for_sites()
    job_id, status = dep.run_job(with_workflow_args(job, dep.root / "resubmit", resume=True), timeout=240)
    assert status == "FINISHED:COMPLETED"
    assert f"resuming run {before['run_id']}" in job_log(dep, job_id)

    resumed = server_state(dep, "interrupted")
    assert resumed["next_round"] == reference["next_round"] == 2
    assert [h["round"] for h in resumed["history"]] == [h["round"] for h in reference["history"]] == [0, 1]
    assert resumed["run_id"] == before["run_id"] != reference["run_id"]  # the same run, continued
    results = {
        name: json.loads(next(dep.kits.kit(dep.kits.server).rglob(f"prrfl/{name}/results.json")).read_text())
        for name in ("uninterrupted", "interrupted")
    }
    assert sorted(results["interrupted"]["sites"]) == sorted(results["uninterrupted"]["sites"]) == sorted(dep.kits.sites)
    for site in dep.kits.sites:
        # each site resumed from its own checkpoint (rolled back if it had finished the round the
        # server did not record): the same numbers as the uninterrupted run, each round once
        resumed_site, straight_site = site_results(dep, site, "interrupted"), site_results(dep, site, "uninterrupted")
        assert resumed_site["rounds_completed"] == 2 and resumed_site["rounds_missed"] == []
        assert untimed(resumed_site["history"]) == untimed(straight_site["history"])
        for key, value in reference["downloads"][site].params.items():
            assert torch.equal(resumed["downloads"][site].params[key], value), key


@pytest.mark.e2e
@pytest.mark.drill
def test_a_site_killed_mid_round_is_left_out_then_rejoins_from_its_checkpoint(deployment):
    """kill -9 of a site (its client and job processes) in round 1; the shipped deadline rule ("auto") and
    min_sites, with the deadline's floor at 20 s instead of 60 (the round is left out sooner, the rule is the same)."""
    dep = deployment
    lost = dep.kits.sites[1]
    kept = sorted(s for s in dep.kits.sites if s != lost)
    job = with_workflow_args(tiny_job(dep.root, "site_lost", num_rounds=3), dep.root / "lost", min_task_timeout=20.0)
    job_id = dep.sess.submit_job(str(job))
    wait_for(lambda: "round 1 (rounds 0-2): sending" in server_log(dep, job_id), 180, "round 2 to start")
    dep.kill(lost)
    try:
        checkpoint = torch.load(dep.kits.kit(lost) / "prrfl/site_lost/site_state.pt", weights_only=False)
        assert checkpoint["round_idx"] == 0, "the site finished round 1 before the kill; make rounds longer"
        wait_for(lambda: (server_state(dep, "site_lost") or {}).get("next_round", 0) >= 2, 540, "round 1 to finish without it")
        state = server_state(dep, "site_lost")
        assert [h["sites"] for h in state["history"]] == [sorted(dep.kits.sites), kept]
        log = server_log(dep, job_id)
        # the round ended at its own deadline (the 20 s floor: the round before took seconds), not FLARE's 600 s heartbeat
        deadline = re.search(
            r"round 1 \(rounds 0-2\): sending each of 3 sites its own model; deadline (\d+) s \(3 x the slowest round so far", log
        )
        assert deadline and int(deadline[1]) < 600, log[-3000:]
        assert f"round 1: no result from {lost}: no result within the deadline" in log
    finally:  # whatever failed above, the deployment's later tests need every site and no running job
        # FLARE 2.9 cannot add a restarted client to a running job: the site rejoins the resubmitted one
        dep.sess.abort_job(job_id)
        dep.start_site(lost)
        dep.wait_for_sites(timeout=60)
    # the resumed job's first round includes every site's start-up (a new job process loads its data and
    # checkpoint): back to the shipped 60 s floor, which allows for it
    _, status = dep.run_job(with_workflow_args(job, dep.root / "rejoin", resume=True, min_task_timeout=60.0), timeout=240)
    assert status == "FINISHED:COMPLETED"
    state = server_state(dep, "site_lost")
    assert [h["sites"] for h in state["history"]] == [sorted(dep.kits.sites), kept, sorted(dep.kits.sites)]
    rejoined = site_results(dep, lost, "site_lost")
    assert [h["round"] for h in rejoined["history"] if h["kind"] == "round"] == [0, 2]  # from its round-0 checkpoint
    assert rejoined["rounds_missed"] == [1] and site_results(dep, kept[0], "site_lost")["rounds_missed"] == []
    results = json.loads(next(dep.kits.kit(dep.kits.server).rglob("prrfl/site_lost/results.json")).read_text())
    assert results["sites"][lost]["participation"]["missed"] == [1] and not results["sites"][lost]["participation"]["stale"]


@pytest.mark.e2e
@pytest.mark.drill
def test_a_site_job_process_killed_while_its_client_runs_ends_the_job_and_a_resume_continues_it(deployment):
    """FLARE 2.9 itself fails the whole job when a site's job process exits abnormally while the site's
    FLARE client keeps running (the client reports the failure to the server). Nothing hangs, the state of
    the last completed round is intact, and the job re-submitted with resume continues with every site."""
    dep = deployment
    victim = dep.kits.sites[2]
    job = tiny_job(dep.root, "job_died", num_rounds=2)
    job_id = dep.sess.submit_job(str(job))
    wait_for(lambda: "round 1 (rounds 0-1): sending" in server_log(dep, job_id), 180, "round 2 to start")
    client = psutil.Process(dep.procs.procs[victim].pid)
    worker = next(p for p in client.children(recursive=True) if "nvflare.private.fed.app.client.worker_process" in p.cmdline())
    worker.kill()
    wait_for(lambda: dep.sess.get_job_meta(job_id).get("status", "").startswith("FINISHED"), 120, "FLARE to end the job")
    assert dep.sess.get_job_meta(job_id)["status"] != "FINISHED:COMPLETED"
    assert server_state(dep, "job_died")["next_round"] == 1  # round 0 kept, round 1 not recorded
    _, status = dep.run_job(with_workflow_args(job, dep.root / "after_job_died", resume=True), timeout=240)
    assert status == "FINISHED:COMPLETED"
    assert [h["sites"] for h in server_state(dep, "job_died")["history"]] == [sorted(dep.kits.sites)] * 2


@pytest.mark.e2e
@pytest.mark.drill
def test_a_site_frozen_mid_round_is_left_out_and_the_job_still_ends(deployment):
    """kill -STOP of a site's job process in round 0: the round ends at its deadline without it, the job
    completes its rounds and ends once FLARE stops waiting for that site's report (client_outcome_wait_timeout,
    60 s here), and FLARE's clean-up kills the frozen process; the deployment takes the next job."""
    dep = deployment
    frozen_site = dep.kits.sites[2]
    job = with_workflow_args(tiny_job(dep.root, "site_frozen", num_rounds=2), dep.root / "frozen", min_task_timeout=20.0)
    job_id = dep.sess.submit_job(str(job))
    wait_for(lambda: "round 0 (rounds 0-1): sending" in server_log(dep, job_id), 180, "round 1 to start")
    client = psutil.Process(dep.procs.procs[frozen_site].pid)
    worker = next(p for p in client.children(recursive=True) if "nvflare.private.fed.app.client.worker_process" in p.cmdline())
    worker.send_signal(signal.SIGSTOP)
    try:
        wait_for(lambda: dep.sess.get_job_meta(job_id).get("status", "").startswith("FINISHED"), 400, "the job to end")
        assert dep.sess.get_job_meta(job_id)["status"] == "FINISHED:COMPLETED"
        wait_for(lambda: not worker.is_running() or worker.status() == psutil.STATUS_ZOMBIE, 120, "the frozen process to be killed")
    finally:
        if worker.is_running():
            worker.send_signal(signal.SIGCONT)
    state = server_state(dep, "site_frozen")
    kept = sorted(s for s in dep.kits.sites if s != frozen_site)
    assert state["next_round"] == 2 and state["history"][-1]["sites"] == kept  # (round 0 may have been done already)
    assert f": no result from {frozen_site}: no result within the deadline" in job_log(dep, job_id)


@pytest.mark.e2e
@pytest.mark.drill
def test_a_site_with_corrupt_local_data_fails_at_start_and_the_others_train(deployment, tmp_path):
    dep = deployment
    broken = dep.kits.sites[1]
    healthy = sorted(s for s in dep.kits.sites if s != broken)
    cohort = json.loads((dep.kits.kit(broken) / "local/prrfl_site.json").read_text())["cohort"]
    prepared = ensure_synthetic_federation(
        dep.root / "cache",
        scale=TINY_DATA["synthetic_scale"],
        seed=0,
        raw_size=tuple(TINY_DATA["synthetic_raw_size"]),
        size=TINY_DATA["image_size"],
        heldout_min_per_class=TINY_DATA["heldout_min_per_class"],
    )
    data_root = tmp_path / "hospital_disk"
    shutil.copytree(prepared, data_root)
    bad_file = data_root / cohort / "train.npz"
    bad_file.write_bytes(bad_file.read_bytes()[:1000])  # a truncated copy
    write_site_config(dep.kits.kit(broken), broken, str(data_root), None)
    try:
        job_id, status = dep.run_job(tiny_job(dep.root, "bad_data", num_rounds=1), timeout=240)
    finally:
        write_site_config(dep.kits.kit(broken), broken, None, None)
    assert status == "FINISHED:COMPLETED"
    log = job_log(dep, job_id)
    assert f"{broken} cannot take part in this run: ValueError: cannot read prepared split {bad_file}" in log
    results = json.loads(next(dep.kits.kit(dep.kits.server).rglob("prrfl/bad_data/results.json")).read_text())
    assert sorted(results["sites"]) == healthy
    assert all(site_results(dep, site, "bad_data")["rounds_completed"] == 1 for site in healthy)


@pytest.mark.e2e
@pytest.mark.drill
def test_the_component_recipe_runs_on_the_deployment_through_prodenv(deployment, tmp_path, example_net):
    """`PersonalizedFedAvgRecipe` (a stock Client API script, PFA) submitted with FLARE's ProdEnv through the admin's
    startup kit: every client's personalized and best model saved on the server, as on SimEnv and PocEnv."""
    from nvflare.recipe import ProdEnv
    from test_component_recipe import CLIENT

    from prrfl.flare.components import FourierAggregator
    from prrfl.flare.components.recipe import PersonalizedFedAvgRecipe

    (tmp_path / "client.py").write_text(CLIENT)
    kit = deployment.kits.kit(deployment.kits.admin)
    recipe = PersonalizedFedAvgRecipe(
        name="components_prod",
        model=example_net(),
        train_script=str(tmp_path / "client.py"),
        num_rounds=2,
        min_clients=3,
        aggregator=FourierAggregator(),
    )
    run = recipe.execute(ProdEnv(startup_kit_location=str(kit), username=kit.name))
    result = run.get_result(timeout=240)
    assert run.get_status() == "FINISHED:COMPLETED"
    sites = sorted(deployment.kits.sites)
    assert sorted(p.name for p in Path(result).rglob("models/*.pt")) == sorted([f"{s}.pt" for s in sites] + [f"{s}.best.pt" for s in sites])


@pytest.mark.e2e
@pytest.mark.drill
def test_the_recipe_runs_unchanged_on_the_deployment_through_prodenv(deployment, capsys):
    """`prrfl run --env prod`: the job's recipe submitted with FLARE's ProdEnv through the admin's startup
    kit of this provisioned deployment (mTLS), followed to the end and its results downloaded."""
    dep = deployment
    kit = dep.kits.kit(dep.kits.admin)
    sets = ["--set=run_name=recipe_prod", "--set=num_rounds=2", "--set=local_epochs=1", f"--set=data={json.dumps(TINY_DATA)}"]
    assert prrfl(["run", "--env", "prod", "--startup-kit", str(kit), "--sites", "3", "--timeout", "240", *sets]) == 0
    out = capsys.readouterr().out
    assert "derm_prr on prod: FINISHED:COMPLETED; results in " in out and "| **mean** |" in out
    state = server_state(dep, "recipe_prod")
    assert [h["sites"] for h in state["history"]] == [sorted(dep.kits.sites)] * 2
