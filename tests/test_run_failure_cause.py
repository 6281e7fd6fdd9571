"""A job that fails inside FLARE ends `prrfl run` on its cause: the first real error of the run's log files
(prrfl.flare.failure), named with its process and log file, just above the exit status line."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from prrfl.flare.failure import failure_lines, find_cause, log_files


def cause_line(workspace, **kwargs) -> str | None:
    """The cause as prrfl run prints it after "prrfl: cause: " ("site-1: ValueError: ..."), or None."""
    cause = find_cause(workspace, **kwargs)
    return None if cause is None else str(cause)


CTX = "[identity=simulator_server, run=simulate_job, wf=workflow] - "


def record(stamp: str, name: str, level: str, msg: str, ctx: str = "") -> str:
    return f"2026-11-29 12:41:{stamp} - {name} - {level} - {ctx}{msg}\n"


def write_log(ws: Path, participant: str, *parts: str) -> Path:
    path = ws / participant / "log.txt"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(parts))
    return path


SITE_TRACEBACK = (
    "Traceback (most recent call last):\n"
    '  File "/x/prrfl/flare/site_app.py", line 160, in main\n'
    "    runtime = runtime_for(runtime, site, meta, local, writer, job_id)\n"
    "              ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^\n"
    '  File "/x/prrfl/tasks/dermoscopy.py", line 58, in load_site\n'
    "    root = self.prepared_root(data_root)\n"
    "ValueError: site site-2: option 'det_split' must be 'train' or 'valid', got 'tset'\n"
)


def server_lines(*extra: str) -> list[str]:
    return [
        record("30,100", "ServerRunner", "INFO", "Server runner starting ...", CTX),
        record("31,000", "PersonalizedWorkflow", "INFO", "prepare sent to ['site-1', 'site-2']", CTX),
        *extra,
    ]


def test_a_sites_traceback_is_named_with_the_site(tmp_path):
    write_log(
        tmp_path,
        "server",
        *server_lines(record("40,000", "PersonalizedWorkflow", "ERROR", "site-2 cannot take part in this run: ValueError: ...", CTX)),
    )
    write_log(tmp_path, "site-1", record("32,000", "site", "INFO", "site site-1: 12 training images"))
    site = write_log(
        tmp_path,
        "site-2",
        record("32,000", "site", "INFO", "site site-2: starting"),
        record("35,250", "site", "ERROR", "site site-2: task 'prepare' failed") + SITE_TRACEBACK,
        record("35,300", "ClientRunner", "INFO", "finished processing task"),
    )
    assert cause_line(tmp_path) == "site-2: ValueError: option 'det_split' must be 'train' or 'valid', got 'tset'"
    cause = find_cause(tmp_path)
    assert (cause.process, cause.path, cause.line) == ("site-2", site, 2)
    assert failure_lines(tmp_path) == [
        "prrfl: cause: site-2: ValueError: option 'det_split' must be 'train' or 'valid', got 'tset'",
        f"prrfl: from line 2 of {site}",
    ]


# A site's exception as FLARE 2.9's simulator writes it to <workspace>/site-1/log.txt (a real failed run's lines, the
# paths shortened): the site's error record (no traceback in the file) comes after the traceback its process printed,
# a record a chunk at INFO, although its time stamp is earlier.
MISSING = "data root /nonexistent/derm_data does not exist (any more): check that the folder is there and mounted"
PRINTED_SITE_LOG = f"""\
2026-11-30 01:45:58,058 - ClientAPIExecutor - INFO - [identity=site-1, run=simulate_job, task_name=prepare] - waiting for result from in-process trainer
2026-11-30 01:46:04,898 - TaskScriptRunner - INFO - Traceback (most recent call last):

2026-11-30 01:46:04,899 - TaskScriptRunner - INFO -   File "/x/prrfl/tasks/contract.py", line 156, in given_root
    raise FileNotFoundError(f"data root {{root}} does not exist (any more): check that the folder is there and mounted")

2026-11-30 01:46:04,904 - TaskScriptRunner - INFO - FileNotFoundError: {MISSING}

2026-11-30 01:46:04,905 - TaskScriptRunner - INFO - \nThe above exception was the direct cause of the following exception:


2026-11-30 01:46:04,911 - TaskScriptRunner - INFO - Traceback (most recent call last):

2026-11-30 01:46:04,913 - TaskScriptRunner - INFO -   File "/x/prrfl/flare/site_app.py", line 81, in load_site_data
    raise FileNotFoundError(f"{{e}} (data_root: {{local.origin('data_root')}})") from e

2026-11-30 01:46:04,913 - TaskScriptRunner - INFO - FileNotFoundError: {MISSING} (data_root: field 'data_root' of /ws/site-1/local/prrfl_site.json)

2026-11-30 01:46:04,896 - site - ERROR - site site-1: task 'prepare' failed
2026-11-30 01:46:05,314 - ClientTaskWorker - INFO - Finished one task run for client: site-1 interval: 0.5 task_processed: True
"""
REAL_SERVER_LOG = f"""\
2026-11-30 01:45:40,013 - PersonalizedWorkflow - INFO - [identity=simulator_server, run=simulate_job, wf=workflow] - Sending task prepare to ['site-2']
2026-11-30 01:46:07,016 - PersonalizedWorkflow - ERROR - [identity=simulator_server, run=simulate_job, wf=workflow, peer=site-2, task_name=prepare] - site-1 cannot take part in this run: FileNotFoundError: {MISSING}
2026-11-30 01:46:07,028 - ServerRunner - ERROR - [identity=simulator_server, run=simulate_job, wf=workflow, peer=site-2, task_name=prepare] - Aborting current RUN due to FATAL_SYSTEM_ERROR received: only 0 of 2 sites prepared their data, fewer than min_sites=majority (2)
"""


def test_a_sites_exception_printed_by_its_process_is_named_with_the_site(tmp_path):
    write_log(tmp_path, "server", REAL_SERVER_LOG)
    site = write_log(tmp_path, "site-1", PRINTED_SITE_LOG)
    assert failure_lines(tmp_path) == [
        f"prrfl: cause: site-1: FileNotFoundError: {MISSING} (data_root: field 'data_root' of /ws/site-1/local/prrfl_site.json)",
        f"prrfl: from line 2 of {site}",  # where the traceback starts
    ]
    site.write_text(PRINTED_SITE_LOG.replace(" - site - ERROR - site site-1: task 'prepare' failed", " - site - INFO - done"))
    assert cause_line(tmp_path).startswith("site-1: FileNotFoundError: ")  # a printed traceback is a cause of its own


def test_flares_noise_after_a_cause_does_not_win_over_it(tmp_path):
    """FLARE's follow-up errors (a failed download, its own traceback of it, "fire abort event") are never the
    cause, wherever they are: the earlier real error is."""
    download = 'Traceback (most recent call last):\n  File "via_downloader.py", line 1016\nRuntimeError: failed to download from server\n'
    write_log(
        tmp_path,
        "server",
        *server_lines(
            record("33,000", "Cacheable", "ERROR", "failed to download object with ref 1234: aborted"),
            record("34,000", "ViaDownloaderDecomposer", "ERROR", download.rstrip("\n")),
        ),
    )
    write_log(
        tmp_path,
        "site-1",
        record("33,500", "TaskScriptRunner", "ERROR", "fire abort event"),
        record("36,000", "site", "ERROR", "site site-1: task 'train' failed") + SITE_TRACEBACK.replace("site-2", "site-1"),
        record("37,000", "FileDownloader", "ERROR", "failed to download file with ref 99: timeout"),
    )
    assert cause_line(tmp_path) == "site-1: ValueError: option 'det_split' must be 'train' or 'valid', got 'tset'"


def test_the_earliest_cause_across_processes_wins(tmp_path):
    write_log(tmp_path, "server", *server_lines(record("50,000", "PersonalizedWorkflow", "ERROR", "round 0: site-1 failed: boom", CTX)))
    write_log(
        tmp_path,
        "site-1",
        record("45,000", "site", "ERROR", "site site-1: task 'train' failed") + SITE_TRACEBACK.replace("site-2", "site-1"),
    )
    write_log(tmp_path, "site-2", record("46,000", "site", "ERROR", "site site-2: the other one"))
    assert cause_line(tmp_path).startswith("site-1: ValueError: ")


def test_a_server_workflow_refusal_is_named(tmp_path):
    reason = (
        "the job cannot start: /ws/server/simulate_job/app_server/config/config_fed_server.json, component 'workflow': "
        "method 'prr' option 'det_enabled' must be true or false, got 'flase' (config field 'method_args.det_enabled')"
    )
    server = write_log(
        tmp_path,
        "server",
        *server_lines(record("36,862", "ServerRunner", "ERROR", f"Aborting current RUN due to FATAL_SYSTEM_ERROR received: {reason}", CTX)),
    )
    write_log(tmp_path, "site-1", record("48,852", "InProcessClientAPI", "WARNING", "ask to stop job: reason: END_RUN received"))
    assert cause_line(tmp_path) == f"server: {reason}"
    assert failure_lines(tmp_path)[1] == f"prrfl: from line 3 of {server}"


def test_a_long_cause_is_cut_to_one_line(tmp_path):
    write_log(tmp_path, "server", *server_lines(record("40,000", "PersonalizedWorkflow", "ERROR", "x " * 400 + "\n  and more")))
    cause = cause_line(tmp_path)
    assert "\n" not in cause and len(cause) <= len("server: ") + 300 and cause.endswith("...")


def test_nothing_found_gives_none_and_names_the_logs(tmp_path):
    server = write_log(tmp_path, "server", *server_lines())
    site = write_log(tmp_path, "site-1", record("48,852", "Cacheable", "ERROR", "failed to download object with ref 1: gone"))
    assert cause_line(tmp_path) is None
    (line,) = failure_lines(tmp_path)
    assert line == f"prrfl: no cause found in the job's logs; read {server}, {site}"
    assert failure_lines(tmp_path / "absent") == [f"prrfl: no cause found: no log file of the job under {tmp_path / 'absent'}"]


def test_reading_the_logs_never_raises(tmp_path, monkeypatch):
    from prrfl.flare import failure

    write_log(tmp_path, "server", "2026-13-45 99:00:00,000 - x - ERROR - no time at all\n", *server_lines())
    assert cause_line(tmp_path) is None  # a line whose stamp is no time is not a record

    def broken(*args, **kwargs):
        raise RuntimeError("a bug")

    monkeypatch.setattr(failure, "find_cause", broken)
    assert failure_lines(tmp_path) == [f"prrfl: no cause found: reading the job's logs under {tmp_path} failed (RuntimeError: a bug)"]


def test_older_logs_and_rotated_parts(tmp_path):
    """A log written before the run started is another run's; a rotated log's older part (log.txt.1) comes first."""
    old = write_log(tmp_path, "site-1", record("10,000", "site", "ERROR", "an earlier run's error"))
    os.utime(old, (time.time() - 3600, time.time() - 3600))
    assert cause_line(tmp_path, since=time.time() - 60) is None
    write_log(tmp_path, "site-2", record("40,000", "site", "ERROR", "the newer part's error"))
    (tmp_path / "site-2" / "log.txt.1").write_text(record("20,000", "site", "ERROR", "site site-2: the older part's error"))
    assert log_files(tmp_path / "site-2") == [tmp_path / "site-2" / "log.txt.1", tmp_path / "site-2" / "log.txt"]
    assert cause_line(tmp_path, since=time.time() - 60) == "site-2: the older part's error"


def test_a_poc_jobs_logs_are_its_own(tmp_path):
    """In a POC workspace, each participant's log of the job is <participant>/<job id>/log.txt; other jobs' are not read."""
    prod = tmp_path / "example_project" / "prod_00"
    write_log(prod / "site-1", "other-job", record("10,000", "site", "ERROR", "another job's error"))
    write_log(prod / "site-1", "job-1", record("40,000", "site", "ERROR", "site site-1: task 'prepare' failed") + SITE_TRACEBACK)
    assert (
        cause_line(tmp_path, job_id="job-1") == "site-1: ValueError: site site-2: option 'det_split' must be 'train' or 'valid', got 'tset'"
    )


def test_prrfl_run_ends_on_the_cause_then_the_exit_status(tmp_path, capsys, monkeypatch):
    """A simulator that exits non-zero: the cause, its log file, then the exit status line (exit status 1)."""
    from prrfl import cli
    from prrfl.flare.job_recipe import PersonalizedRecipe

    ws = tmp_path / "derm_prr"

    def failed_simulation(self, env, **kwargs):
        write_log(
            ws, "server", *server_lines(record("40,000", "PersonalizedWorkflow", "ERROR", "site-2 cannot take part in this run", CTX))
        )
        write_log(ws, "site-2", record("35,250", "site", "ERROR", "site site-2: task 'prepare' failed") + SITE_TRACEBACK)
        env.last_run_failed = True  # as FLARE's SimEnv.deploy sets it
        raise RuntimeError(
            f"Simulation failed with return code 2. Logs are in per-site subdirectories under {ws}, e.g. server/simulate_job/log.txt"
        )

    monkeypatch.setattr(PersonalizedRecipe, "run", failed_simulation)
    assert cli.main(["run", "derm_prr", "--workspace", str(tmp_path)]) == 1
    assert capsys.readouterr().err.splitlines()[-3:] == [
        "prrfl: cause: site-2: ValueError: option 'det_split' must be 'train' or 'valid', got 'tset'",
        f"prrfl: from line 1 of {ws / 'site-2' / 'log.txt'}",
        "prrfl: error: job derm_prr: Simulation failed with return code 2",
    ]


@pytest.mark.parametrize("last_run_failed", [False, True])
def test_a_failure_before_the_simulator_ran_keeps_flares_message(tmp_path, capsys, monkeypatch, last_run_failed):
    from prrfl import cli
    from prrfl.flare.job_recipe import PersonalizedRecipe

    def failed(self, env, **kwargs):
        env.last_run_failed = last_run_failed
        raise RuntimeError("Simulation failed with return code 1. Logs are in per-site subdirectories")

    monkeypatch.setattr(PersonalizedRecipe, "run", failed)
    assert cli.main(["run", "derm_prr", "--workspace", str(tmp_path)]) == 1
    err = capsys.readouterr().err.splitlines()
    if last_run_failed:
        assert err == [
            f"prrfl: no cause found: no log file of the job under {tmp_path / 'derm_prr'}",
            "prrfl: error: job derm_prr: Simulation failed with return code 1",
        ]
    else:
        assert err == ["prrfl: error: job derm_prr: Simulation failed with return code 1. Logs are in per-site subdirectories"]


class FailedJob:
    """What a recipe's run on a PocEnv or ProdEnv returns, for a job that ended in failure."""

    def __init__(self, result: Path):
        self.result = result

    def get_job_id(self) -> str:
        return "job-1"

    def get_result(self, timeout: float = 0.0, clean_up: bool = False) -> str:
        return str(self.result)

    def get_status(self) -> str:
        return "FINISHED:EXECUTION_EXCEPTION"


def test_a_poc_or_production_job_that_fails_prints_its_cause_before_its_status(tmp_path, capsys, monkeypatch):
    from prrfl.errors import CommandFailed
    from prrfl.flare.job_recipe import PersonalizedRecipe, environment, run_recipe

    recipe = PersonalizedRecipe(task="derm", method="fedavg")
    poc = environment("poc", 2)
    poc.poc_workspace = str(tmp_path / "poc")
    prod = tmp_path / "poc" / "example_project" / "prod_00"
    write_log(prod / "site-1", "job-1", PRINTED_SITE_LOG)
    download = tmp_path / "download" / "job-1" / "workspace"
    write_log(tmp_path / "download" / "job-1", "workspace", REAL_SERVER_LOG)
    for env, result, want in (
        (poc, download, f"prrfl: cause: site-1: FileNotFoundError: {MISSING} (data_root: "),
        (object(), download.parent, f"prrfl: cause: server: site-1 cannot take part in this run: FileNotFoundError: {MISSING}"),
    ):
        monkeypatch.setattr(recipe, "run", lambda env, result=result: FailedJob(result))
        with pytest.raises(CommandFailed, match=r"^job job-1 \(derm_fedavg\) ended FINISHED:EXECUTION_EXCEPTION; its server workspace is "):
            run_recipe(recipe, env)
        cause, where = capsys.readouterr().err.splitlines()
        assert cause.startswith(want), cause
        assert where.startswith("prrfl: from line ") and where.endswith("log.txt")
