"""Wall time of a job in the FLARE simulator, README's way, and where it goes.

    python benchmarks/default_job.py [job] [--sites N] [--cache cold|warm|both] [--work DIR] [--set key=value ...]

Runs `nvflare simulator jobs/<job> -w <work>/ws -n N -t N` (the default: README's first command, derm_prr on 4
sites) from the simulator's start to its end, with an empty data cache (`cold`: the federation is generated first,
as on a fresh clone), a filled one (`warm`) or both, one after the other. `--set` exports the job with changed
settings first (`prrfl jobs export`), e.g. `--set num_rounds=2`. Then it prints, from the sites' results files and
the simulator's log:

* the wall time, and the time before the first round (FLARE's start, the sites' data loading or generation);
* per round, the slowest site's round split into its phases (`prrfl.site.trainer.PHASES`: training, each
  evaluation, the upload) and what the round's wall time holds beyond it: FLARE's messaging, the sites' waiting
  for each other, the checkpoint and the server's aggregation;
* after the last round: FLARE's cross-site evaluation and the simulator's end;
* each site's mean test metrics at its best validation round.

A benchmark, not a test: the figures depend on the machine and its load (compare runs made one after the other).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

from prrfl.registry import task_class
from prrfl.site.trainer import PHASES

ROOT = Path(__file__).resolve().parents[1]
STAMP = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3})")
ROUND_DONE = re.compile(r"round (\d+) done")


def stamp(line: str) -> float | None:
    m = STAMP.match(line)
    return datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp() if m else None


def log_marks(log_text: str) -> dict[str, float]:
    """Seconds since the first stamped line of the simulator's log: each `round N done` and the log's last line."""
    marks: dict[str, float] = {}
    first = last = None
    for line in log_text.splitlines():
        t = stamp(line)
        if t is None:
            continue
        first = t if first is None else first
        last = t
        m = ROUND_DONE.search(line)
        if m and "server RSS" in line:
            marks.setdefault(f"round {m.group(1)}", t - first)
    if first is not None:
        marks["end"] = last - first
    return marks


def run_job(job_dir: Path, work: Path, sites: int, cache: Path) -> tuple[float, str]:
    ws = work / "ws"
    shutil.rmtree(ws, ignore_errors=True)
    env = {**os.environ, "PRRFL_CACHE": str(cache), "PYTHONUNBUFFERED": "1"}
    cmd = [sys.executable, "-m", "nvflare.cli", "simulator", str(job_dir), "-w", str(ws), "-n", str(sites), "-t", str(sites)]
    tick = time.perf_counter()
    done = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    wall = time.perf_counter() - tick
    (work / "sim.log").write_text(done.stdout)
    if done.returncode != 0:
        sys.exit(f"the simulator failed (exit {done.returncode}); its log: {work / 'sim.log'}")
    return wall, done.stdout


def site_results(ws: Path) -> list[dict]:
    found = [json.loads(p.read_text()) for p in sorted(ws.rglob("prrfl/*/results.json"))]
    return sorted((r for r in found if "site" in r and "history" in r), key=lambda r: r["cohort"])


def report(label: str, wall: float, log_text: str, results: list[dict]) -> None:
    marks = log_marks(log_text)
    per_site = [[h["timing"] for h in r["history"] if h["kind"] == "round"] for r in results]
    rounds = len(per_site[0])
    print(f"\n## {label}: {wall:.0f} s wall ({int(wall // 60)} min {wall % 60:.0f} s), {len(results)} sites, {rounds} rounds\n")
    print("| round | wall s | slowest site s | " + " | ".join(PHASES) + " | beyond the site's round s |")
    print("|---|---|---|" + "---|" * len(PHASES) + "---|")
    previous = None
    for i, timings in enumerate(zip(*per_site)):
        slowest = max(timings, key=lambda t: t["round_seconds"])
        done = marks.get(f"round {i}")
        round_wall = None if done is None or (i > 0 and previous is None) else done - (previous or 0.0)
        phases = " | ".join(f"{slowest.get('phases', {}).get(p, float('nan')):.1f}" for p in PHASES)
        beyond = "" if round_wall is None or i == 0 else f"{round_wall - slowest['round_seconds']:.1f}"
        shown = "" if round_wall is None or i == 0 else f"{round_wall:.1f}"
        print(f"| {i} | {shown} | {slowest['round_seconds']:.1f} | {phases} | {beyond} |")
        previous = done
    first_done, last_done = marks.get("round 0"), marks.get(f"round {rounds - 1}")
    if first_done is not None:
        print(f"\nuntil round 0 is done: {first_done:.1f} s (FLARE's start, the sites' data, round 0)")
    if last_done is not None and "end" in marks:
        print(
            f"after the last round (last aggregate's score, cross-site evaluation, the simulator's end): {marks['end'] - last_done:.1f} s"
        )
    totals = {p: sum(t.get("phases", {}).get(p, 0.0) for ts in per_site for t in ts) for p in PHASES}
    site_seconds = sum(totals.values())
    print(
        "all sites' round time by phase (share): "
        + ", ".join(f"{p} {v:.0f} s ({100 * v / site_seconds:.0f} %)" for p, v in totals.items() if v > 0)
    )
    speeds = [t["train_images_per_second"] for ts in per_site for t in ts]
    print(f"training images/s per site (every model counted): median {statistics.median(speeds):.1f}")
    metrics = task_class(results[0]["task"]).metric_names[:2]
    best = [r["best"]["test"] for r in results if r.get("best")]
    if best:
        print(
            "mean test at each site's best validation round: "
            + " / ".join(f"{m} {statistics.mean(b[m] for b in best):.2f}" for m in metrics)
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("job", nargs="?", default="derm_prr")
    parser.add_argument("--sites", type=int, default=None, help="default: the job's task's number of sites")
    parser.add_argument("--cache", choices=("cold", "warm", "both"), default="both")
    parser.add_argument("--work", type=Path, default=None, help="default: a new temporary folder")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="export the job with this setting")
    args = parser.parse_args(argv)
    work = args.work or Path(tempfile.mkdtemp(prefix=f"prrfl_{args.job}_"))
    work.mkdir(parents=True, exist_ok=True)
    job_dir = ROOT / "jobs" / args.job
    if args.set:
        sets = [a for s in args.set for a in ("--set", s)]
        subprocess.run([sys.executable, "-m", "prrfl.cli", "jobs", "export", args.job, "--out", str(work / "jobs"), *sets], check=True)
        job_dir = work / "jobs" / args.job
    server = json.loads((job_dir / "app" / "config" / "config_fed_server.json").read_text())
    task = next(w["args"]["config"]["task"] for w in server["workflows"] if "config" in w.get("args", {}))
    sites = args.sites or len(task_class(task).site_names)
    cache = work / "cache"
    for which in ("cold", "warm") if args.cache == "both" else (args.cache,):
        if which == "cold":
            shutil.rmtree(cache, ignore_errors=True)
        wall, log_text = run_job(job_dir, work, sites, cache)
        report(f"{args.job}, data cache {which}", wall, log_text, site_results(work / "ws"))
    print(f"\n(workspace and log: {work})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
