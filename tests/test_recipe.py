"""The FLARE 2.9 recipe: every (task, method) job from one Recipe, the committed job folders its exports,
job.py and `prrfl run` on SimEnv (PocEnv: tests/test_deploy_poc.py; ProdEnv: tests/test_faults.py, on a
provisioned deployment)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import yaml
from conftest import TINY_DATA, tiny_derm_config, untimed
from nvflare.recipe import PocEnv, ProdEnv, SimEnv
from nvflare.recipe.spec import Recipe

from prrfl.config import ConfigError
from prrfl.flare.job_recipe import PACKAGE, PersonalizedRecipe, end_poc_processes, environment
from prrfl.flare.jobs import job_config, job_files

ROOT = Path(__file__).resolve().parents[1]
TINY_SETS = ["--set=num_rounds=2", "--set=local_epochs=1", f"--set=data={json.dumps(TINY_DATA)}"]


def test_a_recipe_is_any_task_and_method_or_a_job_of_the_table_with_overrides():
    recipe = PersonalizedRecipe(task="prostate", method="fedbn")
    assert isinstance(recipe, Recipe) and recipe.name == "prostate_fedbn"
    assert recipe.config == job_config("prostate_fedbn")  # the table's settings: Adam, batch 8, 10 rounds
    assert PersonalizedRecipe().config == job_config("derm_prr")
    paper = PersonalizedRecipe("derm_prr_paper", overrides={"num_rounds": 3, "data.image_size": 64, "method_args.det_split": "train"})
    assert (paper.name, paper.config.num_rounds, paper.config.local_epochs) == ("derm_prr_paper", 3, 5)
    assert paper.config.data == {**job_config("derm_prr_paper").data, "image_size": 64}  # the other data options kept
    assert paper.config.method_args == {"det_split": "train"}
    whole = PersonalizedRecipe("derm_custom", config=tiny_derm_config(run_name="mine"))
    assert (whole.name, whole.config.run_name) == ("derm_custom", "mine")


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"job": "derm_prr", "method": "fedbn"}, "give a job name or a task and a method, not both"),
        ({"job": "derm_nope"}, "unknown job 'derm_nope'; available: ['derm_apfl'"),
        ({"task": "prostate", "method": "fca"}, "job 'prostate_fca': config field 'method': method 'fca' cannot run on task 'prostate'"),
        ({"task": "derm", "method": "fedbm"}, "got 'fedbm' (did you mean 'fedbn'?)"),
        ({"overrides": {"method_args.det_enabled": "flase"}}, "option 'det_enabled' must be true or false, got 'flase'"),
        ({"overrides": {"lr": "abc"}}, "config field 'lr' must be a number, got 'abc'"),
        ({"overrides": {"lr.x": 1}}, "config field 'lr' holds no fields"),
        ({"config": {"num_rounds": 2}, "overrides": {"lr": 0.1}}, "give a whole config, or a job"),
        ({"privacy": "dp"}, "unknown privacy filter 'dp'; available: ['percentile', 'svt']"),
        ({"tracking": "wandb"}, "unknown tracking backend 'wandb'"),
        ({"workflow_args": {"task_timout": 60}}, "unknown workflow argument(s) ['task_timout'] (did you mean 'task_timeout'?)"),
        ({"task_request_interval": 0}, "task_request_interval must be a positive number of seconds, got 0"),
    ],
)
def test_a_bad_recipe_is_refused_when_it_is_built(kwargs, message):
    with pytest.raises(ConfigError) as e:
        PersonalizedRecipe(**kwargs)
    assert message in str(e.value)


def test_flares_export_of_the_recipe_is_the_committed_job_folder(tmp_path):
    PersonalizedRecipe(task="prostate", method="prr").export(str(tmp_path))  # FLARE's Recipe.export, as is
    assert job_files(tmp_path / "prostate_prr") == job_files(ROOT / "jobs" / "prostate_prr")


def test_a_site_waits_for_a_slow_starting_server_job_as_long_as_the_job_says(tmp_path):
    """FLARE reads the sites' wait for the server's job process (60 s unless the job says) from the job's client config:
    every job sets RUNNER_SYNC_TIMEOUT, read here the way a site's job process reads it."""
    from prrfl.flare.job_recipe import RUNNER_SYNC_TIMEOUT

    config = ROOT / "jobs" / "derm_prr" / "app" / "config" / "config_fed_client.json"
    code = (
        "import json, os, sys\n"
        "from nvflare.apis.fl_constant import SystemConfigs\n"
        "from nvflare.fuel.utils.app_config_utils import get_positive_float_var\n"
        "from nvflare.fuel.utils.config_service import ConfigService\n"
        "data = json.load(open(sys.argv[1]))\n"
        "for section in (data, {k: v for k, v in data.items() if k != 'max_runner_sync_timeout'}):\n"
        "    ConfigService.reset()\n"
        "    ConfigService.initialize(section_files={}, config_path=[os.path.dirname(sys.argv[1])])\n"
        "    ConfigService.add_section(section_name=SystemConfigs.APPLICATION_CONF, data=section)\n"
        "    print(get_positive_float_var('max_runner_sync_timeout', 60.0))\n"
    )
    out = subprocess.run([sys.executable, "-c", code, str(config)], capture_output=True, text=True, timeout=120, check=True)
    assert [float(v) for v in out.stdout.split()] == [RUNNER_SYNC_TIMEOUT, 60.0] and RUNNER_SYNC_TIMEOUT >= 300


def test_job_py_exports_with_flares_own_flags(tmp_path):
    """`python job.py --export --export-dir X`: FLARE consumes its flags, the recipe writes the folder."""
    out = tmp_path / "exported"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "job.py"), "--task", "derm", "--method", "fedbn", "--export", "--export-dir", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    exported, committed = job_files(out / "derm_fedbn"), job_files(ROOT / "jobs" / "derm_fedbn")
    # job.py asks FLARE to start the job only once every site of the task is connected
    assert exported.pop("meta.json")["min_clients"] == 4 and committed.pop("meta.json")["min_clients"] == 1
    assert exported == committed


def test_job_py_takes_config_fields_with_set_as_prrfl_run_does():
    spec = importlib.util.spec_from_file_location("job_script", ROOT / "job.py")
    job_script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(job_script)
    sets = ["--set", "num_rounds=2", "--set", "data.image_size=32", "--set=method_args.det_enabled=false"]
    recipe, _, sites = job_script.build_recipe(["--task", "prostate", "--method", "prr", *sets])
    assert (recipe.name, recipe.config.num_rounds, sites) == ("prostate_prr", 2, 5)
    assert recipe.config.data == {**job_config("prostate_prr").data, "image_size": 32}
    assert recipe.config.method_args["det_enabled"] is False
    for sets, message in [
        (["--set", "lr"], "--set expects KEY=VALUE, got 'lr'"),
        (["--set", "lr=abc"], "config field 'lr' must be a number"),
    ]:
        with pytest.raises(ConfigError, match=message):
            job_script.build_recipe(sets)


def test_job_py_ends_with_the_tables_prrfl_run_ends_with(tmp_path, monkeypatch, capsys):
    """After the run, job.py prints what `prrfl run` prints last: the per-site table and the cross-site matrix of
    the result (prrfl.flare.job_recipe.result_tables), not only where the result is."""
    spec = importlib.util.spec_from_file_location("job_script", ROOT / "job.py")
    job_script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(job_script)
    run = SimpleNamespace(get_job_id=lambda: "simulate_job", get_status=lambda: None, get_result=lambda clean_up: str(tmp_path))
    monkeypatch.setattr(job_script.PersonalizedRecipe, "execute", lambda self, env: run)
    monkeypatch.setattr(job_script, "result_tables", lambda result: f"TABLES OF {result}")
    monkeypatch.setattr(sys, "argv", ["job.py", "--workspace", str(tmp_path)])
    job_script.main()
    out = capsys.readouterr().out.strip().splitlines()
    assert out[-1] == f"TABLES OF {tmp_path}" and out[0].startswith(f"job simulate_job (derm_prr) on sim: done; results in {tmp_path}")


def test_cross_site_evaluation_is_the_second_server_workflow_unless_turned_off(tmp_path):
    def workflows(job: Path) -> list[tuple[str, str]]:
        server = json.loads((job / "app/config/config_fed_server.json").read_text())
        return [(w["id"], w["path"]) for w in server["workflows"]]

    job = PersonalizedRecipe(task="derm", method="fedbn").export_folder(tmp_path / "on")
    assert workflows(job) == [
        ("workflow", "prrfl.flare.server_workflow.PersonalizedWorkflow"),
        ("cross_site_eval", "prrfl.flare.cross_site.CrossSiteEvaluation"),
    ]
    client = json.loads((job / "app/config/config_fed_client.json").read_text())
    assert client["executors"][0]["executor"]["args"]["task_script_args"] == "--run-name derm_fedbn"  # where its best model is
    off = PersonalizedRecipe(task="derm", method="fedbn", cross_site_eval=False).export_folder(tmp_path / "off")
    assert workflows(off) == [("workflow", "prrfl.flare.server_workflow.PersonalizedWorkflow")]


def test_sites_ask_for_their_next_task_at_the_recipes_interval_through_flares_server_setting(tmp_path):
    def interval(job: Path) -> float:
        return json.loads((job / "app/config/config_fed_server.json").read_text())["server"]["task_request_interval"]

    assert interval(PersonalizedRecipe(task="derm", method="fedbn").export_folder(tmp_path / "default")) == 0.5
    assert interval(PersonalizedRecipe(task="derm", method="fedbn", task_request_interval=2).export_folder(tmp_path / "flare")) == 2


def test_privacy_filter_and_bundled_package_in_the_recipe(tmp_path):
    recipe = PersonalizedRecipe(task="derm", method="prr", privacy="percentile", bundle=True)
    job = recipe.export_folder(tmp_path)
    client = json.loads((job / "app/config/config_fed_client.json").read_text())
    (result_filter,) = client["task_result_filters"]
    assert result_filter["tasks"] == ["train"]
    assert result_filter["filters"][0]["path"] == "nvflare.app_common.filters.percentile_privacy.PercentilePrivacy"
    shipped = {p.relative_to(job / "app/custom/prrfl") for p in (job / "app/custom/prrfl").rglob("*.py")}
    assert shipped == {p.relative_to(PACKAGE) for p in PACKAGE.rglob("*.py")}  # the whole package, not a traced part
    assert not list(job.rglob("__pycache__"))
    assert (job / "app/custom/prrfl_site.py").exists()


def named(proc: subprocess.Popen, where: Path) -> None:
    """Wait until `proc`'s command line names `where`, as a POC's start-up loop has long done when its pid file is read:
    Popen returns once exec has begun, and for a moment after that the kernel shows an empty command line."""
    import psutil
    from conftest import wait_for

    wait_for(
        lambda: any(str(where) in part for part in psutil.Process(proc.pid).cmdline()), 10, f"process {proc.pid} to show its command line"
    )


def test_after_a_poc_job_every_poc_process_is_awaited_and_one_that_stays_is_ended(tmp_path):
    """FLARE's POC stop returns with the server down while a site's start-up loop may still be polling;
    `prrfl run --env poc` waits for it (no time limit reached here, however slow the machine) and ends
    what outlives the limit. Only processes naming the POC workspace are followed."""
    poc = tmp_path / "poc"
    site, server = poc / "example_project" / "prod_00" / "site-1", poc / "example_project" / "prod_00" / "server"
    site.mkdir(parents=True)
    server.mkdir()
    # a loop as sub_start.sh's (a single `sleep` would let bash exec it, dropping the path from the command line)
    loop = subprocess.Popen(["bash", "-c", "for i in 1 2 3 4 5; do sleep 0.2; done", str(site / "startup" / "sub_start.sh")])
    named(loop, poc)
    (site / "daemon_pid.fl").write_text(f"{loop.pid}\n")
    (server / "pid.fl").write_text(f"{os.getpid()}\n")  # a pid that is not the POC's (e.g. reused): never touched
    assert end_poc_processes(poc, timeout=300.0) == [] and loop.poll() is not None  # it ended by itself
    stays = subprocess.Popen(["bash", "-c", "while :; do sleep 1; done", str(site / "startup" / "sub_start.sh")])
    named(stays, poc)
    (site / "daemon_pid.fl").write_text(f"{stays.pid}\n")
    (site / "pid.fl").write_text("not a pid\n")
    assert end_poc_processes(poc, timeout=0.1) == [stays.pid]
    assert stays.poll() is not None  # ended and reaped (end_poc_processes waits for what it kills)


def test_environments_of_each_kind_and_their_refusals(tmp_path):
    sim = environment("sim", 3, tmp_path / "ws")
    assert isinstance(sim, SimEnv) and (sim.num_clients, sim.num_threads) == (3, 3)
    assert sim.workspace_root == str((tmp_path / "ws").resolve())
    assert environment("sim", 4, tmp_path, threads=2, gpu="0,0,0,0").gpu_config == "0,0,0,0"
    poc = environment("poc", 2, gpu="0,1")
    assert isinstance(poc, PocEnv) and (poc.num_clients, poc.gpu_ids) == (2, [0, 1])
    kit = tmp_path / "admin@hospital.org"
    (kit / "startup").mkdir(parents=True)
    prod = environment("prod", 4, startup_kit=kit)
    assert isinstance(prod, ProdEnv) and prod.username == "admin@hospital.org"
    for args, message in [
        (("prod", 4), "needs the admin's startup kit folder (--startup-kit)"),
        (("prod", 4, "ws", None, None, tmp_path), f"startup kit {tmp_path}: no startup/ folder in it"),
        (("k8s", 2), "unknown environment 'k8s'"),
        (("sim", 0), "sites must be at least 1"),
        (("sim", 2, tmp_path / "a b"), "has a space in its path, which FLARE's simulator cannot take"),
    ]:
        with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
            environment(*args)


def test_a_poc_listens_on_free_ports_of_its_own_never_on_flares_fixed_ones(tmp_path, monkeypatch, flare_default_ports_held):
    """FLARE's POC project with the sites site-1..N, its admins and builders, the server on two free ports chosen
    as it deploys (FLARE's 8002/8003 may belong to another POC on the machine: held here)."""
    from nvflare.tool.poc.poc_commands import get_fl_client_names, get_fl_server_name, get_proj_admin

    from prrfl.flare import job_recipe as recipe_module

    project = recipe_module.poc_project(3, 20001, 20002)
    (server,) = [p for p in project["participants"] if p["type"] == "server"]
    assert (server["name"], server["fed_learn_port"], server["admin_port"]) == ("server", 20001, 20002)
    assert get_fl_server_name(project) == "server" and get_fl_client_names(project) == ["site-1", "site-2", "site-3"]
    assert get_proj_admin(project) == "admin@nvidia.com" and project["builders"]
    seen = {}

    def deploy(env, job):  # what FLARE's PocEnv.deploy reads: the project file at project_conf_path
        seen.update(yaml.safe_load(Path(env.project_conf_path).read_text()))
        return "job-id"

    monkeypatch.setattr(PocEnv, "deploy", deploy)
    assert environment("poc", 2).deploy(None) == "job-id"
    (server,) = [p for p in seen["participants"] if p["type"] == "server"]
    ports = {server["fed_learn_port"], server["admin_port"]}
    assert len(ports) == 2 and not ports & {8002, 8003} and get_fl_client_names(seen) == ["site-1", "site-2"]


def test_the_poc_is_submitted_to_once_its_server_listens_however_slowly_it_starts(monkeypatch):
    """FLARE's PocEnv submits after a fixed pause and gives its admin session 10 s; a server slow to start (a loaded
    machine) is waited for on its admin port, once, and one that never listens is named."""
    import socket
    import threading

    from prrfl.flare import job_recipe as recipe_module

    sessions = []
    monkeypatch.setattr(PocEnv, "_get_session_manager", lambda self: sessions.append(self) or "session")
    env = environment("poc", 2)
    listener = socket.socket()
    listener.bind(("localhost", 0))
    env._admin_port = listener.getsockname()[1]
    threading.Timer(1.0, listener.listen).start()  # the server listens a second later
    assert env._get_session_manager() == "session" and env._get_session_manager() == "session" and len(sessions) == 2
    listener.close()
    env._admin_port, env.server_start_timeout = recipe_module.free_ports(1)[0], 0.5
    with pytest.raises(RuntimeError, match=r"the POC server in .* did not listen on its admin port \d+ within 0 s; see its server/log.txt"):
        env._get_session_manager()


@pytest.mark.parametrize("failure", [RuntimeError("cannot connect to server for 10 seconds"), KeyboardInterrupt()])
def test_a_poc_whose_start_or_submission_fails_is_stopped_and_the_cause_is_named(tmp_path, monkeypatch, failure):
    """The POC a failed start or submission (or Ctrl-C meanwhile) leaves is stopped: its server and sites never
    outlive `prrfl run --env poc`, and the error names the job and FLARE's reason."""
    from prrfl.errors import CommandFailed
    from prrfl.flare import job_recipe as recipe_module

    stopped = []
    monkeypatch.setattr(recipe_module, "stop_poc", stopped.append)
    recipe = PersonalizedRecipe(task="derm", method="fedavg")

    def run(env):
        raise failure

    monkeypatch.setattr(recipe, "run", run)
    env = environment("poc", 2)
    with pytest.raises(CommandFailed if isinstance(failure, RuntimeError) else KeyboardInterrupt) as caught:
        recipe_module.run_recipe(recipe, env)
    assert stopped == [env]
    if isinstance(failure, RuntimeError):
        assert str(caught.value) == "job derm_fedavg: cannot connect to server for 10 seconds"


def site_history(ws: Path, site: str, run: str = "derm_prr") -> list:
    return untimed(json.loads((ws / site / "prrfl" / run / "results.json").read_text())["history"])


def test_prrfl_run_refuses_a_simulator_workspace_another_job_is_running_in_before_it_is_emptied(tmp_path, capsys):
    from prrfl.cli import main
    from prrfl.flare.places import RunLock, simulator_lock_file

    ws = tmp_path / "derm_prr"
    (ws / "server").mkdir(parents=True)
    (ws / "server" / "log.txt").write_text("the running job's log")
    holder = RunLock(simulator_lock_file(ws)).acquire(run_name="derm_prr", run_id="0123456789ab")
    try:
        assert main(["run", "derm_prr", "--workspace", str(tmp_path), "--set", f"data={json.dumps(TINY_DATA)}"]) == 2
    finally:
        holder.release()
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"prrfl: error: job derm_prr: the simulator workspace {ws} is in use by run 0123456789ab")
    assert err[0].endswith("wait for that job to end, or give this one another workspace")
    assert (ws / "server" / "log.txt").read_text() == "the running job's log"  # the simulator never started


def test_prrfl_run_refuses_to_resume_another_runs_state_before_the_simulator_starts(tmp_path, capsys, monkeypatch):
    """A resume from a server state this job cannot continue ends in one line naming the state file and what
    differs, before the simulator starts (inside it, every site would fail and the command would end on
    "Simulation failed with return code 2")."""
    from prrfl.cli import main
    from prrfl.flare.job_recipe import recipe_config
    from prrfl.flare.server_workflow import STATE_FILE
    from prrfl.server.federation import ServerState
    from prrfl.storage import save_torch

    monkeypatch.setattr(PersonalizedRecipe, "run", lambda self, env: pytest.fail("the simulator was started"))
    state_file = tmp_path / "derm_prr.state" / "server" / "derm_prr" / STATE_FILE
    sites = [f"site-{i}" for i in (1, 2, 3, 4)]
    command = ["run", "derm_prr", "--workspace", str(tmp_path), "--resume", "true", "--set", f"data={json.dumps(TINY_DATA)}"]

    def refusal(config: dict, sites: list[str]) -> str:
        state = ServerState(run_id="0123456789ab", config=config, global_counts=[], site_counts=dict.fromkeys(sites, [1]), downloads={})
        save_torch(state.to_dict(), state_file)
        assert main(command) == 2
        (line,) = capsys.readouterr().err.strip().splitlines()
        return line

    _, other = recipe_config("derm_prr", None, None, None, {"data": TINY_DATA, "seed": 7})
    assert refusal(other.to_dict(), sites) == (
        f"prrfl: error: job derm_prr: cannot resume from {state_file}, the state of run 0123456789ab ('derm_prr'): the config "
        "differs from the saved run's in ['seed'] (seed: 7 saved, 0 now); only num_rounds may change"
    )
    _, same = recipe_config("derm_prr", None, None, None, {"data": TINY_DATA})
    assert refusal(same.to_dict(), ["hospital-a", "hospital-b"]).endswith(
        f"its sites ['hospital-a', 'hospital-b'] are not this job's: 0 of them among its clients {sites}, fewer than min_sites=majority (2)"
    )
    assert not (tmp_path / "derm_prr").exists()  # the simulator's workspace was never made


@pytest.mark.e2e
def test_prrfl_run_refuses_a_site_settings_file_the_simulator_would_delete(tmp_path, capsys):
    """A prrfl_site.json put beside local/ in a simulator workspace would be wiped by the simulator before any site
    reads it: `prrfl run` refuses before the simulator starts, naming the file and where it belongs, and keeps it."""
    from prrfl.cli import main

    job_ws = tmp_path / "ws" / "derm_prr"
    job_ws.mkdir(parents=True)
    settings = job_ws / "prrfl_site.json"
    settings.write_text('{"device": "cpu"}')
    assert main(["run", "derm_prr", "--workspace", str(tmp_path / "ws")]) == 2
    err = capsys.readouterr().err
    assert "holds ['prrfl_site.json'], which FLARE's simulator would delete before any site reads it" in err
    assert f"move it into {job_ws / 'local'}" in err and settings.read_text() == '{"device": "cpu"}'


def test_prrfl_run_on_simenv_gives_the_numbers_of_the_exported_job_in_the_simulator(tmp_path, capsys, tiny_derm_run):
    from test_results_layouts import printed_tables

    env = {**os.environ, "PYTHONUNBUFFERED": "1"}  # PRRFL_CACHE: the session's (conftest)
    cmd = [sys.executable, "-m", "prrfl.cli", "run", "derm_prr", "--sites", "2", "--workspace", str(tmp_path / "ws"), *TINY_SETS]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=400, cwd=tmp_path)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    assert f"derm_prr on sim: FINISHED:COMPLETED; results in {tmp_path / 'ws' / 'derm_prr'}" in out
    assert "| site-1_A | " in out and "| site-2_B | " in out and "| **mean** |" in out  # each site by its label
    assert (tmp_path / "ws" / "derm_prr.state" / "server" / "derm_prr" / "server_state.pt").exists()
    ((title, table),) = printed_tables(tmp_path / "ws", capsys).items()  # <workspace>/<job>/ and <job>.state/: one run
    assert title.startswith("derm_prr (run ") and title.endswith(f"{tmp_path}/ws/derm_prr/server/simulate_job/results.json")
    per_site, matrix = table.split("\n\nCross-site evaluation: ")  # prrfl results adds FLARE's cross-site matrix
    assert f"\n\n{per_site}" in out and "| site-1_A's model |" in matrix  # the table `prrfl run` printed

    ref, _ = tiny_derm_run  # the same job exported (tiny_derm_config()) and run by `nvflare simulator` on 2 sites
    for site in ("site-1", "site-2"):
        assert site_history(tmp_path / "ws" / "derm_prr", site) == site_history(ref, site), site
    mine = torch.load(tmp_path / "ws/derm_prr.state/server/derm_prr/server_state.pt", weights_only=False)
    theirs = torch.load(ref.with_name("ws.state") / "server/derm_prr/server_state.pt", weights_only=False)
    for site in ("site-1", "site-2"):
        for key, value in theirs["downloads"][site].params.items():
            assert torch.equal(mine["downloads"][site].params[key], value), (site, key)
