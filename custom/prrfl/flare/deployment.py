"""`prrfl deploy poc`: a real FLARE deployment on localhost, from provisioning to the results table.

What the simulator cannot show: the job folder runs unchanged on provisioned startup kits, with a
server and one client process per hospital talking gRPC over mutual TLS with the provisioned
certificates, each site reading its data root from its own local/prrfl_site.json, and the job
submitted, followed and downloaded by an admin through the FLARE API. Every process we start runs
in its own process group and is stopped on success, failure, Ctrl-C and SIGTERM.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import yaml

TEMPLATES = Path(__file__).resolve().parents[3] / "workspace_templates"
POC_TEMPLATE = TEMPLATES / "poc" / "project.yml"
PROJECT_ADMIN_ROLE = "project_admin"
# template site name -> cohort of the derm task (the sites are named after their cohorts)
COHORT_OF_SITE = {"vidir-modern": "A", "vidir-molemax": "B", "rosendahl": "C", "msk": "D"}
# server log lines worth showing while the job runs: the workflow's own messages and errors
PROGRESS = re.compile(r" - (PersonalizedWorkflow - \w+|\w+ - ERROR) - ")
NOISE = re.compile(r"Sending task|set transaction info|broadcast")


class DeployError(RuntimeError):
    """A deployment step failed; the message says which and where to look."""


# ----- project and provisioning ------------------------------------------------------------
SIGNATURE_REFUSAL = "does not pass signature verification"  # FLARE's server log, when a job's signature fails


PORT_IN_USE = "Failed to add port"  # what gRPC prints on the server's console when its FL port is taken


class PortInUse(DeployError):
    """The server could not listen on one of its ports (another process took it after it was chosen)."""


def ephemeral_range() -> tuple[int, int]:
    """The ports the OS hands out for port 0 and outgoing connections (Linux: ip_local_port_range)."""
    try:
        low, high = map(int, Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
        return low, high
    except (OSError, ValueError):
        return 32768, 60999  # Linux's default; other systems use 49152-65535, also above the pick below


def free_ports(n: int) -> list[int]:
    """n distinct free TCP ports below the OS's ephemeral range. A port the OS hands out for port 0 may be
    handed out again (to a FLARE job's internal listener, say) before the server binds it; ports below that
    range are only taken by a process that asks for them by number."""
    low = min(ephemeral_range()[0], 32768)
    rng, ports = random.SystemRandom(), []
    while len(ports) < n:
        port = rng.randrange(max(1024, low - 12000), low)
        if port in ports:
            continue
        with socket.socket() as s:
            try:
                s.bind(("", port))
            except OSError:
                continue
        ports.append(port)
    return ports


def make_project(template: Path, num_sites: int, fl_port: int, admin_port: int) -> dict[str, Any]:
    """The template's project with its first num_sites hospitals, their admins and the given ports."""
    project = yaml.safe_load(template.read_text())
    clients = [p for p in project["participants"] if p["type"] == "client"]
    if not 1 <= num_sites <= len(clients):
        raise DeployError(f"--sites must be 1..{len(clients)} (the hospitals of {template})")
    kept = clients[:num_sites]
    orgs = {c["org"] for c in kept}
    participants = []
    for p in project["participants"]:
        if p["type"] == "server":
            p = {**p, "fed_learn_port": fl_port, "admin_port": admin_port}
        elif p["type"] == "client" and p not in kept:
            continue
        elif p["type"] == "admin" and p.get("role") != PROJECT_ADMIN_ROLE and p["org"] not in orgs:
            continue
        participants.append(p)
    return {**project, "participants": participants}


@dataclass
class Kits:
    """Paths of a provisioned project's startup kits."""

    root: Path
    server: str
    sites: list[str]
    admin: str
    orgs: dict[str, str] = field(default_factory=dict)
    ports: tuple[int, ...] = ()  # the server's: FL, admin

    def kit(self, name: str) -> Path:
        return self.root / name


def provision(project: dict[str, Any], out: Path) -> Kits:
    """Run `nvflare provision` on the project; returns the kits of its latest prod_NN folder."""
    out.mkdir(parents=True, exist_ok=True)
    project_file = out / "project.yml"
    project_file.write_text(yaml.safe_dump(project, sort_keys=False))
    nvflare = Path(sys.executable).parent / "nvflare"
    proc = subprocess.run(
        [str(nvflare), "provision", "-p", str(project_file), "-w", str(out / "provision")],
        cwd=out,
        capture_output=True,
        text=True,
        timeout=300,
    )
    if proc.returncode != 0:
        raise DeployError(f"nvflare provision failed:\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}")
    prod = sorted((out / "provision" / project["name"]).glob("prod_*"))[-1]
    parts = project["participants"]
    server = next(p for p in parts if p["type"] == "server")
    return Kits(
        root=prod,
        server=server["name"],
        sites=[p["name"] for p in parts if p["type"] == "client"],
        admin=next(p["name"] for p in parts if p.get("role") == PROJECT_ADMIN_ROLE),
        orgs={p["name"]: p["org"] for p in parts},
        ports=tuple(server[k] for k in ("fed_learn_port", "admin_port") if k in server),
    )


def write_site_config(kit: Path, site: str, data_root: str | None, device: str | None) -> Path:
    """The hospital's own settings (never part of the job): cohort, data root, device."""
    local: dict[str, Any] = {"cohort": COHORT_OF_SITE.get(site, site)}
    if data_root:
        local["data_root"] = data_root
    if device:
        local["device"] = device
    path = kit / "local" / "prrfl_site.json"
    path.write_text(json.dumps(local, indent=2) + "\n")
    return path


# ----- processes ------------------------------------------------------------------------
def server_command(kits: Kits) -> list[str]:
    """What the kit's sub_start.sh runs, with this interpreter (POC processes share our venv)."""
    ws = kits.kit(kits.server)
    return [
        sys.executable,
        "-u",
        "-m",
        "nvflare.private.fed.app.server.server_train",
        "-m",
        str(ws),
        "-s",
        "fed_server.json",
        "--set",
        "secure_train=true",
        f"org={kits.orgs[kits.server]}",
        "config_folder=config",
    ]


def client_command(kits: Kits, site: str) -> list[str]:
    ws = kits.kit(site)
    return [
        sys.executable,
        "-u",
        "-m",
        "nvflare.private.fed.app.client.client_train",
        "-m",
        str(ws),
        "-s",
        "fed_client.json",
        "--set",
        "secure_train=true",
        f"uid={site}",
        f"org={kits.orgs[site]}",
        "config_folder=config",
    ]


def kill_process_tree(pid: int, grace: float = 5.0) -> None:
    """SIGTERM a process and all its descendants, SIGKILL what is left after grace seconds (grace=0:
    SIGKILL at once, as `kill -9` or a power cut would), then wait until they are gone (10 s at most)."""
    kill_process_trees([pid], grace)


def kill_process_trees(pids: list[int], grace: float = 5.0) -> None:
    """kill_process_tree of several processes at once: all signalled, then all waited for together."""
    found: dict[int, psutil.Process] = {}  # a process may be another's descendant too
    for pid in pids:
        try:
            found.update((p.pid, p) for p in [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)])
        except psutil.NoSuchProcess:
            continue
    tree = list(found.values())
    if not tree:
        return
    for p in tree:
        with contextlib.suppress(psutil.Error):
            p.terminate() if grace > 0 else p.kill()
    _, left = psutil.wait_procs(tree, timeout=grace)
    for p in left:
        with contextlib.suppress(psutil.Error):
            p.kill()
    psutil.wait_procs(left, timeout=max(grace, 10.0))


class Processes:
    """Long-running processes, each in its own session, stopped together with all their descendants
    (FLARE starts each job in a new session, so killing our process groups alone would orphan them)."""

    def __init__(self, env: dict[str, str]):
        self.env = env
        self.procs: dict[str, subprocess.Popen] = {}

    def start(self, name: str, cmd: list[str], cwd: Path) -> subprocess.Popen:
        log = open(cwd / "deploy_console.log", "ab")  # noqa: SIM115 - closed with the process
        proc = subprocess.Popen(cmd, cwd=cwd, env=self.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        log.close()
        self.procs[name] = proc
        return proc

    def alive(self) -> list[str]:
        return [n for n, p in self.procs.items() if p.poll() is None]

    def kill(self, name: str, grace: float = 5.0) -> None:
        """Stop the named process and its descendants (kill_process_tree)."""
        proc = self.procs.get(name)
        if proc is None:
            return
        kill_process_tree(proc.pid, grace)
        proc.poll()

    def stop_all(self) -> None:
        for name in reversed(list(self.procs)):  # sites first, the server last
            self.kill(name)


@contextlib.contextmanager
def stop_on_signals() -> Iterator[None]:
    """SIGTERM and SIGINT unwind like Ctrl-C, so the finally blocks stop the processes (SIGINT too:
    a shell starting us in the background makes us ignore it otherwise)."""

    def handler(signum, frame):
        raise KeyboardInterrupt(f"signal {signum}")

    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


# ----- admin session --------------------------------------------------------------------
def open_session(kits: Kits, timeout: float):
    """A secure FLARE API session as the project admin, retried while the server starts."""
    from nvflare.fuel.flare_api.flare_api import new_secure_session

    deadline, error = time.time() + timeout, None
    while time.time() < deadline:
        try:
            return new_secure_session(kits.admin, str(kits.kit(kits.admin)), timeout=10)
        except Exception as e:  # noqa: BLE001 - the server may still be starting
            error = e
            time.sleep(1)
    raise DeployError(f"could not log in to the server as {kits.admin} within {timeout:.0f}s: {error}")


def listening_ports(pid: int) -> set[int]:
    """The TCP ports a process and its descendants listen on."""
    ports: set[int] = set()
    with contextlib.suppress(psutil.Error):
        root = psutil.Process(pid)
        for p in [root, *root.children(recursive=True)]:
            with contextlib.suppress(psutil.Error):
                ports |= {c.laddr.port for c in p.net_connections("tcp") if c.status == psutil.CONN_LISTEN}
    return ports


def wait_for_listening(proc: subprocess.Popen, ports: tuple[int, ...], console: Path, offset: int, timeout: float) -> None:
    """Until the server process listens on all its ports. A port another process took is fatal at once (PortInUse):
    FLARE's server would otherwise run without it, and the sites would retry their login there for ever."""
    deadline = time.time() + timeout
    while True:
        with contextlib.suppress(OSError), console.open("rb") as f:
            f.seek(offset)
            line = next((x for x in f.read().decode(errors="replace").splitlines() if PORT_IN_USE in x), None)
            if line is not None:
                raise PortInUse(f"the server could not listen on one of its ports {list(ports)}: {line.strip()} ({console})")
        missing = set(ports) - listening_ports(proc.pid)
        if not missing:
            return
        if proc.poll() is not None:
            raise DeployError(f"the server exited (code {proc.returncode}) while starting; see {console} and log.txt")
        if time.time() >= deadline:
            raise DeployError(f"the server did not listen on port(s) {sorted(missing)} within {timeout:.0f}s; see {console}")
        time.sleep(0.5)


def wait_for_sites(sess, started: dict[str, float], procs: Processes, timeout: float) -> None:
    """Until every site process has registered with the server since it was started (a restarted
    site's dead predecessor stays listed until its heartbeat times out, so being listed is not enough)."""
    deadline = time.time() + timeout
    ready: set[str] = set()
    while time.time() < deadline:
        seen: dict[str, float] = {}
        for c in sess.get_system_info().client_info:  # a name may be listed twice: dead and restarted
            seen[c.name] = max(seen.get(c.name, 0), c.last_connect_time or 0)
        ready = {s for s, t in started.items() if seen.get(s, 0) >= t}
        if ready == set(started):
            return
        dead = [s for s in started if s not in procs.alive()]
        if dead:
            raise DeployError(f"site process(es) {dead} exited; see <kit>/deploy_console.log and log.txt")
        time.sleep(1)
    raise DeployError(f"sites {sorted(set(started) - ready)} did not connect within {timeout:.0f}s; see each <kit>/log.txt")


class LogFollower:
    """Prints the progress lines FLARE's server logs write (the workflow's round messages)."""

    def __init__(self, folder: Path):
        self.folder = folder
        self.offsets: dict[Path, int] = {}

    def poll(self) -> None:
        for path in sorted(self.folder.rglob("log.txt")):
            with contextlib.suppress(OSError), path.open("rb") as f:
                f.seek(self.offsets.get(path, 0))
                data = f.read()
                self.offsets[path] = f.tell()
            for line in data.decode(errors="replace").splitlines():
                if PROGRESS.search(line) and not NOISE.search(line):
                    when, message = line[11:19], line.rsplit("] - ", 1)[-1]
                    print(f"  {when} {message[:240]}", flush=True)


def follow_job(sess, job_id: str, follower: LogFollower, procs: Processes, timeout: float) -> dict[str, Any]:
    def callback(session, job_id, meta, *args, **kwargs) -> bool:
        follower.poll()
        if "server" not in procs.alive():
            raise DeployError("the server process exited while the job was running")
        return True

    from nvflare.fuel.flare_api.api_spec import MonitorReturnCode

    rc, meta = sess.monitor_job_and_return_job_meta(job_id, timeout=timeout, poll_interval=2.0, cb=callback)
    follower.poll()
    if rc == MonitorReturnCode.TIMEOUT:
        raise DeployError(f"job {job_id} did not finish within {timeout:.0f}s")
    return meta


# ----- results --------------------------------------------------------------------------
@dataclass
class DeployResult:
    job_id: str
    status: str
    results: dict[str, Any]
    result_dir: Path
    tb_dirs: dict[str, Path]
    seconds: float


def collect_results(sess, job_id: str, out: Path) -> tuple[dict[str, Any], Path, dict[str, Path]]:
    """Downloads the job's server workspace into <out>/result; returns results.json, its path and the
    TensorBoard folders per site."""
    downloaded = Path(sess.download_job_result(job_id))
    target = out / "result"
    if target.exists():
        shutil.rmtree(target)
    shutil.copytree(downloaded, target)
    found = sorted(target.rglob("results.json"))
    if not found:
        raise DeployError(f"job {job_id} finished without results.json; see {target} and the server's log.txt")
    tb_root = next(iter(sorted(target.rglob("tb_events"))), None)
    tb = {d.name: d for d in sorted(tb_root.iterdir()) if d.is_dir()} if tb_root else {}
    return json.loads(found[0].read_text()), found[0], tb


def shutdown(sess, procs: Processes) -> None:
    """Ask FLARE to stop politely, then make sure nothing we started is left."""
    if sess is not None:
        with contextlib.suppress(Exception):
            sess.shutdown("all", wait=False)
        with contextlib.suppress(Exception):
            sess.close()
        deadline = time.time() + 15
        while procs.alive() and time.time() < deadline:
            time.sleep(0.5)
    procs.stop_all()


class Deployment:
    """A running POC deployment: kits, the server and site processes, and an admin session."""

    def __init__(self, kits: Kits, env: dict[str, str] | None = None):
        self.kits = kits
        # a site whose job process hangs or is frozen never reports the job's end; FLARE finalizes the job
        # without that report after client_outcome_wait_timeout (its default 900 s) and its heartbeat clean-up
        # then kills the process: 120 s here, unless the environment says otherwise
        defaults = {"NVFLARE_CLIENT_OUTCOME_WAIT_TIMEOUT": "120"}
        self.procs = Processes({**defaults, **os.environ, **(env or {}), "PYTHONUNBUFFERED": "1"})
        self.sess = None
        self.site_started: dict[str, float] = {}

    def start_server(self) -> None:
        console = self.kits.kit(self.kits.server) / "deploy_console.log"
        offset = console.stat().st_size if console.exists() else 0  # a restarted server appends to it
        proc = self.procs.start("server", server_command(self.kits), self.kits.kit(self.kits.server))
        wait_for_listening(proc, self.kits.ports, console, offset, timeout=120)
        self.sess = open_session(self.kits, timeout=120)

    def start_site(self, site: str) -> None:
        self.site_started[site] = time.time()
        self.procs.start(site, client_command(self.kits, site), self.kits.kit(site))

    def start(self) -> None:
        self.start_server()
        for site in self.kits.sites:
            self.start_site(site)
        self.wait_for_sites()

    def wait_for_sites(self, timeout: float = 120) -> None:
        wait_for_sites(self.sess, self.site_started, self.procs, timeout)

    def kill(self, name: str) -> None:
        """Kill a participant (and its job processes) without warning, as a crash would."""
        if name == "server" and self.sess is not None:
            with contextlib.suppress(Exception):
                self.sess.close()
            self.sess = None
        self.procs.kill(name, grace=0)

    def run_job(self, job: Path, timeout: float) -> tuple[str, str]:
        """Submit as the admin and follow to the end; returns (job id, final status). A job that FLARE 2.9
        refused to start because its signature did not verify (an intermittent refusal of a freshly signed
        folder, seen on loaded machines) is signed and submitted once more."""
        for attempt in (1, 2):
            job_id = self.sess.submit_job(str(job))
            print(f"job {job_id} submitted", flush=True)
            meta = follow_job(self.sess, job_id, LogFollower(self.kits.kit(self.kits.server)), self.procs, timeout)
            status = meta.get("status", "?")
            print(f"job {job_id} ended: {status}", flush=True)
            if attempt == 1 and status == "FINISHED:FAILED_TO_RUN" and self.refused_signature(job_id):
                print(f"job {job_id}: the server refused its signature ({SIGNATURE_REFUSAL}); submitting it again", flush=True)
                continue
            return job_id, status
        raise AssertionError("unreachable")

    signature_wait = 10.0  # s: the server's log line of a refused signature may follow the job's status

    def refused_signature(self, job_id: str) -> bool:
        """Whether the server's log says it could not run job `job_id` because its signature did not verify."""
        log = self.kits.kit(self.kits.server) / "log.txt"
        deadline = time.time() + self.signature_wait
        while True:
            text = log.read_text(errors="replace") if log.exists() else ""
            if any(job_id in line and SIGNATURE_REFUSAL in line for line in text.splitlines()):
                return True
            if time.time() >= deadline:
                return False
            time.sleep(0.5)

    def stop(self) -> None:
        shutdown(self.sess, self.procs)
        self.sess = None


@contextlib.contextmanager
def poc_deployment(
    out: Path,
    num_sites: int,
    data_root: str | None = None,
    device: str | None = None,
    template: Path = POC_TEMPLATE,
    env: dict[str, str] | None = None,
) -> Iterator[Deployment]:
    """Provision into out, start everything, yield; stop everything on exit, however it happens."""
    deployment = None
    try:
        with stop_on_signals():
            deployment = started_deployment(out, num_sites, data_root, device, template, env)
            print(f"all {num_sites} sites connected over mTLS", flush=True)
            yield deployment
    finally:
        if deployment is not None:
            deployment.stop()
        print(f"all FLARE processes stopped; kits, logs and results are in {out}", flush=True)


def started_deployment(out, num_sites, data_root, device, template, env, attempts: int = 3) -> Deployment:
    """Provision and start; provisions again with other ports when one was taken before the server bound it."""
    for attempt in range(1, attempts + 1):
        kits = provision(make_project(template, num_sites, *free_ports(2)), out)
        print(f"provisioned {kits.root}: server, {len(kits.sites)} sites {kits.sites}, admin {kits.admin}", flush=True)
        for site in kits.sites:
            write_site_config(kits.kit(site), site, data_root, device)
        deployment = Deployment(kits, env)
        try:
            deployment.start()
            return deployment
        except BaseException as e:
            deployment.stop()
            if not isinstance(e, PortInUse) or attempt == attempts:
                raise
            aside = out / f"provision.port_taken.{attempt}"  # kept for its logs; nvflare provisions into a new folder
            (out / "provision").rename(aside)
            print(f"{e}; provisioning again with other ports (the first kits are in {aside})", flush=True)
    raise AssertionError("unreachable")


def deploy_poc(
    job: Path,
    num_sites: int = 4,
    workdir: Path | None = None,
    data_root: str | None = None,
    device: str | None = None,
    timeout: float = 3600,
    env: dict[str, str] | None = None,
) -> DeployResult:
    """Provision, start, submit the job, follow, download, stop. workdir=None: a new folder under the
    system's temp dir, kept afterwards (it holds the logs and the downloaded results)."""
    from prrfl.report import server_run

    job = Path(job).resolve()
    if not (job / "meta.json").exists():
        raise DeployError(f"{job} is not a FLARE job folder (no meta.json)")
    out = Path(workdir).resolve() if workdir else Path(tempfile.mkdtemp(prefix="prrfl_poc_"))
    start = time.time()
    with poc_deployment(out, num_sites, data_root, device, env=env) as dep:
        job_id, status = dep.run_job(job, timeout)
        results, results_path, tb = collect_results(dep.sess, job_id, out)
        print(f"results and TensorBoard events of {sorted(tb)} downloaded to {out / 'result'}", flush=True)
        print(server_run(results_path, results).table(), flush=True)  # with the cross-site matrix, as `prrfl results`
    return DeployResult(job_id, status, results, out / "result", tb, time.time() - start)


def with_workflow_args(job: Path, out_root: Path, **args: Any) -> Path:
    """A copy of the job folder whose server workflow gets these arguments (e.g. resume=True, so a
    re-submitted job continues from the persisted state, or task_timeout)."""
    target = Path(out_root) / Path(job).name
    if target.exists():
        shutil.rmtree(target)
    shutil.copytree(job, target)
    config = target / "app" / "config" / "config_fed_server.json"
    server = json.loads(config.read_text())
    workflow = next(w for w in server["workflows"] if w["id"] == "workflow")
    workflow["args"].update(args)
    config.write_text(json.dumps(server, indent=4))
    return target


def cli(args) -> int:
    """`prrfl deploy poc` handler: 0 when the job finished and its results came back."""
    try:
        result = deploy_poc(Path(args.job), args.sites, args.workdir, args.data_root, args.device, args.timeout)
    except DeployError as e:
        print(f"deploy failed: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted; all FLARE processes stopped", file=sys.stderr)
        return 130
    print(f"POC run of {Path(args.job).name}: {result.seconds:.0f}s wall time", flush=True)
    return 0 if result.status == "FINISHED:COMPLETED" else 1
