"""FLARE's plumbing kept off the console, not out of the logs.

A FLARE job's console is mostly FLARE's own messaging: per round and site, "Sending task train to [...]", "set
transaction info", "object has been downloaded", "execute for task", "sending task data to in-process trainer",
"waiting for result", "Finished one task run": about 30 INFO lines a round of 4 sites, where the job's own round,
its metrics and every warning are a handful. `quiet_flare_console()` puts a filter on the console handlers of the
process it runs in (the simulator's or a deployment's server process, each site's process) that drops FLARE's
INFO and DEBUG records; warnings and errors, every prrfl record and every log file (`log.txt`, which FLARE writes
through its file handlers) keep everything.

The switch is the environment variable PRRFL_FLARE_LOG: `quiet` (the default) or `full` (FLARE's console as
FLARE configures it, e.g. for `nvflare simulator -l verbose`).
"""

from __future__ import annotations

import logging
import os

ENV = "PRRFL_FLARE_LOG"
CHOICES = ("quiet", "full")
# FLARE's base controller logs each task it sends through the controller's own logger (a prrfl or a user's class)
PLUMBING_MESSAGES = ("Sending task ",)


class FlarePlumbing(logging.Filter):
    """Drops FLARE's INFO and DEBUG records (loggers under `nvflare`, and the base controller's "Sending task" line);
    passes everything else."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno >= logging.WARNING:
            return True
        if record.name == "nvflare" or record.name.startswith("nvflare."):
            return False
        return not (isinstance(record.msg, str) and record.msg.startswith(PLUMBING_MESSAGES))


def console_mode() -> str:
    """PRRFL_FLARE_LOG's value, `quiet` when unset; another value leaves FLARE's console as it is, with a warning that
    names the variable and its values."""
    mode = os.environ.get(ENV, "quiet").strip().lower() or "quiet"
    if mode not in CHOICES:
        logging.getLogger(__name__).warning(
            "%s=%r is not one of %s: FLARE's console is left as FLARE configured it", ENV, os.environ[ENV], list(CHOICES)
        )
        return "full"
    return mode


def is_console(handler: logging.Handler) -> bool:
    return isinstance(handler, logging.StreamHandler) and not isinstance(handler, logging.FileHandler)


def quiet_flare_console(logger: logging.Logger | None = None) -> bool:
    """The plumbing filter on every console handler of `logger` (the root logger: where FLARE puts its console), once.
    True when the console is quiet; False with PRRFL_FLARE_LOG=full."""
    if console_mode() == "full":
        return False
    for handler in (logger or logging.getLogger()).handlers:
        if is_console(handler) and not any(isinstance(f, FlarePlumbing) for f in handler.filters):
            handler.addFilter(FlarePlumbing())
    return True
