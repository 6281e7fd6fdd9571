"""Faults on a real (POC) deployment: a server killed mid-job, a site killed mid-round.

One deployment (server + 2 sites, tiny images) serves both tests. Plus the resume rule itself.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import torch

from prrfl.config import RunConfig
from prrfl.deploy import poc_deployment, with_workflow_args
from prrfl.flare.jobs import export_job, job_config
from prrfl.flare.workflow import STATE_FILE, resume_problem

TINY_DATA = {"image_size": 32, "synthetic_scale": 0.02, "synthetic_raw_size": [96, 72]}


def test_resume_rule_only_lets_num_rounds_grow():
    saved = RunConfig.from_dict({**job_config("derm_prr").to_dict(), "num_rounds": 2}).to_dict()
    assert resume_problem(saved, saved, next_round=1) is None
    assert resume_problem(saved, {**saved, "num_rounds": 5}, next_round=2) is None  # extend a finished run
    assert "already completed" in resume_problem(saved, {**saved, "num_rounds": 1}, next_round=2)
    assert "['lr']" in resume_problem(saved, {**saved, "lr": 0.5}, next_round=1)


def tiny_job(root: Path, run_name: str, **overrides) -> Path:
    cfg = {**job_config("derm_prr").to_dict(), "run_name": run_name, "num_rounds": 2, "local_epochs": 1, "data": TINY_DATA, **overrides}
    return export_job("derm_prr", root / run_name, cfg=RunConfig.from_dict(cfg))


def server_state(dep, run_name: str) -> dict | None:
    path = dep.kits.kit(dep.kits.server) / "prrfl" / run_name / STATE_FILE
    return torch.load(path, weights_only=False) if path.exists() else None  # written atomically


def server_log(dep) -> str:
    return "".join(p.read_text(errors="replace") for p in dep.kits.kit(dep.kits.server).rglob("log.txt"))


def job_log(dep, job_id: str) -> str:
    """The server log of a finished job, as the admin downloads it (FLARE moves the live one away)."""
    return "".join(p.read_text(errors="replace") for p in Path(dep.sess.download_job_result(job_id)).rglob("log.txt"))


def wait_for(condition, timeout: float, what: str) -> None:
    deadline = time.time() + timeout
    while not condition():
        assert time.time() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


@pytest.fixture(scope="module")
def deployment(tmp_path_factory):
    root = tmp_path_factory.mktemp("faults")
    env = {"PRRFL_CACHE": str(root / "cache")}
    with poc_deployment(root / "poc", 2, env=env) as dep:
        dep.root = root
        yield dep


@pytest.mark.e2e
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
    results = {name: json.loads(next(dep.kits.kit(dep.kits.server).rglob(f"prrfl/{name}/results.json")).read_text())
               for name in ("uninterrupted", "interrupted")}
    assert sorted(results["interrupted"]["sites"]) == sorted(results["uninterrupted"]["sites"]) == sorted(dep.kits.sites)
    for site in dep.kits.sites:  # each site resumed from its own checkpoint: two rounds, not one or three
        site_results = json.loads((dep.kits.kit(site) / "prrfl/interrupted/results.json").read_text())
        assert site_results["rounds_completed"] == 2
        assert set(results["interrupted"]["sites"][site]) == set(results["uninterrupted"]["sites"][site])


@pytest.mark.e2e
def test_a_site_killed_mid_round_leaves_the_others_to_finish(deployment):
    dep = deployment
    lost, kept = dep.kits.sites[1], dep.kits.sites[0]
    job = with_workflow_args(tiny_job(dep.root, "site_lost", num_rounds=1, min_sites=1), dep.root / "timeout", task_timeout=15)
    job_id = dep.sess.submit_job(str(job))
    wait_for(lambda: "round 1/1: sending" in server_log(dep), 180, "round 1 to start")
    dep.kill(lost)
    results = dep.kits.kit(dep.kits.server) / "prrfl/site_lost/results.json"
    wait_for(results.exists, 120, "the workflow to finish its round without the lost site")
    state = server_state(dep, "site_lost")
    assert state["next_round"] == 1 and state["history"][0]["sites"] == [kept]
    assert sorted(json.loads(results.read_text())["sites"]) == [kept]
    live_log = dep.kits.kit(dep.kits.server) / job_id / "log.txt"
    assert f"no result from {lost}" in live_log.read_text(errors="replace")
    # FLARE keeps the job open until the dead client's heartbeat times out; the site comes back instead
    dep.start_site(lost)
    dep.wait_for_sites(timeout=60)
    dep.sess.abort_job(job_id)  # (or wait for FLARE's heartbeat timeout to end it)
