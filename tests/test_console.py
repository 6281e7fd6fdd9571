"""FLARE's plumbing off the console (prrfl.flare.console): what is dropped, what is kept, the switch."""

from __future__ import annotations

import io
import logging

import pytest

from prrfl.flare import console


@pytest.fixture
def root():
    """A logger standing for a process's root: one console handler and one file-like handler."""
    logger = logging.getLogger("test_console_root")
    logger.propagate, logger.level = False, logging.DEBUG
    screen, log_file = io.StringIO(), io.StringIO()
    shown = logging.StreamHandler(screen)

    class FileLike(logging.FileHandler):  # a FileHandler that writes to memory: FLARE's log.txt
        def __init__(self):
            logging.Handler.__init__(self)
            self.stream = log_file

        def emit(self, record):
            logging.StreamHandler.emit(self, record)

    logger.handlers = [shown, FileLike()]
    yield logger, screen, log_file
    logger.handlers = []


def emit(logger: logging.Logger, name: str, level: int, msg: str) -> None:
    record = logger.makeRecord(name, level, __file__, 1, msg, (), None)
    logger.handle(record)


RECORDS = [
    ("nvflare.fuel.f3.streaming.cacheable", logging.INFO, "set transaction info: tx_id='T1'"),
    ("nvflare.app_common.executors.client_api_executor.ClientAPIExecutor", logging.INFO, "execute for task (train)"),
    ("prrfl.flare.server_workflow.PersonalizedWorkflow", logging.INFO, "Sending task train to ['site-1']"),
    ("prrfl.flare.server_workflow.PersonalizedWorkflow", logging.INFO, "round 0 done"),
    ("nvflare.private.fed.server.server_runner", logging.WARNING, "client site-2 is lost"),
    ("nvflare.app_common.workflows", logging.DEBUG, "a debug line"),
    ("hello_pt.client", logging.INFO, "my own line"),
]


def test_quiet_drops_flares_info_from_the_console_and_keeps_the_log_file_whole(root, monkeypatch):
    logger, screen, log_file = root
    monkeypatch.delenv(console.ENV, raising=False)
    assert console.quiet_flare_console(logger) is True
    assert console.quiet_flare_console(logger) is True  # twice: still one filter
    assert sum(isinstance(f, console.FlarePlumbing) for f in logger.handlers[0].filters) == 1
    assert not logger.handlers[1].filters  # the log file is not filtered
    for record in RECORDS:
        emit(logger, *record)
    assert screen.getvalue().splitlines() == ["round 0 done", "client site-2 is lost", "my own line"]
    assert log_file.getvalue().splitlines() == [msg for _, _, msg in RECORDS]


@pytest.mark.parametrize("value", ["full", "FULL ", "loud"])
def test_full_or_an_unknown_value_leaves_the_console_as_flare_made_it(root, monkeypatch, value, caplog):
    logger, screen, _ = root
    monkeypatch.setenv(console.ENV, value)
    assert console.quiet_flare_console(logger) is False
    for record in RECORDS:
        emit(logger, *record)
    assert len(screen.getvalue().splitlines()) == len(RECORDS)
    if value == "loud":
        assert "PRRFL_FLARE_LOG='loud' is not one of ['quiet', 'full']" in caplog.text
