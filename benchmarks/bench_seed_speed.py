"""A kept bench run trained again with today's code: the same numbers, and how much faster.

    python benchmarks/bench_seed_speed.py docs/results/heldout/derm/prr_s1.kept.json.gz [--workdir DIR]

Runs the kept run's own config (its done marker: every setting, the seed, the number of sites) in the FLARE simulator,
every site a thread as `prrfl sweep` runs it, then compares what the kept run holds with the new run's files read by
today's keep rules (prrfl.report.keep; the kept run read by them too), member by member and value by value. What a run's clock or identity writes
(`simulator_seconds`, a run's random `run_id`, wall-clock `seconds` and `timing` fields, the `code_commit` it ran
with, the `file` paths of what it saved) is left out of the
comparison. Prints the kept run's simulator wall time, the new one's and their ratio; exits 1 when a number differs.
The synthetic federation is built before the timed run (PRRFL_CACHE, else <workdir>/cache), so the figure is the
training job alone, as in a sweep whose federation is cached.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from keep_results import members

from prrfl import kept
from prrfl.crosseval import write_crosseval
from prrfl.flare.job_recipe import export_job
from prrfl.registry import build_task, validate_config
from prrfl.report.keep import slim
from prrfl.storage import kept_members
from prrfl.sweep import config_differences, job_name, run_logged, simulator_command

# what a run's clock or identity writes: its times, its random id, the commit of its code, where it saved its files
CLOCK_KEYS = {"simulator_seconds", "run_id", "seconds", "timing", "wall_seconds", "started", "finished", "code_commit", "file"}


def without_clock(value: Any) -> Any:
    """`value` less every field a run's clock or identity writes, at any depth."""
    if isinstance(value, dict):
        return {k: without_clock(v) for k, v in value.items() if k not in CLOCK_KEYS}
    if isinstance(value, list):
        return [without_clock(v) for v in value]
    return value


def differences(old: Any, new: Any, where: str = "", limit: int = 5) -> list[str]:
    """Where `new` differs from `old` (at most `limit` places), each as 'path: old -> new'."""
    found: list[str] = []

    def walk(a: Any, b: Any, path: str) -> None:
        if len(found) >= limit:
            return
        if isinstance(a, dict) and isinstance(b, dict):
            for key in sorted(set(a) | set(b), key=str):
                walk(a.get(key, "<absent>"), b.get(key, "<absent>"), f"{path}.{key}")
        elif isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
            for i, (x, y) in enumerate(zip(a, b)):
                walk(x, y, f"{path}[{i}]")
        elif a != b and not (a != a and b != b):  # NaN equals NaN here
            found.append(f"{path}: {a!r:.60} -> {b!r:.60}")

    walk(old, new, where)
    return found


def compared(old: Any, new: Any, name: str) -> list[str]:
    """Where the new run's file `name` differs from the kept one's: a results file's config as prrfl sweep compares a
    finished run's (settings the kept run's code did not know yet count at their defaults), the rest value by value."""
    if not (isinstance(old, dict) and isinstance(new, dict) and "config" in old and "config" in new):
        return [f"{name}{d}" for d in differences(old, new)]
    rest = [f"{name}{d}" for d in differences(*({k: v for k, v in x.items() if k != "config"} for x in (old, new)))]
    return [f"{name}.config {d}" for d in config_differences(old["config"], validate_config(new["config"]))] + rest


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("kept_run", type=Path, help="a <run>.kept.json.gz of a bench")
    parser.add_argument("--workdir", type=Path, default=None, help="where the new run goes (default: a temporary folder)")
    args = parser.parse_args(argv)
    stored = kept_members(args.kept_run)
    done = kept.member(stored, kept.DONE_MEMBER, args.kept_run)
    cfg, sites = validate_config(done["config"]), int(done["sites"])
    work = args.workdir or Path(tempfile.mkdtemp(prefix="bench_seed_speed_"))
    os.environ.setdefault("PRRFL_CACHE", str(work / "cache"))
    name = kept.run_name(args.kept_run)
    build_task(cfg).prepared_root(None)  # the synthetic federation built before the clock starts (a cached sweep's case)
    job = export_job(job_name(cfg.task, cfg.method), work / "jobs" / name, cfg=cfg)
    run = work / name
    start = time.perf_counter()
    status = run_logged(simulator_command(job, run, sites), work / f"{name}.log")
    wall = time.perf_counter() - start
    if status:
        print(f"{name}: the simulator failed (exit status {status}); see {work / f'{name}.log'}", file=sys.stderr)
        return 1
    write_crosseval(run)  # the run's own crosseval.json, as prrfl sweep writes it after the simulator
    fresh = members(run)
    problems = []
    for member_name in sorted(n for n in stored if n != kept.DONE_MEMBER):
        if member_name not in fresh:
            problems.append(f"{member_name}: not written by the new run")
            continue
        old = without_clock(slim(kept.member(stored, member_name, args.kept_run)))  # today's rules: a run kept by older ones holds more
        new = without_clock(slim(fresh[member_name]))
        problems += compared(old, new, member_name)
    before = done.get("simulator_seconds")
    print(f"{name} ({cfg.task}, {cfg.method}, seed {cfg.seed}, {cfg.num_rounds} rounds x {cfg.local_epochs} epochs, {sites} sites)")
    print(f"  kept run:  {before:.0f} s simulator wall time" if before else "  kept run:  no wall time recorded")
    print(f"  this run:  {wall:.0f} s simulator wall time" + (f"  ({before / wall:.2f}x faster)" if before else ""))
    if problems:
        print(f"  numbers: DIFFERENT ({len(problems)} shown)")
        for p in problems:
            print(f"    {p}")
        return 1
    print(f"  numbers: identical ({len(stored) - 1} files of the kept run, every value but the clock's)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
