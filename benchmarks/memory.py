"""Memory of a site and of the server, measured (figures in README, "Memory").

    python benchmarks/memory.py site [--job derm_prr] [--set KEY=VALUE ...] [--chunks 256,64] [--cohort B]
    python benchmarks/memory.py server [--rounds 30]

site: the peak RSS of one site process that loads its data, trains one round and evaluates (valid and
test, every epoch's test, the round's end: what a round does), once per evaluation chunk size
(`eval_batch_size`, a site setting), each in a fresh process. Default: the full-size dermoscopy site
at 128 px (--set data.synthetic_scale=1.0 --set data.image_size=128, Table I sizes), the site with the
most training images unless --cohort says which. The data is built (cached under PRRFL_CACHE) first.

server: a tiny derm_fedavg job (2 sites, 32 px, 2 % of Table I) for --rounds rounds x 1 epoch in the
simulator; the server logs its RSS at the end of every round, and the script prints it per round and
the growth from round 1 to the last (round 0 includes one-time imports and allocations).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

FULL_SIZE = ["data.synthetic_scale=1.0", "data.image_size=128"]
TINY = ["data.image_size=32", "data.synthetic_scale=0.02", "data.synthetic_raw_size=[96,72]", "local_epochs=1"]


def config(job: str, overrides: list[str]):
    from prrfl.config import apply_overrides
    from prrfl.flare.jobs import job_config
    from prrfl.registry import validate_job

    return validate_job(job, apply_overrides(job_config(job).to_dict(), overrides))


def one_site(job: str, overrides: list[str], cohort: str, chunk: int) -> dict:
    """In this process: load the site, train one round, evaluate; the process's peak RSS."""
    import psutil
    import torch

    from prrfl.messages import Download
    from prrfl.registry import build_method, build_task
    from prrfl.site.state import SiteRuntime
    from prrfl.site.trainer import run_round

    cfg = config(job, overrides + ["num_rounds=1", "local_epochs=1"])
    task, device = build_task(cfg), torch.device("cpu")
    method = build_method(cfg, task)
    data = task.load_site(cohort, device, None)
    after_data = psutil.Process().memory_info().rss
    with tempfile.TemporaryDirectory() as state:
        site = SiteRuntime.start("site", cfg, task, method, data, Path(state), model_seed=cfg.seed, run_id="memory", eval_batch_size=chunk)
        # the first download as the workflow sends it: the initial model, the round, the federation's class counts
        initial = Download(params=site.models[method.roles[0]].state_dict(), round=0, global_class_counts=data.class_counts)
        tick = time.perf_counter()
        run_round(site, initial, 0)
        seconds = time.perf_counter() - tick
    return {
        "cohort": cohort,
        "eval_batch_size": chunk,
        "train": len(data.train),
        "valid": len(data.valid),
        "test": len(data.test),
        "rss_after_data_mib": after_data / 2**20,
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**10,  # KiB on Linux
        "round_seconds": seconds,
    }


def largest_cohort(job: str, overrides: list[str]) -> str:
    import torch

    from prrfl.registry import build_task

    task = build_task(config(job, overrides))
    sizes = {c: task.load_site(c, torch.device("cpu"), None).num_train for c in task.site_names}
    return max(sizes, key=sizes.get)


def site(args: argparse.Namespace) -> None:
    from prrfl.registry import build_task

    overrides = FULL_SIZE + args.set
    tick = time.perf_counter()
    build_task(config(args.job, overrides)).prepared_root(None, workers=os.cpu_count() or 1)
    print(f"data ready in {time.perf_counter() - tick:.0f} s", flush=True)
    cohort = args.cohort or largest_cohort(args.job, overrides)
    print(f"{args.job} {' '.join(overrides)}, site {cohort}, one round of 1 epoch, CPU, {os.cpu_count()} cores")
    print("| eval_batch_size | train / valid / test images | RSS after loading the data (MiB) | peak RSS (MiB) | round (s) |")
    print("|---|---|---|---|---|")
    for chunk in args.chunks:
        command = [sys.executable, __file__, "_one", "--job", args.job, "--cohort", cohort, "--chunk", str(chunk)]
        command += [a for o in overrides for a in ("--set", o)]
        out = subprocess.run(command, capture_output=True, text=True, check=True).stdout
        r = json.loads(out.strip().splitlines()[-1])
        print(
            f"| {chunk} | {r['train']} / {r['valid']} / {r['test']} | {r['rss_after_data_mib']:.0f} | "
            f"{r['peak_rss_mib']:.0f} | {r['round_seconds']:.0f} |",
            flush=True,
        )


def server(args: argparse.Namespace) -> None:
    from prrfl.flare.job_recipe import export_job
    from prrfl.sweep import simulator_command

    work = Path(tempfile.mkdtemp(prefix="prrfl_memory_"))
    cfg = config("derm_fedavg", TINY + [f"num_rounds={args.rounds}"])
    job = export_job("derm_fedavg", work / "jobs", cfg=cfg)
    env = {**os.environ, "PRRFL_CACHE": os.environ.get("PRRFL_CACHE", str(work / "cache")), "PYTHONUNBUFFERED": "1"}
    tick = time.perf_counter()
    proc = subprocess.run(simulator_command(job, work / "ws", 2), env=env, capture_output=True, text=True)
    log = proc.stdout + proc.stderr
    rss = {int(m[1]): float(m[2]) for m in re.finditer(r"round (\d+) done \(server RSS (\d+) MiB\)", log)}
    if proc.returncode != 0 or len(rss) != args.rounds:
        raise SystemExit(f"the run failed or logged {len(rss)} of {args.rounds} rounds; see {work}")
    print(f"tiny derm_fedavg, 2 sites, {args.rounds} rounds x 1 epoch, {time.perf_counter() - tick:.0f} s; server RSS (MiB) per round:")
    print(" ".join(f"{r}:{v:.0f}" for r, v in sorted(rss.items())))
    first, last = rss[1], rss[args.rounds - 1]
    growth = (last - first) / max(args.rounds - 2, 1)
    print(f"round 1 {first:.0f} MiB, round {args.rounds - 1} {last:.0f} MiB: {growth:+.2f} MiB per round")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="mode", required=True)
    s = sub.add_parser("site")
    s.add_argument("--job", default="derm_prr")
    s.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    s.add_argument("--chunks", type=lambda t: [int(x) for x in t.split(",")], default=[256, 64])
    s.add_argument("--cohort")
    one = sub.add_parser("_one")  # the measured process
    one.add_argument("--job", required=True)
    one.add_argument("--set", action="append", default=[])
    one.add_argument("--cohort", required=True)
    one.add_argument("--chunk", type=int, required=True)
    srv = sub.add_parser("server")
    srv.add_argument("--rounds", type=int, default=30)
    args = parser.parse_args()
    if args.mode == "_one":
        print(json.dumps(one_site(args.job, args.set, args.cohort, args.chunk)))
    elif args.mode == "site":
        site(args)
    else:
        server(args)


if __name__ == "__main__":
    main()
