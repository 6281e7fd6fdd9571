"""`prrfl deploy poc` end to end: provisioned kits, a server and 2 site processes over gRPC + mTLS on
localhost, the job submitted and downloaded by the admin, everything stopped afterwards; and `prrfl run
--env poc`, the recipe on FLARE's PocEnv."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time

import pytest
import yaml
from conftest import our_processes, tiny_derm_config, untimed, wait_for
from test_recipe import TINY_SETS

from prrfl.flare import deployment
from prrfl.flare.deployment import POC_TEMPLATE, kill_process_tree, make_project
from prrfl.flare.job_recipe import export_job, server_results

SITES = ["vidir-modern", "vidir-molemax"]


def test_project_keeps_the_chosen_hospitals_their_admins_and_the_ports():
    project = make_project(POC_TEMPLATE, 2, 9101, 9102)
    parts = project["participants"]
    assert project["api_version"] == 3
    assert [p["name"] for p in parts if p["type"] == "client"] == SITES
    server = next(p for p in parts if p["type"] == "server")
    assert (server["fed_learn_port"], server["admin_port"]) == (9101, 9102)
    admins = {p["name"]: p["role"] for p in parts if p["type"] == "admin"}
    assert admins["admin@coordinator.org"] == "project_admin"
    assert "lead@msk.org" not in admins and admins["lead@molemax.org"] == "lead"


def test_templates_are_valid_project_files():
    for name in ("poc", "production"):
        project = yaml.safe_load((POC_TEMPLATE.parents[1] / name / "project.yml").read_text())
        roles = {p.get("role") for p in project["participants"] if p["type"] == "admin"}
        assert project["api_version"] == 3 and {"project_admin", "org_admin", "lead"} <= roles
        assert len([p for p in project["participants"] if p["type"] == "client"]) == 4


def test_free_ports_are_distinct_bindable_and_below_the_ports_the_os_hands_out():
    low, _ = deployment.ephemeral_range()
    ports = deployment.free_ports(20)
    assert len(set(ports)) == 20 and all(1024 <= p < low for p in ports)
    for p in ports:
        with socket.socket() as s:
            s.bind(("", p))


def test_listening_ports_sees_this_process_listen():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        assert s.getsockname()[1] not in deployment.listening_ports(os.getpid())
        s.listen()
        assert s.getsockname()[1] in deployment.listening_ports(os.getpid())


@pytest.mark.e2e
@pytest.mark.drill
def test_a_server_port_taken_before_the_server_binds_it_is_provisioned_again(tmp_path, monkeypatch, capsys):
    """FLARE's server runs on without a port another process took (gRPC only prints a line), and its sites
    would retry their login there for ever: the deployment sees the refusal and provisions other ports."""
    with socket.socket() as thief:
        thief.bind(("", 0))
        thief.listen()
        taken = thief.getsockname()[1]
        picks = iter([[taken, *deployment.free_ports(1)]])
        real = deployment.free_ports
        monkeypatch.setattr(deployment, "free_ports", lambda n: next(picks, None) or real(n))
        env = {"PRRFL_CACHE": os.environ["PRRFL_CACHE"]}  # the session's federations (conftest)
        with deployment.poc_deployment(tmp_path / "poc", 1, env=env) as dep:
            assert taken not in dep.kits.ports
            assert set(dep.kits.ports) <= deployment.listening_ports(dep.procs.procs["server"].pid)
            assert [c.name for c in dep.sess.get_system_info().client_info] == SITES[:1]
    out = capsys.readouterr().out
    assert f"could not listen on one of its ports [{taken}," in out and "provisioning again with other ports" in out
    assert out.count("provisioned ") == 2


def deploy_command(tmp_path, num_rounds: int = 2) -> tuple[list[str], dict[str, str], os.PathLike]:
    job = export_job("derm_prr", tmp_path / "jobs", cfg=tiny_derm_config(num_rounds=num_rounds))
    work = tmp_path / "poc"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}  # PRRFL_CACHE: the session's (conftest)
    cmd = [
        sys.executable,
        "-m",
        "prrfl.cli",
        "deploy",
        "poc",
        "--job",
        str(job),
        "--sites",
        "2",
        "--workdir",
        str(work),
        "--timeout",
        "240",
    ]
    return cmd, env, work


@pytest.mark.e2e
def test_deploy_poc_two_sites(tmp_path, capsys, tiny_derm_run):
    from test_results_layouts import printed_tables

    cmd, env, work = deploy_command(tmp_path)
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-6000:]
    assert "all 2 sites connected" in out and "round 1 (rounds 0-1)" in out and "| **mean** |" in out
    for site in SITES:
        assert re.search(rf"\| {site}_[A-D] \|", out), f"no results row of {site} (labelled with its cohort)"
        assert list((work / "result").rglob(f"tb_events/{site}_*/events.out.tfevents.*")), f"no TensorBoard events for {site}"
        # the site kept its state in its own workspace, with the cohort from its local config
        assert list(work.rglob(f"prod_00/{site}/prrfl/derm_prr/site_state.pt"))
    assert list((work / "result").rglob("tb_events/federation/events.out.tfevents.*")), "no federation run"
    assert not our_processes(str(work)), "FLARE processes left running"
    # the kits (server, sites, the admin's download) and result/ hold the same run: one table, the one printed
    ((title, table),) = printed_tables(work, capsys).items()
    assert title.startswith("derm_prr (run ") and f"{table}\n" in out and f"| {SITES[0]}_" in table

    # one seed per hospital: the simulator's site-1 and site-2 (the same job, tiny_derm_config() at 2 rounds, in
    # `nvflare simulator`) hold the same cohorts and train the same numbers
    sim, _ = tiny_derm_run
    for simulated, deployed in zip(("site-1", "site-2"), SITES):
        theirs = json.loads((sim / simulated / "prrfl/derm_prr/results.json").read_text())
        copies = [json.loads(p.read_text()) for p in work.rglob("results.json") if f"/{deployed}/" in str(p)]
        copies = [c for c in copies if c.get("site") == deployed]
        assert copies, f"no results.json of {deployed}"
        for ours in copies:
            assert ours["cohort"] == theirs["cohort"] and untimed(ours["history"]) == untimed(theirs["history"]), deployed


@pytest.mark.e2e
@pytest.mark.drill
def test_ctrl_c_mid_job_stops_every_process(tmp_path):
    cmd, env, work = deploy_command(tmp_path, num_rounds=50)
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    seen = []
    for line in proc.stdout:  # until the job runs
        seen.append(line)
        if "round 0 (rounds 0-49)" in line:
            break
    assert proc.poll() is None, "".join(seen)[-4000:]
    wait_for(lambda: our_processes(str(work)), 30, "the FLARE processes to be listed")  # there are some to stop
    proc.send_signal(signal.SIGINT)
    rest, _ = proc.communicate(timeout=90)
    assert proc.returncode == 130, ("".join(seen) + rest)[-4000:]
    assert "interrupted; all FLARE processes stopped" in rest
    deadline = time.time() + 10  # the processes are gone once deploy returns; allow the OS to reap them
    while our_processes(str(work)) and time.time() < deadline:
        time.sleep(0.5)
    assert not our_processes(str(work)), "FLARE processes left running"


def test_a_job_refused_for_its_signature_is_submitted_once_more(tmp_path, monkeypatch):
    """FLARE 2.9 now and then refuses a freshly signed job ("does not pass signature verification"): run_job
    submits it again once; any other failure, or a second refusal, is returned as it is."""
    kits = deployment.Kits(tmp_path, "server", ["a", "b"], "admin")
    (tmp_path / "server").mkdir()
    log = tmp_path / "server" / "log.txt"

    class Session:
        def __init__(self):
            self.submitted = 0

        def submit_job(self, job):
            self.submitted += 1
            return f"job{self.submitted}"

    def run(statuses, refused):
        dep = deployment.Deployment(kits)
        dep.sess, dep.signature_wait = Session(), 0.0
        finals = iter(statuses)
        monkeypatch.setattr(deployment, "follow_job", lambda sess, job_id, follower, procs, timeout: {"status": next(finals)})
        log.write_text(
            "".join(f"- Failed to run the Job ({j}): RuntimeError: app app does not pass signature verification\n" for j in refused)
        )
        return dep.run_job(tmp_path / "job", timeout=1), dep.sess.submitted

    assert run(["FINISHED:FAILED_TO_RUN", "FINISHED:COMPLETED"], ["job1"]) == (("job2", "FINISHED:COMPLETED"), 2)
    assert run(["FINISHED:FAILED_TO_RUN", "FINISHED:FAILED_TO_RUN"], ["job1", "job2"]) == (("job2", "FINISHED:FAILED_TO_RUN"), 2)
    assert run(["FINISHED:FAILED_TO_RUN"], []) == (("job1", "FINISHED:FAILED_TO_RUN"), 1)  # another reason: not retried
    assert run(["FINISHED:COMPLETED"], []) == (("job1", "FINISHED:COMPLETED"), 1)


@pytest.mark.e2e
def test_prrfl_run_on_pocenv_trains_every_site_and_stops_the_deployment(tmp_path, poc_workspace, flare_default_ports_held, capsys):
    """`prrfl run --env poc` while FLARE's default POC ports are taken (another FLARE POC on the machine): the
    deployment listens on ports of its own, trains every site and is stopped at the end."""
    from test_results_layouts import printed_tables

    poc = poc_workspace
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}  # PRRFL_CACHE: the session's (conftest)
    cmd = [sys.executable, "-m", "prrfl.cli", "run", "--env", "poc", "--sites", "2", "--timeout", "300", *TINY_SETS]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=500, cwd=tmp_path)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    (result,) = re.findall(r"derm_prr on poc: FINISHED:COMPLETED; results in (\S+)", out)
    # progress from the server's log of the job while it ran, not FLARE's monitor (the job's meta, a dot per poll)
    assert re.search(r"\[\d\d:\d\d:\d\d\] round 0 \(rounds 0-1\): sending each of 2 sites", out), out[-3000:]
    assert re.search(r"\[\d\d:\d\d:\d\d\] round 1 done", out) and "Job Meta" not in out and "Sending task" not in out
    sites = server_results(result)["sites"]  # the server workspace the admin downloaded
    assert {s: p["participation"]["aggregated"] for s, p in sites.items()} == {"site-1": [0, 1], "site-2": [0, 1]}
    for site in ("site-1", "site-2"):  # each site kept its state in its own POC workspace
        assert list(poc.rglob(f"prod_00/{site}/prrfl/derm_prr/site_state.pt")), site
    assert not our_processes(str(poc)), "POC processes left running"
    # the POC workspace holds the run three times (the server's and the sites' prrfl/ folders, the admin's download)
    ((title, table),) = printed_tables(poc, capsys).items()
    per_site = table.split("\n\nCross-site evaluation: ")[0]  # prrfl results adds FLARE's cross-site matrix
    assert title.startswith("derm_prr (run ") and f"\n\n{per_site}" in out


@pytest.mark.e2e
@pytest.mark.parametrize("moment", ["starting", "running"])
@pytest.mark.drill
def test_ctrl_c_of_prrfl_run_on_pocenv_returns_promptly_with_the_resume_line(tmp_path, poc_workspace, moment):
    """Ctrl-C of `prrfl run --env poc` mid-job (or while the job is still being submitted, on a loaded machine):
    every POC process is stopped and the command returns 130 with the line that says how to go on, rather than
    hanging on FLARE's connection retries or leaving the POC running."""
    import json as _json

    from conftest import TINY_DATA

    poc = poc_workspace
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}  # PRRFL_CACHE: the session's (conftest)
    sets = ["--set=num_rounds=50", "--set=local_epochs=1", f"--set=data={_json.dumps(TINY_DATA)}"]
    cmd = [sys.executable, "-m", "prrfl.cli", "run", "--env", "poc", "--sites", "2", "--timeout", "600", *sets]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=tmp_path)
    seen, rest, left = [], "", []
    try:
        if moment == "starting":  # the POC's server is up, the job not yet submitted or deployed
            wait_for(lambda: list(poc.rglob("prod_00/server/log.txt")), 240, "the POC server to start")
        else:
            for line in proc.stdout:  # until the job was submitted and runs
                seen.append(line)
                if "Submitted job" in line or "job id" in line.lower():
                    break
            wait_for(lambda: list(poc.rglob("prod_00/site-1/*/log.txt")), 240, "the job to run at site-1")
        proc.send_signal(signal.SIGINT)
        rest, _ = proc.communicate(timeout=240)  # at most 60 s (prrfl.cli.interrupt_deadline) + the POC stop: loaded-machine margin
    finally:
        if proc.poll() is None:
            kill_process_tree(proc.pid, grace=0)
        left = our_processes(str(poc))
        for p in left:  # never leave a POC behind for the next test, even when this one fails
            kill_process_tree(p.pid, grace=0)
    out = "".join(seen) + rest
    assert proc.returncode == 130, out[-4000:]
    assert "prrfl: interrupted" in out and "--resume auto" in out, out[-2000:]
    assert not left, "POC processes left running"
