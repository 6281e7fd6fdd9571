"""Every prrfl job as one NVIDIA FLARE 2.9 Recipe, run unchanged on SimEnv, PocEnv and ProdEnv.

    from nvflare.recipe import SimEnv
    from prrfl.flare.job_recipe import PersonalizedRecipe

    recipe = PersonalizedRecipe(task="derm", method="prr")          # or job="derm_prr_paper", overrides={...}
    run = recipe.execute(SimEnv(num_clients=4, workspace_root="workspace"))
    print(run.get_result())

The recipe builds one server app (PersonalizedWorkflow, then FLARE's cross-site evaluation of the
sites' best models, prrfl.flare.cross_site, + a tracking receiver, prrfl.flare.tracking) and one client
app (the Client API script prrfl_site.py + the event converter that streams each site's scalars to the
server), deployed to every site. `recipe.export(<dir>)` writes the job folder that
`nvflare simulator` and `nvflare job submit` take; the committed folders under jobs/ are such exports
(`prrfl jobs export`, and `prrfl jobs check` fails when they differ from what the recipe writes).

The sites import prrfl from their installation (pip install -e . on every machine, the clean route);
bundle=True ships the whole package in the job's custom/ folder instead, for sites that cannot install it.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import io
import json
import logging
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
import weakref
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psutil
from nvflare.apis.analytix import ANALYTIC_EVENT_TYPE
from nvflare.apis.dxo import DataKind
from nvflare.apis.fl_constant import ConfigVarName
from nvflare.app_common.executors.client_api_executor import ClientAPIExecutor
from nvflare.app_common.filters.percentile_privacy import PercentilePrivacy
from nvflare.app_common.filters.svt_privacy import SVTPrivacy
from nvflare.app_common.widgets.convert_to_fed_event import ConvertToFedEvent
from nvflare.client.config import ExchangeFormat
from nvflare.job_config.api import FedJob
from nvflare.job_config.file_source import FileSource
from nvflare.recipe.poc_env import PocEnv
from nvflare.recipe.spec import ExecEnv, Recipe

from prrfl.config import ConfigError, RunConfig, unknown_names_error
from prrfl.errors import CommandFailed
from prrfl.flare import places
from prrfl.flare.cross_site import COMPONENT_ID as CROSS_SITE_ID
from prrfl.flare.cross_site import CrossSiteEvaluation
from prrfl.flare.deployment import free_ports, kill_process_trees
from prrfl.flare.failure import failure_lines
from prrfl.flare.job_log import JobLogFollower, poc_server_log
from prrfl.flare.jobs import JOBS, job_values
from prrfl.flare.liveness import SIMULATOR_WORKER
from prrfl.flare.server_workflow import STATE_FILE, PersonalizedWorkflow, resume_refusal
from prrfl.flare.task_protocol import TASK_TRAIN
from prrfl.flare.tracking import RECEIVER_ID, TRACKING, receiver
from prrfl.registry import validate_job
from prrfl.server.federation import ServerState
from prrfl.storage import load_torch

if TYPE_CHECKING:
    from nvflare.recipe import SimEnv

SITE_SCRIPT = Path(__file__).parent / "entry" / "prrfl_site.py"
PACKAGE = Path(__file__).resolve().parents[1]

# FLARE's privacy filters, applied by each site to its train result (a weight difference) before it
# leaves the site, and only to weight differences (on full weights they would wreck the model);
# FLARE's default arguments otherwise, to be tuned per job in app/config/config_fed_client.json.
PRIVACY_FILTERS = {
    # share only the largest 90 % of |diff|, each clipped to 0.01
    "percentile": functools.partial(PercentilePrivacy, data_kinds=[DataKind.WEIGHT_DIFF]),
    # differential privacy by the sparse vector technique: a noisy 10 % of the diff
    "svt": functools.partial(SVTPrivacy, data_kinds=[DataKind.WEIGHT_DIFF]),
}

# How long a site's job process waits for the server's job process to answer before it gives up (FLARE's
# `max_runner_sync_timeout` of the job's client config, 60 s by default). The server's job process imports torch, MONAI and prrfl before it
# answers; on a loaded machine that took 85 s, and every site then ended the job before its first task.
RUNNER_SYNC_TIMEOUT = 600.0

log = logging.getLogger(__name__)


def recipe_config(
    job: str | None,
    task: str | None,
    method: str | None,
    config: RunConfig | Mapping[str, Any] | None,
    overrides: Mapping[str, Any] | None,
) -> tuple[str, RunConfig]:
    """(job name, validated config) of a recipe. A job from the table (`job`, or `<task>_<method>`),
    with `overrides` (dotted keys: {"data.image_size": 128}) applied; or a whole `config`."""
    if config is not None:
        if task or method or overrides:
            raise ConfigError("give a whole config, or a job (or a task and a method) with overrides, not both")
        values = config.to_dict() if isinstance(config, RunConfig) else dict(config)
        name = job or values.get("run_name") or RunConfig().run_name
        return name, validate_job(name, values)
    if job and (task or method):
        raise ConfigError(f"give a job name or a task and a method, not both (job={job!r}, task={task!r}, method={method!r})")
    name = job or f"{task or 'derm'}_{method or 'prr'}"
    if name not in JOBS and job:
        raise ConfigError(f"unknown job '{name}'; available: {sorted(JOBS)}")
    # a (task, method) pair with no job of its own is validated as such: the error says why (an unknown
    # name, with a suggestion, or a method that cannot run on the task)
    base = JOBS.get(name) or {"task": task or "derm", "method": method or "prr"}
    return name, validate_job(name, job_values(name, base, overrides or {}))


class PersonalizedRecipe(Recipe):
    """A prrfl job (a task, a method and their settings) as a FLARE 2.9 recipe.

    job: a job of the table (prrfl.flare.jobs.JOBS: `<task>_<method>` and the papers' settings such
    as `derm_prr_paper`); or task and method (default derm, prr). overrides: config fields to change,
    dotted keys reaching nested options ({"num_rounds": 50, "method_args.det_split": "train"}).
    config: a whole RunConfig (or its dict) instead. The config is validated here, so a bad recipe is
    refused before any environment starts (prrfl.registry.validate_config).
    name: the FLARE job name (default: the job's). min_clients: sites that must be connected for FLARE
    to start the job (the workflow's own min_sites rule decides each round).
    privacy: one of PRIVACY_FILTERS, applied to every site's upload. resume: the workflow's resume mode
    (False, True or "auto"). workflow_args: further PersonalizedWorkflow arguments (state_dir,
    task_timeout, ...). tracking, tracking_uri: "tensorboard" or "mlflow" (prrfl.flare.tracking).
    cross_site_eval: after training, every site scores every site's best model on its own test split
    (prrfl.flare.cross_site; the matrix in the server's run folder). bundle: ship the prrfl package in
    the job's custom/ folder. task_request_interval: seconds a site waits before asking the server for
    its next task (FLARE's server setting of that name, default 2 s there): every round and every
    cross-site step starts at the sites' next request, and a few sites asking twice a second is no load.
    """

    def __init__(
        self,
        job: str | None = None,
        *,
        task: str | None = None,
        method: str | None = None,
        overrides: Mapping[str, Any] | None = None,
        config: RunConfig | Mapping[str, Any] | None = None,
        name: str | None = None,
        min_clients: int = 1,
        privacy: str | None = None,
        resume: bool | str = False,
        workflow_args: Mapping[str, Any] | None = None,
        tracking: str = "tensorboard",
        tracking_uri: str | None = None,
        cross_site_eval: bool = True,
        bundle: bool = False,
        task_request_interval: float = 0.5,
    ):
        job_name, self.config = recipe_config(job, task, method, config, overrides)
        if privacy is not None and privacy not in PRIVACY_FILTERS:
            raise ConfigError(f"unknown privacy filter '{privacy}'; available: {sorted(PRIVACY_FILTERS)}")
        if tracking not in TRACKING:
            raise ConfigError(f"unknown tracking backend '{tracking}'; available: {list(TRACKING)}")
        workflow_args = dict(workflow_args or {})
        known = [p for p in inspect.signature(PersonalizedWorkflow).parameters if p not in ("config", "resume")]
        if set(workflow_args) - set(known):
            raise unknown_names_error("workflow argument", set(workflow_args) - set(known), known)
        fed = FedJob(name=name or job_name, min_clients=min_clients)
        fed.set_app_packages(["prrfl"])  # imported from the installation (or the bundle), never traced file by file
        if not task_request_interval > 0:
            raise ConfigError(f"task_request_interval must be a positive number of seconds, got {task_request_interval!r}")
        fed.to_server({"server": {"task_request_interval": task_request_interval}})
        self.workflow = PersonalizedWorkflow(config=self.config.to_dict(), resume=resume, **workflow_args)
        if self.workflow.refusal:
            raise ConfigError(self.workflow.refusal)
        fed.to_server(self.workflow, id="workflow")
        if cross_site_eval:
            fed.to_server(CrossSiteEvaluation(), id=CROSS_SITE_ID)
        fed.to_server(receiver(tracking, tracking_uri, experiment=self.config.run_name), id=RECEIVER_ID)
        # ScriptRunner's executor, with the script shipped as a file source: ScriptRunner itself wants the
        # script under the current directory, and a recipe must build from anywhere
        fed.to_clients(
            ClientAPIExecutor(
                execution_mode="in_process",
                task_script_path=SITE_SCRIPT.name,
                task_script_args=f"--run-name {self.config.run_name}",  # where the site finds its best model
                params_exchange_format=ExchangeFormat.PYTORCH,
                server_expected_format=ExchangeFormat.PYTORCH,
            )
        )
        fed.to_clients(FileSource(str(SITE_SCRIPT)))
        fed.to_clients({ConfigVarName.MAX_RUNNER_SYNC_TIMEOUT: RUNNER_SYNC_TIMEOUT})
        fed.to_clients(ConvertToFedEvent(events_to_convert=[ANALYTIC_EVENT_TYPE]), id="event_to_fed")
        if bundle:
            package = self._clean_package_copy()
            fed.to_server(FileSource(package, dest_dir="prrfl"))
            fed.to_clients(FileSource(package, dest_dir="prrfl"))
        super().__init__(fed)
        if privacy:
            self.add_client_output_filter(PRIVACY_FILTERS[privacy](), tasks=[TASK_TRAIN])

    def _clean_package_copy(self) -> str:
        """The prrfl package without byte-code caches, in a folder removed with the recipe."""
        folder = tempfile.mkdtemp(prefix="prrfl_bundle_")
        weakref.finalize(self, shutil.rmtree, folder, True)
        target = Path(folder) / "prrfl"
        shutil.copytree(PACKAGE, target, ignore=shutil.ignore_patterns("__pycache__"))
        return str(target)

    def export_folder(self, out_root: str | Path, env: ExecEnv | None = None) -> Path:
        """Write <out_root>/<job name>/ (meta.json, app/config, app/custom), replacing an old one
        only once the new one is complete."""
        out_root = Path(out_root).resolve()
        out_root.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=out_root, prefix=".export-") as tmp:
            self.export(tmp, env=env)
            target = out_root / self.name
            if target.exists():
                shutil.rmtree(target)
            (Path(tmp) / self.name).rename(target)
        return target


def export_job(
    name: str,
    out_root: str | Path,
    cfg: RunConfig | None = None,
    min_clients: int = 1,
    bundle: bool = False,
    privacy: str | None = None,
    resume: bool | str = False,
    tracking: str = "tensorboard",
    tracking_uri: str | None = None,
    cross_site_eval: bool = True,
) -> Path:
    """The job `name` (with the config cfg, default the table's) exported as <out_root>/<name>/ by its
    recipe (PersonalizedRecipe); the arguments are the recipe's."""
    recipe = PersonalizedRecipe(
        name,
        config=cfg,
        min_clients=min_clients,
        bundle=bundle,
        privacy=privacy,
        resume=resume,
        tracking=tracking,
        tracking_uri=tracking_uri,
        cross_site_eval=cross_site_eval,
    )
    return recipe.export_folder(out_root)


# ----- environments ------------------------------------------------------------------------
ENVIRONMENTS = ("sim", "poc", "prod")


def poc_project(num_sites: int, fl_port: int, admin_port: int) -> dict[str, Any]:
    """FLARE's own POC project (server "server", sites site-1..site-N, its admins and builders) listening on the
    given ports instead of FLARE's fixed 8002/8003."""
    import yaml
    from nvflare.lighter.provision import gen_default_project_config
    from nvflare.tool.poc.poc_commands import update_clients, update_server_name

    with tempfile.TemporaryDirectory() as tmp:
        gen_default_project_config("dummy_project.yml", f"{tmp}/project.yml")
        project = yaml.safe_load(Path(tmp, "project.yml").read_text())
    project = update_clients([], num_sites, update_server_name(project))
    for participant in project["participants"]:
        if participant["type"] == "server":
            participant.update(fed_learn_port=fl_port, admin_port=admin_port)
    return project


class FreePortPocEnv(PocEnv):
    """FLARE's PocEnv on two free ports chosen when it deploys. FLARE's POC always listens on 8002 and 8003, where
    another FLARE POC on the same machine (a FLARE user's machine often has one) makes the server fail to start
    and the sites talk to the other deployment."""

    server_start_timeout: float = 180.0  # seconds the POC server may take to listen, on a loaded machine

    def deploy(self, job):
        import yaml

        fl_port, self._admin_port = free_ports(2)
        with tempfile.TemporaryDirectory() as tmp:  # FLARE copies it into its POC workspace as it provisions
            self.project_conf_path = str(Path(tmp, "project.yml"))
            Path(self.project_conf_path).write_text(
                yaml.safe_dump(poc_project(self.num_clients, fl_port, self._admin_port), sort_keys=False)
            )
            return super().deploy(job)

    def _get_session_manager(self):
        """FLARE's admin session, once the POC server listens on its admin port. FLARE submits the job after a fixed
        pause and gives its session 10 s, which a server that starts slowly (a loaded machine) misses: "cannot
        connect to server for 10 seconds"."""
        port = getattr(self, "_admin_port", None)
        if port is not None:
            self._admin_port = None  # waited for once, after the start: later calls (status, stop) do not wait
            wait_for_port(port, self.server_start_timeout, f"the POC server in {self.poc_workspace}")
        return super()._get_session_manager()


def wait_for_port(port: int, timeout: float, what: str) -> None:
    """Until something accepts TCP connections on localhost:port; a RuntimeError naming `what` after timeout s."""
    import socket
    import time

    deadline = time.monotonic() + timeout
    while True:
        try:
            with socket.create_connection(("localhost", port), timeout=1.0):
                return
        except OSError:
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"{what} did not listen on its admin port {port} within {timeout:.0f} s; see its server/log.txt"
                ) from None
            time.sleep(0.5)


def environment(
    kind: str,
    sites: int,
    workspace: str | Path = "workspace",
    threads: int | None = None,
    gpu: str | None = None,
    startup_kit: str | Path | None = None,
    username: str | None = None,
) -> ExecEnv:
    """FLARE's execution environment of that kind, for a recipe to run on.

    sim: SimEnv, `sites` simulated sites named site-1..site-N in <workspace>/<job name> (threads: sites
    run at once, default all; gpu: e.g. "0,0,0,0"). poc: PocEnv, a proof-of-concept deployment of `sites`
    sites on this machine, prepared and started by FLARE in its POC workspace (NVFLARE_POC_WORKSPACE;
    gpu: e.g. "0,1"). prod: ProdEnv, the running deployment whose admin startup kit is `startup_kit`
    (username: the admin, default the kit folder's name, which provisioning names after the admin)."""
    from nvflare.recipe import ProdEnv, SimEnv

    if kind not in ENVIRONMENTS:
        raise ConfigError(f"unknown environment '{kind}'; available: {list(ENVIRONMENTS)}")
    if kind == "prod":
        if not startup_kit:
            raise ConfigError("the prod environment needs the admin's startup kit folder (--startup-kit)")
        kit = Path(startup_kit).resolve()
        if not (kit / "startup").is_dir():
            raise ConfigError(f"startup kit {kit}: no startup/ folder in it; give the admin's provisioned kit folder")
        return ProdEnv(startup_kit_location=str(kit), username=username or kit.name)
    if sites < 1:
        raise ConfigError(f"sites must be at least 1, got {sites}")
    gpus = [int(g) for g in gpu.split(",")] if gpu else None
    if kind == "poc":
        return FreePortPocEnv(num_clients=sites, gpu_ids=gpus)
    root = Path(workspace).resolve()
    if any(c.isspace() for c in str(root)):  # FLARE 2.9's simulator passes the path on a command line it splits on spaces
        raise ConfigError(
            f"the simulator workspace {str(root)!r} has a space in its path, which FLARE's simulator cannot take (it splits "
            "its arguments on spaces); choose a --workspace whose full path has none"
        )
    return SimEnv(num_clients=sites, num_threads=threads or sites, gpu_config=gpu, workspace_root=str(root))


def server_results_path(result: str | Path) -> Path:
    """The workflow's results.json in a job's result: a simulator workspace (server/simulate_job/) or
    the server workspace an admin downloads."""
    root = Path(result)
    simulated = root / "server" / "simulate_job" / "results.json"
    found = [simulated] if simulated.exists() else sorted(root.rglob("results.json"))
    if not found:
        raise FileNotFoundError(f"{root}: the job left no results.json; see its server log (log.txt)")
    return found[0]


def server_results(result: str | Path) -> dict[str, Any]:
    """The workflow's results.json in a job's result, read (server_results_path)."""
    return json.loads(server_results_path(result).read_text())


def result_tables(result: str | Path) -> str:
    """The per-site results table and the cross-site matrix of a finished job's result folder, as `prrfl results`
    prints them (what `prrfl run` and job.py end with)."""
    from prrfl.report import server_run

    return server_run(server_results_path(result), server_results(result)).table()


def end_poc_processes(poc_workspace: str | Path, timeout: float = 30.0) -> list[int]:
    """Wait until every process of a POC deployment has ended; end those still there after timeout seconds.

    FLARE's POC stop returns once the server is down. Each participant runs under a start-up loop
    (startup/sub_start.sh, its pid in daemon_pid.fl, its FLARE process's in pid.fl) that sees its process
    gone only at its next 5 s poll, so a site's loop can outlive the stop by several seconds. A pid is
    only followed while its command line names the POC workspace (a pid file left behind may name a
    reused pid). Those still there are killed with their descendants. Returns the pids that had to be ended."""
    root = str(Path(poc_workspace).resolve())
    procs = []
    for pid_file in sorted(Path(root).glob("*/prod_*/*/*pid.fl")):
        try:
            proc = psutil.Process(int(pid_file.read_text().strip()))
            if any(root in part for part in proc.cmdline()):
                procs.append(proc)
        except (OSError, ValueError, psutil.Error):  # removed, unreadable or ended meanwhile
            continue
    _, left = psutil.wait_procs(procs, timeout=timeout)
    kill_process_trees([p.pid for p in left], grace=0)
    return [p.pid for p in left]


def stop_poc(env: ExecEnv) -> None:
    """A PocEnv's deployment stopped (FLARE's stop, then every process of it ended: `end_poc_processes`);
    nothing for another environment."""
    if isinstance(env, PocEnv):
        try:
            env.stop(clean_up=False)
        except Exception as e:  # noqa: BLE001 - the processes are ended below whatever FLARE's stop did
            log.warning("FLARE's POC stop failed (%s); ending its processes", e)
        end_poc_processes(env.poc_workspace)


@contextlib.contextmanager
def quiet_monitor(follower: JobLogFollower | None) -> Iterator[None]:
    """While FLARE's job monitor waits: the job's progress from its server log on the console (`follower`), and the
    monitor's own prints (the job's meta, a dot per poll) kept off it. Nothing changes without a follower."""
    if follower is None:
        yield
        return
    follower.out = sys.stdout
    follower.start()
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            yield
    finally:
        follower.stop()


@contextlib.contextmanager
def interrupts() -> Iterator[list[int]]:
    """A list that gets the signal's number when SIGINT (Ctrl-C) or SIGTERM arrives while the block runs; the
    signal is then handled by the handler there was (`prrfl run`: prrfl.cli.interrupt_deadline; SIGINT: Python
    raises KeyboardInterrupt). A SIGTERM without a handler of its own raises KeyboardInterrupt too, once, rather
    than end the process at once and leave the simulator or the POC it started running; an ignored SIGTERM stays
    ignored. Outside the main thread signals cannot be watched: the list stays empty."""
    seen: list[int] = []
    if threading.current_thread() is not threading.main_thread():
        yield seen
        return
    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    if previous[signal.SIGTERM] == signal.SIG_IGN:
        del previous[signal.SIGTERM]

    def record(signum: int, frame: Any) -> None:
        seen.append(signum)
        handler = previous[signum]
        if callable(handler):
            handler(signum, frame)
        elif signum == signal.SIGTERM and seen.count(signum) == 1:
            raise KeyboardInterrupt

    for sig in previous:
        signal.signal(sig, record)
    try:
        yield seen
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


SIMULATOR_MAIN = "nvflare.private.fed.app.simulator.simulator"  # the module of FLARE's simulator command


def end_simulator_processes(workspace: str | Path) -> list[int]:
    """Every process of FLARE's simulator on `workspace` (the simulator, its forks, the sites' processes: those
    whose command line runs FLARE's simulator or its worker and names the workspace or a folder in it) killed with
    its descendants and waited for. FLARE kills the simulator's processes when a Ctrl-C or SIGTERM interrupts it,
    but does not wait for them, and misses one it starts at that moment. Returns the pids that were still there."""
    root = str(Path(workspace).resolve())
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        cmd = proc.info["cmdline"] or []
        flare = SIMULATOR_MAIN in cmd or SIMULATOR_WORKER in cmd
        if flare and proc.pid != os.getpid() and any(part == root or part.startswith(root + os.sep) for part in cmd):
            found.append(proc.pid)
    kill_process_trees(found, grace=0)
    return found


def end_interrupted_run(env: ExecEnv, name: str, signals: list[int]) -> None:
    """After `signals` interrupted the job `name` on `env`, no process of it is left: the simulator's are ended
    (end_simulator_processes); a SIGTERM ends a POC's at once (end_poc_processes without waiting for them to stop
    by themselves: a SIGTERM sent to the command alone reaches none of them, and its sender expects the command to end
    within seconds), while a Ctrl-C keeps its way (stop_poc, end_poc_processes). Nothing when no signal came, nor
    for ProdEnv (the deployment is not the command's)."""
    from nvflare.recipe import SimEnv

    if isinstance(env, SimEnv) and signals:
        end_simulator_processes(Path(env.workspace_root) / name)
    elif isinstance(env, PocEnv) and signal.SIGTERM in signals:
        end_poc_processes(env.poc_workspace, timeout=0)


def refuse_another_runs_state(recipe: PersonalizedRecipe, env: SimEnv) -> None:
    """Before a simulator starts: a resume from a saved server state this job cannot continue (another run's, or
    too few of its sites among the simulator's: prrfl.flare.server_workflow.resume_refusal) is refused in one line that
    names the state file and what differs. Inside the simulator the workflow would refuse it too, but the command
    would end on the simulator's exit code. An unreadable state is left to the workflow (it falls back to the
    previous round's or says what to do)."""
    workflow = recipe.workflow
    if not workflow.resume:
        return
    workspace = Path(env.workspace_root) / recipe.name
    state_dir = Path(workflow.state_dir or places.simulator_state_root(workspace) / "server" / workflow.cfg.run_name)
    path = state_dir / STATE_FILE
    try:
        state = ServerState.from_dict(load_torch(path)) if path.exists() else None
    except (OSError, RuntimeError, ValueError):
        return
    clients = env.clients or [f"site-{i}" for i in range(1, env.num_clients + 1)]  # the simulator's names
    refusal = state and resume_refusal(path, state, workflow.cfg, clients)
    if refusal:
        raise ConfigError(f"job {recipe.name}: {refusal}")


def say_failure(lines: list[str]) -> None:
    """Print a failed job's cause (failure_lines) on stderr, after everything printed so far: the lines just above the
    command's error line, which is the exit status (prrfl.errors.run_command)."""
    sys.stdout.flush()
    for line in lines:
        print(line, file=sys.stderr, flush=True)


def run_failure(name: str, env: ExecEnv, error: RuntimeError, since: float) -> CommandFailed:
    """The error of a job `name` whose run on env raised `error`. A simulator that ran and exited non-zero has its cause
    printed first (say_failure: the first error in its workspace's logs written since `since`, prrfl.flare.failure),
    and FLARE's message keeps its first sentence ("Simulation failed with return code N"): the rest points at a log
    file the simulator does not write (server/simulate_job/log.txt). Otherwise (SimEnv: before the simulator ran;
    PocEnv, ProdEnv: the start or the submission failed) FLARE's message is the error's."""
    from nvflare.recipe import SimEnv

    if isinstance(env, SimEnv) and getattr(env, "last_run_failed", False):
        say_failure(failure_lines(Path(env.workspace_root) / name, since=since))
        return CommandFailed(f"job {name}: {str(error).split('. Logs are in ', 1)[0]}")
    return CommandFailed(f"job {name}: {error}")


def run_recipe(recipe: PersonalizedRecipe, env: ExecEnv, timeout: float = 0.0) -> tuple[str, Path, dict[str, Any]]:
    """Run the recipe on env and wait for the end: (FLARE job status, result folder, the server's
    results.json). A simulator run is over when execute returns; a POC or production job is followed
    (timeout seconds, 0: no limit) and its server workspace downloaded. The POC workspace is kept (it
    holds the sites' state and logs); the POC processes are stopped, also when the start or the submission fails.
    A Ctrl-C or SIGTERM (interrupts) raises KeyboardInterrupt once no process of the run is left (end_interrupted_run).
    A job that fails (the simulator exits non-zero, a POC or production job ends other than completed) prints its
    cause on stderr (say_failure) before the CommandFailed that names its exit status."""
    from nvflare.recipe import SimEnv

    if isinstance(env, SimEnv):  # refuse before the simulator empties a workspace another job is running in
        workspace = Path(env.workspace_root) / recipe.name
        try:
            places.RunLock(places.simulator_lock_file(workspace)).acquire(run_name=recipe.name).release()
        except places.WorkspaceBusy as e:
            raise places.WorkspaceBusy(
                f"job {recipe.name}: {places.busy_message(f'the simulator workspace {workspace}', e.holder)}", e.holder
            ) from e
        doomed = sorted(p.name for p in workspace.glob("prrfl_site*.json"))  # the simulator deletes all but startup/, local/
        if doomed:
            raise ConfigError(
                f"job {recipe.name}: {workspace} holds {doomed}, which FLARE's simulator would delete before any site reads "
                f"it (it keeps only startup/ and local/): move it into {workspace / 'local'}"
            )
        refuse_another_runs_state(recipe, env)
    started = time.time() - 1.0  # log files older than this are another run's (a coarse file-system clock: 1 s)
    try:
        with interrupts() as interrupted:
            run = recipe.run(env)
    except BaseException as e:  # a POC that started stops with its failed start or submission, or with Ctrl-C
        end_interrupted_run(env, recipe.name, interrupted)
        stop_poc(env)
        if not isinstance(e, RuntimeError):
            raise
        if interrupted:  # Ctrl-C or SIGTERM ended the simulator ("return code -9"): an interruption, not a failure
            raise KeyboardInterrupt from e
        raise run_failure(recipe.name, env, e, started) from e
    if isinstance(env, SimEnv):
        status, result = "FINISHED:COMPLETED", env.get_job_result(run.get_job_id())
    else:
        follower = JobLogFollower(poc_server_log(env.poc_workspace, run.get_job_id())) if isinstance(env, PocEnv) else None
        try:
            with interrupts() as interrupted, quiet_monitor(follower):
                result = run.get_result(timeout=timeout, clean_up=False)
        except BaseException:
            end_interrupted_run(env, recipe.name, interrupted)
            raise
        finally:
            if isinstance(env, PocEnv):
                end_poc_processes(env.poc_workspace)
        status = run.get_status() or "unknown"
        if result is None:
            raise CommandFailed(f"job {run.get_job_id()} ({recipe.name}) did not finish within {timeout:.0f} s (status {status})")
        if status != "FINISHED:COMPLETED":  # the cause: from the POC's logs of the job, or the downloaded server workspace
            poc = isinstance(env, PocEnv)
            say_failure(failure_lines(env.poc_workspace, run.get_job_id(), since=started) if poc else failure_lines(result))
            raise CommandFailed(f"job {run.get_job_id()} ({recipe.name}) ended {status}; its server workspace is {result}")
    return status, Path(result), server_results(result)
