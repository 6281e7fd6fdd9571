"""SIGTERM of `prrfl run` (what `timeout`, systemd, a batch scheduler or `kill` send): the command stops every
process it started, prints the line that says how to go on and ends with 143, as a Ctrl-C does with 130."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import psutil
import pytest
from conftest import TINY_DATA, our_processes, wait_for

from prrfl import cli
from prrfl.errors import interruption
from prrfl.flare.deployment import kill_process_tree
from prrfl.flare.liveness import SIMULATOR_WORKER

RESUME_LINE = "run the same command with --resume auto to continue from the last completed round"


def test_the_line_and_status_of_each_signal():
    assert interruption(signal.SIGINT, "do this") == ("prrfl: interrupted; do this", 130)  # Ctrl-C, as before
    assert interruption(signal.SIGTERM, "do this") == ("prrfl: stopped by SIGTERM; do this", 143)
    assert interruption(signal.SIGTERM) == ("prrfl: stopped by SIGTERM", 143)


def run_python(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=120)


def test_a_swallowed_sigterm_still_ends_the_command_and_a_second_one_does_not_cut_the_stopping_short():
    done = run_python(
        """
        import os, signal, threading, time
        from prrfl.cli import interrupt_deadline
        raised = []
        with interrupt_deadline(lambda: print(f"cleanup ran after {len(raised)} KeyboardInterrupt", flush=True), "run it again", grace=2):
            for after in (0.3, 0.8):
                threading.Timer(after, lambda: os.kill(os.getpid(), signal.SIGTERM)).start()
            end = time.time() + 60
            while time.time() < end:
                try:
                    time.sleep(0.05)
                except KeyboardInterrupt:
                    raised.append(1)  # a library that catches it
        """
    )
    assert done.returncode == 143, done.stderr
    assert done.stdout == "cleanup ran after 1 KeyboardInterrupt\n"
    assert done.stderr.strip().endswith("prrfl: stopped by SIGTERM; run it again")


def test_run_recipe_turns_a_sigterm_without_a_handler_into_one_keyboard_interrupt():
    """Outside `prrfl run` (no handler of the command's), a SIGTERM during a run still unwinds, so that FLARE's
    simulator stops its processes, rather than end the process at once and leave them running. In a fork of this
    process (prrfl.flare.job_recipe already imported), where SIGTERM has its default handler."""
    from prrfl.flare.job_recipe import interrupts

    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        try:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            caught = 0
            with interrupts() as seen:
                for _ in range(2):
                    try:
                        os.kill(os.getpid(), signal.SIGTERM)
                        time.sleep(0.5)
                    except KeyboardInterrupt:
                        caught += 1
            os.write(write, f"{seen} {caught} {signal.getsignal(signal.SIGTERM) == signal.SIG_DFL}".encode())
        finally:
            os._exit(0)
    os.close(write)
    _, status = os.waitpid(pid, 0)
    with os.fdopen(read) as answer:
        said = answer.read()
    assert os.waitstatus_to_exitcode(status) == 0, f"the fork ended with {os.waitstatus_to_exitcode(status)}"
    assert said == f"[{int(signal.SIGTERM)}, {int(signal.SIGTERM)}] 1 True"


def test_sigterm_that_ends_the_simulator_is_a_stop_with_the_line_to_resume(tmp_path, capsys, monkeypatch):
    """SIGTERM during `prrfl run` on SimEnv: FLARE's SimEnv reports the simulator it killed as a RuntimeError
    ("Simulation failed with return code -9"); prrfl ends what is left of it, says it was stopped and how to go on,
    with status 143, and leaves the signal handlers as they were."""
    from prrfl.flare import job_recipe as recipe_module
    from prrfl.flare.job_recipe import PersonalizedRecipe

    ended = []
    monkeypatch.setattr(recipe_module, "end_simulator_processes", ended.append)

    def sigterm_caught_by_flare(self, env, **kwargs):
        try:
            os.kill(os.getpid(), signal.SIGTERM)  # what `timeout` sends; prrfl raises KeyboardInterrupt here ...
            time.sleep(5)
        except KeyboardInterrupt:
            raise RuntimeError("Simulation failed with return code -9") from None  # ... which FLARE's SimEnv turns into this
        pytest.fail("SIGTERM raised no KeyboardInterrupt")

    def unhandled(signum, frame):  # had the command not handled it, this test (not pytest) fails
        raise AssertionError("SIGTERM reached the handler the test had")

    monkeypatch.setattr(PersonalizedRecipe, "run", sigterm_caught_by_flare)
    before = signal.signal(signal.SIGTERM, unhandled)
    try:
        assert cli.main(["run", "derm_prr", "--workspace", str(tmp_path)]) == 143
        assert signal.getsignal(signal.SIGTERM) is unhandled
    finally:
        signal.signal(signal.SIGTERM, before)
    assert capsys.readouterr().err == f"prrfl: stopped by SIGTERM; {RESUME_LINE}\n"
    assert [p.resolve() for p in ended] == [(tmp_path / "derm_prr").resolve()]


def test_end_simulator_processes_ends_the_simulators_on_that_workspace_only(tmp_path):
    from prrfl.flare.job_recipe import SIMULATOR_MAIN, end_simulator_processes

    ws = tmp_path / "ws" / "derm_prr"
    sleep = [sys.executable, "-c", "import time; time.sleep(120)"]
    commands = {
        "site": [*sleep, SIMULATOR_WORKER, "-o", str(ws / "site-1")],
        "simulator": [*sleep, SIMULATOR_MAIN, "/tmp/job", "-w", str(ws)],
        "another workspace": [*sleep, SIMULATOR_MAIN, "/tmp/job", "-w", f"{ws}2"],
        "not FLARE": [*sleep, str(ws / "server" / "log.txt")],  # e.g. `tail -f` of its log
    }
    procs = {name: subprocess.Popen(cmd) for name, cmd in commands.items()}
    try:
        wait_for(lambda: len(our_processes(str(ws))) == 4, 30, "the processes to be listed")
        assert sorted(end_simulator_processes(ws)) == sorted([procs["site"].pid, procs["simulator"].pid])
        ended = {name: p.poll() is not None for name, p in procs.items()}  # killed and reaped
        assert ended == {"site": True, "simulator": True, "another workspace": False, "not FLARE": False}
    finally:
        for p in procs.values():
            p.kill()
            p.wait()


def alive(procs: list[psutil.Process]) -> list[psutil.Process]:
    """Those still running (a zombie, ended but not yet reaped, is not)."""
    left = []
    for p in procs:
        try:
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                left.append(p)
        except psutil.NoSuchProcess:
            continue
    return left


@pytest.mark.e2e
def test_sigterm_of_prrfl_run_on_the_simulator_stops_it_and_every_site_process(tmp_path):
    """`prrfl run --env sim`, 2 sites on tiny data, SIGTERM to the command alone mid-round: it ends within seconds
    with 143 and the line to resume, and no process it started (the simulator, its forks, the sites' processes)
    runs on."""
    ws, log = tmp_path / "ws", tmp_path / "run.log"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}  # the session's data cache (conftest): built once for the tests that share it
    sets = ["--set=num_rounds=20", "--set=local_epochs=1", f"--set=data={json.dumps(TINY_DATA)}"]
    cmd = [sys.executable, "-m", "prrfl.cli", "run", "derm_prr", "--sites", "2", "--workspace", str(ws), *sets]
    with log.open("w") as out:
        proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT, cwd=tmp_path)
    tree: list[psutil.Process] = []
    try:
        wait_for(lambda: "round 0 (rounds 0-19)" in log.read_text() or proc.poll() is not None, 300, "round 0 to start")
        assert proc.poll() is None, log.read_text()[-4000:]
        tree = psutil.Process(proc.pid).children(recursive=True)
        assert len([p for p in tree if SIMULATOR_WORKER in p.cmdline()]) == 2, [p.cmdline() for p in tree]
        start = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        status = proc.wait(timeout=60)
        took = time.monotonic() - start
        text = log.read_text()
        assert status == 143, text[-4000:]
        assert text.rstrip().splitlines()[-1] == f"prrfl: stopped by SIGTERM; {RESUME_LINE}", text[-4000:]
        assert took < 15, f"the command took {took:.1f} s to end"
        wait_for(lambda: not alive(tree) and not alive(our_processes(str(ws))), 5, "the processes of the run to end")
    finally:
        if proc.poll() is None:
            kill_process_tree(proc.pid, grace=0)
        for p in alive(tree) + alive(our_processes(str(ws))):  # never leave a simulator behind for the next test
            kill_process_tree(p.pid, grace=0)
