"""How the command lines (`prrfl`, `python -m prrfl.tasks.derm`) end: one readable line per error.

An expected failure (a bad value in a job, a missing, empty or unreadable file, a run that failed)
is reported as `prrfl: error: <message>` on stderr, the message naming the file or config field,
with an exit status that tells a script what happened (EXIT_STATUS). The traceback is for
developers: `--traceback` or PRRFL_TRACEBACK=1 adds it. Any other exception is a bug and keeps its
traceback. Light on purpose (no torch), as the data command line starts image worker processes.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import traceback
from collections.abc import Callable

EXIT_STATUS = """\
exit status:
  0    done
  1    the command ran and its outcome is a failure (a sweep's or a deployment's run failed, job
       folders out of date)
  2    refused: bad arguments, configuration or input (a missing, empty or unreadable file)
  130  interrupted (Ctrl-C)
  143  stopped by SIGTERM (`timeout`, systemd, a batch scheduler, `kill`): `prrfl run` first stops every
       process it started
An error is one line on stderr, "prrfl: error: <message>", naming the file or the config field;
--traceback (or the environment variable PRRFL_TRACEBACK=1) adds the Python traceback."""


class Interrupted(KeyboardInterrupt):
    """Ctrl-C (SIGINT) or SIGTERM (`signum`), with what to do next (`hint`), printed after the line of
    `interruption`."""

    def __init__(self, hint: str, signum: int = signal.SIGINT):
        super().__init__(hint)
        self.hint = hint
        self.signum = signum


def interruption(signum: int = signal.SIGINT, hint: str = "") -> tuple[str, int]:
    """The line a command prints when a signal ended it, and its exit status (128 + the signal's number):
    "prrfl: interrupted" and 130 for Ctrl-C (SIGINT), "prrfl: stopped by SIGTERM" and 143 for SIGTERM."""
    what = "interrupted" if signum == signal.SIGINT else f"stopped by {signal.Signals(signum).name}"
    return f"prrfl: {what}{'; ' + hint if hint else ''}", 128 + signum


class CommandFailed(RuntimeError):
    """The command ran and its outcome is a failure (exit status 1), as opposed to an input it refused (2)."""


def traceback_option(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add --traceback to `parser`; returns a parent parser that gives it to the subcommands too,
    so that it may follow the command (`prrfl jobs export --traceback`)."""
    text = "on an error, print the Python traceback too (also: PRRFL_TRACEBACK=1)"
    parser.add_argument("--traceback", action="store_true", help=text)
    parent = argparse.ArgumentParser(add_help=False)
    parent.add_argument("--traceback", action="store_true", default=argparse.SUPPRESS, help=text)  # keeps the main default
    return parent


def traceback_wanted(flag: bool) -> bool:
    return flag or os.environ.get("PRRFL_TRACEBACK", "") not in ("", "0")


def is_expected(error: BaseException) -> bool:
    """A failure the user can act on from its message alone. A KeyError counts only when it carries
    a sentence: a bare missing key ('global_params') is a bug and needs its traceback."""
    if isinstance(error, KeyError):
        return bool(error.args) and isinstance(error.args[0], str) and " " in error.args[0]
    return isinstance(error, (CommandFailed, ValueError, OSError))


def error_message(error: BaseException) -> str:
    """The message on one line: an OSError as '<file>: <reason>', a KeyError without repr quotes."""
    if isinstance(error, OSError) and error.strerror and error.filename:
        text = f"{error.filename}: {error.strerror}"
    elif isinstance(error, KeyError):
        text = str(error.args[0])
    else:
        text = str(error) or type(error).__name__
    return " ".join(text.split())


def run_command(command: Callable[[], int], show_traceback: bool = False) -> int:
    """Run a command line's handler; returns its exit status, or the one of the error it raised."""
    show_traceback = traceback_wanted(show_traceback)
    try:
        return command()
    except KeyboardInterrupt as e:
        if show_traceback:
            traceback.print_exc()
        line, status = interruption(getattr(e, "signum", signal.SIGINT), getattr(e, "hint", ""))
        print(line, file=sys.stderr)
        return status
    except Exception as e:
        if not is_expected(e):
            raise
        if show_traceback:
            traceback.print_exc()
        print(f"prrfl: error: {error_message(e)}", file=sys.stderr)
        return 1 if isinstance(e, CommandFailed) else 2
