"""A Ctrl-C always ends `prrfl run` (prrfl.cli.interrupt_deadline): should a library catch the KeyboardInterrupt or
keep waiting on a server the Ctrl-C stopped, the command cleans up, prints the interrupted line and ends with 130
after the grace period."""

from __future__ import annotations

import subprocess
import sys
import textwrap

SWALLOWING_BLOCK = textwrap.dedent(
    """
    import os, signal, threading, time
    from prrfl.cli import interrupt_deadline
    with interrupt_deadline(lambda: print("cleanup ran", flush=True), "run it again", grace={grace}):
        threading.Timer(0.5, lambda: os.kill(os.getpid(), signal.SIGINT)).start()
        end = time.time() + 60
        while time.time() < end:
            try:
                time.sleep(0.05)
            except KeyboardInterrupt:
                {on_interrupt}
    print("the block ended", flush=True)
    """
)


def run(grace: float, on_interrupt: str) -> subprocess.CompletedProcess:
    code = SWALLOWING_BLOCK.format(grace=grace, on_interrupt=on_interrupt)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)


def test_a_swallowed_ctrl_c_still_ends_the_command_after_the_grace_period():
    done = run(grace=1, on_interrupt="pass  # a library that catches it")
    assert done.returncode == 130
    assert done.stdout == "cleanup ran\n" and done.stderr.strip().endswith("prrfl: interrupted; run it again")


def test_a_ctrl_c_that_ends_the_block_cancels_the_deadline():
    done = run(grace=1, on_interrupt="break")
    assert done.returncode == 0 and done.stdout == "the block ended\n" and "interrupted" not in done.stderr
