"""How long the server waits for the sites of a round: the per-round deadline.

A site that dies or hangs must never stall the federation. FLARE notices a dead site by itself only in a
deployment, and late (its job process gone: about a minute; the whole machine gone: after the server's
`heart_beat_timeout`, 600 s in provisioned kits); in the simulator it never does. The workflow therefore
gives every round a deadline, derived from the work the sites have shown they need:

* "auto" (default): every round gets `max(floor, factor x the slowest round any site took so far)`, so a
  round that took 20 s gets 60 s and one that took 10 min gets 30 min. Before any round is measured, the
  first round gets `max(floor, estimate_factor x the sum of the sites' own estimates of a round)`, made at
  `prepare` by timing one training step (prrfl.site.trainer.estimate_round_seconds): the sum is what the
  round would take if the sites ran one after another (a simulator with fewer threads than sites), and
  the factor covers what one timed step cannot see. The `prepare` task itself, which may generate the
  synthetic data, gets `first` seconds. The measured times and
  estimates are part of the workflow's saved state, so a resumed run keeps them.
* a number of seconds: that deadline for every task; 0: no deadline (wait for ever; not recommended).

A site that is gone does not wait for the deadline: in a deployment FLARE reports a site whose job process
died (its "dead job" report, then `get_client_disconnect_time` after FLARE's `dead_client_grace_period`);
the simulator has no such report, but the server runs in the process that starts the sites' processes, so
`WorkerWatch` sees a site's process end without an answer. When the job ends, `release_lost_workers` ends
the simulator processes of sites that were lost (stopped with kill -STOP or hung): the simulator waits for
every site process before it exits, so one frozen site would otherwise keep it running for ever.
"""

from __future__ import annotations

import logging
import math
import os
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field

import psutil

log = logging.getLogger(__name__)

SIMULATOR_WORKER = "nvflare.private.fed.app.simulator.simulator_worker"  # the module FLARE's simulator runs per site

AUTO = "auto"


@dataclass(frozen=True)
class Deadline:
    timeout: float | str = AUTO
    first: float = 7200.0  # prepare (may generate the synthetic data); round 0 when no site sent an estimate
    floor: float = 60.0
    factor: float = 3.0
    estimate_factor: float = 5.0  # round 0: the estimate is rough (one step timed, evaluation guessed)

    def __post_init__(self) -> None:
        if self.timeout != AUTO and (isinstance(self.timeout, bool) or not isinstance(self.timeout, (int, float)) or self.timeout < 0):
            raise ValueError(f"workflow argument 'task_timeout' must be \"auto\" or seconds >= 0, got {self.timeout!r}")
        for name in ("first", "floor", "factor", "estimate_factor"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0 or math.isinf(value):
                raise ValueError(f"workflow argument for the deadline's '{name}' must be a positive number, got {value!r}")

    def seconds(self, observed: list[float], estimates: list[float] = ()) -> float | None:
        """The deadline of the next task given the durations (s) of the train tasks seen so far and the
        sites' estimates of a round; None: no deadline."""
        if self.timeout != AUTO:
            return float(self.timeout) or None
        if observed:
            return max(self.floor, self.factor * max(observed))
        if estimates:
            return max(self.floor, self.estimate_factor * sum(estimates))
        return float(self.first)

    def explain(self, observed: list[float], estimates: list[float] = ()) -> str:
        seconds = self.seconds(observed, estimates)
        if seconds is None:
            return "no deadline (task_timeout=0)"
        if self.timeout != AUTO:
            return f"{seconds:.0f} s (task_timeout)"
        if observed:
            return f"{seconds:.0f} s ({self.factor:g} x the slowest round so far, {max(observed):.0f} s; at least {self.floor:g} s)"
        if estimates:
            return f"{seconds:.0f} s ({self.estimate_factor:g} x the sum of the sites' estimates of a round, {sum(estimates):.1f} s; at least {self.floor:g} s)"
        return f"{seconds:.0f} s (nothing measured or estimated yet)"


def simulator_workers() -> dict[str, list[psutil.Process]]:
    """The FLARE simulator's site processes that this process started, by site name. The simulator runs the
    server workflow in the process that starts the sites (`--parent_pid` names it), so this is empty
    outside the simulator and for another simulator's sites."""
    found: dict[str, list[psutil.Process]] = {}
    me = str(os.getpid())
    for child in psutil.Process().children():
        try:
            cmd = child.cmdline()
            if SIMULATOR_WORKER in cmd and cmd[cmd.index("--parent_pid") + 1] == me:
                found.setdefault(cmd[cmd.index("--client") + 1], []).append(child)
        except (psutil.Error, ValueError, IndexError):  # ended meanwhile, or not a worker's command line
            continue
    return found


@dataclass
class WorkerWatch:
    """The sites whose simulator process ended without an answer, for one task sent to several sites.

    A site counts as gone once its process was seen and has then been absent for `grace` seconds (a process
    that answered and ended normally, with fewer simulator threads than sites, has its answer in by then).
    A site whose process was never seen may be waiting for a simulator thread, or its process may have died
    before the task was sent (a worker that cannot connect to the server at start): it counts as gone only
    once another site has answered and no site still owing an answer has had a process for
    max(`unseen_grace`, `unseen_factor` x the slowest answer so far) seconds. A waiting site gets a thread
    within about one answer's time once the others are done, while a dead one would otherwise be waited for
    until the task's deadline (prepare's: 2 h)."""

    grace: float = 10.0
    unseen_grace: float = 60.0
    unseen_factor: float = 3.0
    seen: set[str] = field(default_factory=set)
    absent_since: dict[str, float] = field(default_factory=dict)
    idle_since: float | None = None  # since when no site still owing an answer has had a process

    def gone(self, sites: Iterable[str], now: float | None = None, slowest_answer: float | None = None) -> set[str]:
        """`sites`: those still owing an answer; `slowest_answer`: seconds the slowest answer so far took
        (None: nobody answered yet)."""
        now = time.time() if now is None else now
        sites = set(sites)
        alive = simulator_workers()
        for site in sites:
            if alive.get(site):
                self.seen.add(site)
                self.absent_since.pop(site, None)
            elif site in self.seen:
                self.absent_since.setdefault(site, now)
        if any(alive.get(site) for site in sites):
            self.idle_since = None
        elif self.idle_since is None:
            self.idle_since = now
        lost = {s for s in sites if s in self.absent_since and now - self.absent_since[s] >= self.grace}
        if slowest_answer is not None and self.idle_since is not None:
            if now - self.idle_since >= max(self.unseen_grace, self.unseen_factor * slowest_answer):
                lost |= sites - self.seen
        return lost


def release_lost_workers(sites: Iterable[str], grace: float = 30.0) -> list[str]:
    """End the simulator processes of `sites` (lost during the job) so that the simulator can exit: a stopped
    process (kill -STOP) at once, one still running (hung, or busy with a task nobody waits for) after
    `grace` seconds if it has not ended by then. Returns one line per process for the server log."""
    lines, later = [], []
    workers = simulator_workers()
    for site in sorted(sites):
        for proc in workers.get(site, []):
            try:
                if proc.status() == psutil.STATUS_STOPPED:
                    proc.kill()
                    lines.append(f"{site}: its simulator process {proc.pid} is stopped (kill -STOP?); killed it so the simulator can exit")
                else:
                    later.append((site, proc))
                    lines.append(f"{site}: its simulator process {proc.pid} has not answered; it is killed in {grace:.0f} s unless it ends")
            except psutil.Error:
                continue
    if later:

        def kill_later() -> None:
            _, alive = psutil.wait_procs([p for _, p in later], timeout=grace)
            for proc in alive:
                try:
                    proc.kill()
                    log.warning("killed the simulator process %s of a lost site after %.0f s", proc.pid, grace)
                except psutil.Error:
                    pass

        threading.Thread(target=kill_later, name="prrfl-release-lost-sites", daemon=True).start()
    return lines


# ----- no simulator process outlives the command that started it ---------------------------------------------
ORPHAN_POLL = 2.0  # seconds between two looks at the watched process
ORPHAN_GRACE = 5.0  # seconds a process that must end gets to end by itself before it is killed


def simulator_worker_process() -> psutil.Process | None:
    """The FLARE simulator site process this code runs in (its Client API script in process) or under (a
    script it launched as a process of its own); None outside a simulator site."""
    try:
        proc: psutil.Process | None = psutil.Process()
        for _ in range(3):  # the worker, or the script's process and its launcher
            if proc is None:
                return None
            if SIMULATOR_WORKER in proc.cmdline():
                return proc
            proc = proc.parent()
    except psutil.Error:
        return None
    return None


def watch_parent(what: str, parent: psutil.Process, end: list[psutil.Process], poll: float = ORPHAN_POLL, grace: float = ORPHAN_GRACE):
    """A daemon thread that ends the processes `end` (their children first, then each in order; SIGTERM, SIGKILL
    after `grace` seconds) once `parent` is gone, e.g. killed with kill -9: the simulator's processes then end
    within seconds instead of running on headless. `what` names the watched process in the log."""

    def watch() -> None:
        while parent.is_running() and parent.status() != psutil.STATUS_ZOMBIE:
            time.sleep(poll)
        log.error("%s (pid %s) is gone: ending this simulator process and its children (no orphans)", what, parent.pid)
        children = []
        for proc in end:
            try:
                children += proc.children(recursive=True)
            except psutil.Error:
                pass
        for group in (children, *([proc] for proc in end)):  # the children, then `end` in order: this thread may be in the last
            for proc in group:
                try:
                    proc.terminate()
                except psutil.Error:
                    pass
            for proc in psutil.wait_procs(group, timeout=grace)[1]:
                try:
                    proc.kill()
                except psutil.Error:
                    pass

    thread = threading.Thread(target=watch, name="prrfl-orphan-watch", daemon=True)
    thread.start()
    return thread


def end_site_with_simulator() -> threading.Thread | None:
    """In a simulator site: end the site's process when the simulator's main process (the worker's
    `--parent_pid`) is gone. None outside the simulator."""
    worker = simulator_worker_process()
    if worker is None:
        return None
    try:
        cmd = worker.cmdline()
        parent = psutil.Process(int(cmd[cmd.index("--parent_pid") + 1]))
    except (psutil.Error, ValueError, IndexError):
        return None
    return watch_parent("the simulator's main process", parent, [worker])


def end_simulator_with_its_command() -> threading.Thread | None:
    """In the simulator's server process: when the command that started it is gone, end the sites' processes,
    the command's other forks and this process, rather than run the job on headless. FLARE's simulator forks
    the server (and a helper) from the command's process, so this watches only a parent whose command line is
    this process's own: a server running inside another program (whose parent is a shell) is left alone."""
    try:
        me = psutil.Process()
        parent = me.parent()
        if parent is None or parent.pid == 1 or parent.cmdline() != me.cmdline():
            return None
        forks = [p for p in parent.children() if p.pid != me.pid and p.cmdline() == me.cmdline()]
    except psutil.Error:
        return None
    return watch_parent("the command that started the simulator", parent, [*forks, me])
