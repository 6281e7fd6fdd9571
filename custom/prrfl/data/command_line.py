"""The frame of the data command lines (`python -m prrfl.tasks.<task> <command> ...`).

Each data package's `__main__` adds its subcommands to `command_parser` and hands its handler to
`run_main`: an expected error is one line on stderr and exit status 2 (prrfl.errors, as for the
`prrfl` command line). Light on purpose (no torch), as the data command lines start worker processes.
"""

from __future__ import annotations

import argparse
import logging
import time
from collections.abc import Callable

from prrfl.data.manifest import PreparedManifest
from prrfl.errors import EXIT_STATUS, run_command, traceback_option


def command_parser(package: str, doc: str | None) -> tuple[argparse.ArgumentParser, argparse.ArgumentParser, Callable]:
    """(parser of `python -m <package>`, parent parser giving --traceback to a subcommand, add_parser).

    `doc` (the package's `__main__` docstring) is the --help description.
    """
    p = argparse.ArgumentParser(
        prog=f"python -m {package}",
        description=doc,
        epilog=EXIT_STATUS,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    common = traceback_option(p)
    sub = p.add_subparsers(dest="cmd", required=True)
    return p, common, sub.add_parser


def run_main(parser: argparse.ArgumentParser, run: Callable[[argparse.Namespace], int], argv: list[str] | None) -> int:
    """Parse `argv`, set up logging (-v: debug) and run `run(args)`; returns the exit status.

    Exit status and error format: prrfl.errors.EXIT_STATUS (the --help epilog).
    """
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    return run_command(lambda: run(args), args.traceback)


def print_prepared(manifest: PreparedManifest, out: str, t0: float) -> None:
    """What `prepare` prints: the manifest's table, its warnings, and where and how fast it prepared."""
    print(manifest.table())
    for w in manifest.data["warnings"]:
        print(f"warning: {w}")
    print(f"prepared {out} (config {manifest.config_hash}) in {time.perf_counter() - t0:.1f} s")
