"""A deployed job's progress followed from its server log (prrfl.flare.job_log): what is shown, what is not."""

from __future__ import annotations

import io
import time

import pytest
from conftest import wait_for

from prrfl.flare.job_log import JobLogFollower, poc_server_log, progress_line

CTX = "[identity=server, run=2f9c, wf=workflow, peer=site-2, task_name=train]"
LOG = [
    f"2026-11-29 11:55:40,317 - PersonalizedWorkflow - INFO - {CTX} - round 2 (rounds 0-4): sending each of 4 sites its own model",
    f"2026-11-29 11:55:40,318 - PersonalizedWorkflow - INFO - {CTX} - Sending task train to ['site-1']",
    "2026-11-29 11:55:41,000 - Cacheable - INFO - set transaction info: tx_id='T1'",
    f"2026-11-29 11:56:20,980 - PersonalizedWorkflow - INFO - {CTX} - round 2 done (server RSS 999 MiB); test: site-1_A f1=31.9",
    "2026-11-29 11:56:21,000 - PersonalizedWorkflow - WARNING - site-3 did not score the last round's global model: lost",
    "2026-11-29 11:57:00,000 - PersonalizedWorkflow - INFO - per-site results of the personalized models (best round on validation):",
    "| site | best round | test F1 |",
    "| site-1 | 4 | 73.33 |",
    "2026-11-29 11:57:01,000 - ServerRunner - INFO - END_RUN fired",
    "  a continuation of a FLARE record",
]
SHOWN = [
    "[11:55:40] round 2 (rounds 0-4): sending each of 4 sites its own model",
    "[11:56:20] round 2 done (server RSS 999 MiB); test: site-1_A f1=31.9",
    "[11:56:21] WARNING: site-3 did not score the last round's global model: lost",
    "[11:57:00] per-site results of the personalized models (best round on validation):",
    "| site | best round | test F1 |",
    "| site-1 | 4 | 73.33 |",
]


def test_the_jobs_own_lines_are_shown_and_flares_plumbing_is_not():
    assert progress_line(LOG[2]) == (True, None)
    assert progress_line("| site-1 | 4 | 73.33 |") == (False, None)  # not a record: shown only after a shown one
    out = io.StringIO()
    follower = JobLogFollower(lambda: None, out)
    for line in LOG:
        follower._show(line + "\n")
    assert out.getvalue().splitlines() == SHOWN


def test_the_follower_waits_for_the_log_reads_it_as_it_grows_and_reads_the_rest_when_stopped(tmp_path):
    log = tmp_path / "poc/example_project/prod_00/server/2f9c/log.txt"
    out = io.StringIO()
    follower = JobLogFollower(poc_server_log(tmp_path / "poc", "2f9c"), out, poll=0.05)
    follower.start()
    time.sleep(0.2)  # no log yet: the follower waits for it
    log.parent.mkdir(parents=True)
    log.write_text("\n".join(LOG[:4]) + "\n")
    wait_for(lambda: len(out.getvalue().splitlines()) == 2, 10, "the first rounds' lines")
    with open(log, "a") as f:
        f.write("\n".join(LOG[4:]) + "\n")
    follower.stop()
    assert not follower.is_alive() and out.getvalue().splitlines() == SHOWN
    assert poc_server_log(tmp_path / "poc", "other")() is None


class RecordingFollower:
    """What quiet_monitor needs of a JobLogFollower: where it writes, start and stop."""

    def __init__(self):
        self.out, self.calls = None, []

    def start(self):
        self.calls.append("start")

    def stop(self):
        self.calls.append("stop")


def test_while_flares_monitor_waits_only_the_jobs_progress_reaches_the_console(capsys):
    from prrfl.flare.job_recipe import quiet_monitor

    follower = RecordingFollower()
    with quiet_monitor(follower):
        print("{'name': 'derm_prr', 'resource_spec': {}, ...}")  # FLARE's job meta, printed by its monitor
        print(".", end="")  # a dot per poll
        follower.out.write("round 0 done\n")  # what the follower reads from the server's log
    assert capsys.readouterr().out == "round 0 done\n"
    assert follower.calls == ["start", "stop"]
    with pytest.raises(RuntimeError), quiet_monitor(follower):
        raise RuntimeError("the job failed")
    assert follower.calls[-1] == "stop"  # stopped however the wait ends
    with quiet_monitor(None):  # no follower (the simulator): nothing changes
        print("as it is")
    assert capsys.readouterr().out == "as it is\n"
