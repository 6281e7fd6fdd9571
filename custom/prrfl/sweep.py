"""`prrfl sweep`: several methods x seeds, one after another in the FLARE simulator, then the report.

Thin orchestration, so a comparison is one command and nothing in it is special to sweeps: each run
is an exported job folder (<task>_<method> with the seed and the --set overrides applied) run by one
`nvflare simulator` process, and the report is rebuilt from the runs' results files by
prrfl.report, exactly as `prrfl report` does for hand-made runs. Layout under the sweep folder:

    jobs/<method>_s<seed>/<task>_<method>/ the job that ran (its config is the record of the run)
    <method>_s<seed>/                      the simulator workspace
    <method>_s<seed>.log                   the simulator's output
    <method>_s<seed>.done.json             the config of a run that finished and its simulator's wall time (written last)
    <method>_s<seed>/prrfl/<run>/crosseval.json   FCA's generalization/specialization protocol (prrfl.crosseval)
    report/                                report.md, results_long.csv, retrogress.csv, PNGs

All jobs are exported before the first run starts, so an unknown method or a bad override fails in
seconds rather than after hours of training. The run name carries the seed, so the sites' state
folders of different seeds never collide. A sweep started again on the same folder skips each run
that finished with the same config (its .done.json; config_differences: a data default named or left out
is the same), so a long sweep can be spread over several sittings: run the same command again and it goes on
with the first run not yet done.

`--profile` picks the settings of every job: "quick" (the committed jobs), "bench" (the benchmark,
5 local epochs per round, 12 rounds on dermoscopy and 6 on prostate; the BENCH profiles of prrfl.tasks.derm.task and prrfl.tasks.prostate.task) or "paper";
--set overrides apply on top.

Run time on a 2-core CPU (no GPU) with the quick jobs (4 sites, synthetic federation at 8 % of
Table I, 64 px, 5 rounds x 2 epochs): one PRR run takes 3.5 min on an idle machine (205 s, of which
~15 s generate the synthetic federation on first use) and 5-6 min when the cores are shared;
`prrfl sweep --methods prr --seeds 0,1` took 11 min in all. Single-model methods are faster:
with --set num_rounds=3, PRR took 167 s and FedAvg 95 s. Budget ~4 min per (method, seed) of the
quick jobs. The paper's setting (--set num_rounds=50 --set local_epochs=5 --set data.image_size=128
--set data.synthetic_scale=1.0) is ~1000x the work (25x the epochs, 4x the pixels, 12.5x the
images): a GPU job.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prrfl.config import ConfigError, RunConfig, apply_overrides
from prrfl.crosseval import summary_line, write_crosseval
from prrfl.errors import CommandFailed
from prrfl.flare.job_recipe import export_job
from prrfl.flare.jobs import job_config
from prrfl.registry import build_task, task_class, validate_config, validate_job
from prrfl.report import SiteResult, build_report, variant_label
from prrfl.storage import load_json, save_json

Runner = Callable[[list[str], Path], int]  # (command, log file) -> exit status


class SweepError(CommandFailed):
    """A run of the sweep failed (the command line exits with status 1)."""


@dataclass(frozen=True)
class SweepRun:
    method: str
    seed: int
    cfg: RunConfig
    job: Path
    workspace: Path
    log: Path

    @property
    def name(self) -> str:
        return f"{self.method}_s{self.seed}"

    @property
    def done_marker(self) -> Path:
        return self.log.with_name(f"{self.name}.done.json")

    def done_before(self, sites: int) -> bool:
        """This run finished earlier with the same config on as many sites, and its results are there."""
        try:
            done = load_json(self.done_marker)
        except (OSError, ValueError):
            return False
        if not isinstance(done, dict) or done.get("sites") != sites:
            return False
        return not config_differences(done.get("config"), self.cfg) and finished_sites(self) >= sites


def effective_config(cfg: RunConfig) -> dict[str, Any]:
    """The config as a run uses it: its `data` completed with the task's defaults, so that a run naming a
    default explicitly (e.g. `--set data.synthetic_shift=<the default>`) is the same run as one leaving it out."""
    return {**cfg.to_dict(), "data": build_task(cfg).data_cfg}


def config_differences(kept: Any, wanted: RunConfig) -> list[str]:
    """'field: kept -> wanted' for each setting (data's one by one) in which a finished run's recorded config
    differs from `wanted`, both taken as the run uses them (effective_config); empty when they are the same run.
    A record that is not a valid config (an older format, a setting that no longer exists) differs as a whole."""
    try:
        a = effective_config(validate_config(kept))
    except (ConfigError, TypeError, ValueError, KeyError, AttributeError) as e:
        return [f"config: not a valid config ({e})"]
    b = effective_config(wanted)
    out = []
    for key in sorted(set(a) | set(b)):
        x, y = a.get(key), b.get(key)
        if key == "data":
            out += [f"data.{k}: {x.get(k)!r} -> {y.get(k)!r}" for k in sorted(set(x) | set(y)) if x.get(k) != y.get(k)]
        elif x != y:
            out.append(f"{key}: {x!r} -> {y!r}")
    return out


def job_name(task: str, method: str) -> str:
    """The committed job of a (task, method) pair."""
    return f"{task}_{method}"


def run_config(method: str, seed: int, overrides: Sequence[str] = (), task: str = "derm", profile: str = "quick") -> RunConfig:
    """The job's configuration under `profile` with the overrides, this seed, and a run name suffixed
    by the seed; checked whole (a ConfigError naming the job and the field)."""
    job = job_name(task, method)
    values = apply_overrides(job_config(job, profile).to_dict(), list(overrides))
    values["seed"] = seed
    values["run_name"] = f"{values['run_name']}_s{seed}"
    return validate_job(job, values)


def prepare(
    methods: Sequence[str], seeds: Sequence[int], root: Path, overrides: Sequence[str] = (), task: str = "derm", profile: str = "quick"
) -> list[SweepRun]:
    """Export every run's job folder; nothing runs yet. Every config is checked before the first
    folder is written, so a bad override leaves nothing behind."""
    configs = [(method, seed, run_config(method, seed, overrides, task, profile)) for method in methods for seed in seeds]
    runs = []
    for method, seed, cfg in configs:
        name = f"{method}_s{seed}"
        job = export_job(job_name(task, method), root / "jobs" / name, cfg=cfg)
        runs.append(SweepRun(method, seed, cfg, job, root / name, root / f"{name}.log"))
    return runs


def simulator_command(job: Path, workspace: Path, sites: int) -> list[str]:
    """All sites as parallel threads (-t = -n): no process restart per task, the fastest setting."""
    # the module, not a console script: works wherever this interpreter has nvflare installed
    return [sys.executable, "-m", "nvflare.cli", "simulator", str(job), "-w", str(workspace), "-n", str(sites), "-t", str(sites)]


def run_logged(command: list[str], log: Path) -> int:
    """Run a command with its stdout and stderr going to `log`; returns the exit status."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "w") as f:
        return subprocess.run(command, stdout=f, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"}).returncode


def finished_sites(run: SweepRun) -> int:
    """Sites of this run whose results file shows every round done: the simulator's exit status
    alone does not tell a job the server aborted from a finished one."""
    results = (SiteResult.load(p) for p in run.workspace.glob(f"*/prrfl/{run.cfg.run_name}/results.json"))
    return sum(1 for r in results if r is not None and r.rounds_completed == run.cfg.num_rounds)


def sweep(
    methods: Sequence[str],
    seeds: Sequence[int],
    root: str | Path,
    sites: int | None = None,
    overrides: Sequence[str] = (),
    runner: Runner = run_logged,
    task: str = "derm",
    profile: str = "quick",
) -> Path:
    """Run every (method, seed) of one task in the simulator one after another, then the report;
    returns the report's report.md. A run that finished before with the same config is not run again.
    Raises SweepError naming the log file of the first run that fails. `sites`: how many of the task's sites run
    (default: all of them, as the task names them)."""
    root = Path(root).resolve()
    sites = sites or len(task_class(task).site_names)
    runs = prepare(methods, seeds, root, overrides, task, profile)
    started = time.perf_counter()
    for i, run in enumerate(runs, 1):
        if run.done_before(sites):
            print(f"[{i}/{len(runs)}] {run.name}: finished before with the same config ({run.done_marker.name}); skipped", flush=True)
            continue
        run.done_marker.unlink(missing_ok=True)
        print(f"[{i}/{len(runs)}] {run.name}: simulator on {sites} sites, log {run.log}", flush=True)
        tick = time.perf_counter()
        status = runner(simulator_command(run.job, run.workspace, sites), run.log)
        if status != 0:
            raise SweepError(f"run {run.name} failed (exit status {status}); see {run.log}")
        done = finished_sites(run)
        if done < sites:
            raise SweepError(f"run {run.name}: only {done} of {sites} sites finished all {run.cfg.num_rounds} rounds; see {run.log}")
        seconds = time.perf_counter() - tick
        print(f"[{i}/{len(runs)}] {run.name}: done in {seconds:.0f} s", flush=True)
        try:  # FCA's protocol, while the run's files are at hand; the report computes what is missing
            for path in write_crosseval(run.workspace):
                print(f"[{i}/{len(runs)}] {run.name}: {summary_line(load_json(path))}", flush=True)
        except (OSError, ValueError, RuntimeError) as e:
            print(f"[{i}/{len(runs)}] {run.name}: no generalization/specialization evaluation: {e}", flush=True)
        save_json({"config": run.cfg.to_dict(), "sites": sites, "simulator_seconds": round(seconds, 1)}, run.done_marker)
    labels = list(
        dict.fromkeys(variant_label(run.method, run.cfg.method_args, run.cfg.to_dict()) for run in runs)
    )  # as the results name them
    report = build_report([run.workspace for run in runs], root / "report", methods=labels, task=task)
    print(f"{len(runs)} runs in {time.perf_counter() - started:.0f} s; report: {report}", flush=True)
    return report
