"""`prrfl` command line: job folders, results, reports and sweeps."""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from prrfl.config import RunConfig, apply_overrides
from prrfl.errors import EXIT_STATUS, CommandFailed, Interrupted, interruption, run_command, traceback_option
from prrfl.storage import load_json

PROFILE_NAMES = ("bench", "paper", "quick")  # prrfl.tasks.contract.PROFILE_NAMES, sorted (not imported: it imports torch)
PROFILE_OPTION: dict[str, Any] = {
    "choices": PROFILE_NAMES,
    "default": "quick",
    "help": "settings of a <task>_<method> job: quick (the committed jobs), bench (the benchmark) or paper",
}


def validated(job: str, values: dict[str, Any]) -> RunConfig:
    """The whole config checked, with the job named in the error (prrfl.registry.validate_job)."""
    from prrfl.registry import validate_job

    return validate_job(job, values)


RESUME = {"false": False, "true": True, "auto": "auto"}  # --resume values -> the workflow's argument


def _jobs_export(args: argparse.Namespace) -> int:
    """Every job's config is checked before the first folder is written: a typo writes nothing."""
    from prrfl.flare.job_recipe import export_job
    from prrfl.flare.jobs import JOBS, job_config

    names = args.names or sorted(JOBS)
    configs = {name: validated(name, apply_overrides(job_config(name, args.profile).to_dict(), args.set)) for name in names}
    for name, cfg in configs.items():
        print(
            export_job(
                name,
                args.out,
                cfg=cfg,
                bundle=args.bundle,
                privacy=args.privacy,
                resume=RESUME[args.resume],
                tracking=args.tracking,
                tracking_uri=args.tracking_uri,
            )
        )
    return 0


def _jobs_check(args: argparse.Namespace) -> int:
    import tempfile

    from prrfl.flare.job_recipe import export_job
    from prrfl.flare.jobs import JOBS, job_files

    stale = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in sorted(JOBS):
            if job_files(export_job(name, tmp)) != job_files(Path(args.dir) / name):
                stale.append(name)
    if stale:
        raise CommandFailed(f"job folders out of date: {stale}; run `prrfl jobs export`")
    print(f"{len(JOBS)} job folders match the code")
    return 0


def _data_build(args: argparse.Namespace) -> int:
    """Build a job's embedded synthetic federation ahead of the run, with several processes."""
    from prrfl.flare.jobs import job_config
    from prrfl.registry import build_task

    cfg = validated(args.job, apply_overrides(job_config(args.job, args.profile).to_dict(), args.set))
    print(build_task(cfg).prepared_root(None, workers=args.workers))
    return 0


def _results(args: argparse.Namespace) -> int:
    """One per-site table per run found under each folder, whatever wrote it (prrfl.report.find_runs);
    files that are not a prrfl run's are skipped with a note, so a workspace can be given as it is."""
    from prrfl.report import find_runs

    for folder in args.workspaces:
        runs, skipped = find_runs(folder)
        for note in skipped:
            print(f"note: {note}", file=sys.stderr)
        if not runs:
            other = f" of a prrfl run ({len(skipped)} other file(s) skipped)" if skipped else ""
            raise FileNotFoundError(f"{folder}: no results.json{other} found")
        for run in runs:
            print(f"## {run.title()}\n\n{run.table()}\n")
    return 0


def _names(text: str | None) -> list[str] | None:
    """A comma-separated option ("prr,fedavg") as a list; None when not given."""
    return [t.strip() for t in text.split(",") if t.strip()] if text else None


def _integers(text: str) -> list[int]:
    """A comma-separated list of integers ("0,1,2"), for argparse."""
    try:
        return [int(t) for t in _names(text) or []]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, e.g. 0,1,2, got {text!r}") from None


def _report(args: argparse.Namespace) -> int:
    from prrfl.report import build_report

    print(build_report(args.workspaces, args.out, _names(args.methods), args.reference, _names(args.curves), args.task))
    return 0


def _crosseval(args: argparse.Namespace) -> int:
    from prrfl.crosseval import summary_line, write_crosseval
    from prrfl.report.protocol import run_matrix

    for ws in args.workspaces:
        for path in write_crosseval(ws, args.device):
            result = load_json(path)
            print(f"{result['method']} seed {result['seed']}: {summary_line(result)} ({path})\n\n{run_matrix(result)}\n")
    return 0


def _evaluate(args: argparse.Namespace) -> int:
    from prrfl.inference import evaluate_saved_model

    result = evaluate_saved_model(
        args.model, args.data_root, args.cohort, args.split, args.device, accept_unverified_card=args.accept_unverified_card
    )
    values = ", ".join(f"{k} {v:.2f}" for k, v in result["metrics"].items())
    print(
        f"{result['model']} ({result['method']}, trained at {result['trained_at']}) on {result['cohort']} {result['split']} "
        f"({result['samples']} samples): {values}"
    )
    if args.json:
        print(json.dumps(result, indent=2))
    return 0


EXIT_SKIPPED = 3  # predict: written, but unreadable inputs were skipped (a script must not take the output as whole)
PREDICT_EXIT_STATUS = f"""\
exit status:
  0    every input predicted
  2    refused (bad arguments, model, card or output; weights not the card's; no input readable): nothing written
  {EXIT_SKIPPED}    written, but some inputs were unreadable and skipped (each named on stderr)
An implausible input (far smaller than the model's images, near-constant) is predicted and named in the
output's flag column; a model its card puts at chance level is a warning, on stderr and in the output's
model_warning column. Progress lines with the time left go to stderr every few seconds (--quiet: none)."""


def _predict(args: argparse.Namespace) -> int:
    from prrfl.predict import predict

    progress = None if args.quiet else _stderr_line
    result = predict(
        args.model, args.input, args.out, args.device, args.batch_size, progress, accept_unverified_card=args.accept_unverified_card
    )
    skipped = f"; {len(result.skipped)} unreadable input(s) skipped" if result.skipped else ""
    print(f"{args.model}: {result.writes} of {result.inputs} input(s) written to {result.out}{skipped}")
    return EXIT_SKIPPED if result.skipped else 0


def _stderr_line(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _positive(text: str) -> int:
    """An integer >= 1, for argparse."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text!r}")
    return value


def _sweep(args: argparse.Namespace) -> int:
    from prrfl.sweep import sweep

    sweep(_names(args.methods), args.seeds, args.workspace, args.sites, args.set, task=args.task, profile=args.profile)
    return 0


def _run(args: argparse.Namespace) -> int:
    """A job's recipe on a FLARE environment (SimEnv, PocEnv, ProdEnv), to the end; prints the table."""
    from prrfl.flare.job_recipe import PersonalizedRecipe, environment, recipe_config, result_tables, run_recipe, stop_poc
    from prrfl.registry import task_class

    name, cfg = recipe_config(args.job, args.task, args.method, None, apply_overrides({}, args.set))
    sites = args.sites or len(task_class(cfg.task).site_names)
    recipe = PersonalizedRecipe(  # FLARE starts the job once all the sites are connected
        name,
        config=cfg,
        min_clients=sites,
        privacy=args.privacy,
        resume=RESUME[args.resume],
        tracking=args.tracking,
        tracking_uri=args.tracking_uri,
        bundle=args.bundle,
    )
    env = environment(args.env, sites, args.workspace, args.threads, args.gpu, args.startup_kit, args.username)
    try:
        with interrupt_deadline(lambda: stop_poc(env), RESUME_HINT) as signals:
            status, result, _ = run_recipe(recipe, env, args.timeout)
    except KeyboardInterrupt as e:  # also a simulator that Ctrl-C or SIGTERM ended ("return code -9")
        raise Interrupted(RESUME_HINT, signals[0] if signals else signal.SIGINT) from e
    print(f"{recipe.name} on {args.env}: {status}; results in {result}\n\n{result_tables(result)}", flush=True)
    return 0


def _deploy(args: argparse.Namespace) -> int:
    from prrfl.flare.deployment import cli

    return cli(args)


def _parser() -> argparse.ArgumentParser:
    """The command line: one parser per command, each built by its own `_add_<command>`."""
    parser = argparse.ArgumentParser(
        prog="prrfl", description=__doc__, epilog=EXIT_STATUS, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    common = traceback_option(parser)
    sub = parser.add_subparsers(dest="command", required=True)
    job_options = _job_options()
    _add_jobs(sub, common, job_options)
    for add in (_add_data, _add_results, _add_report, _add_crosseval, _add_evaluate, _add_predict, _add_sweep):
        add(sub, common)
    _add_run(sub, common, job_options)
    _add_deploy(sub, common)
    return parser


def _job_options() -> argparse.ArgumentParser:
    """What a job is built with, for `jobs export` and `run` alike."""
    job_options = argparse.ArgumentParser(add_help=False)
    job_options.add_argument(
        "--bundle", action="store_true", help="copy the prrfl package into each job's custom/ (sites without it installed)"
    )
    job_options.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a config field")
    job_options.add_argument("--privacy", choices=["percentile", "svt"], help="add this FLARE privacy filter to the sites' uploads")
    job_options.add_argument(
        "--resume",
        nargs="?",
        const="true",
        default="false",
        choices=sorted(RESUME),
        help="the workflow's resume mode: true (continue the saved run, refuse to start without one), auto (continue "
        "it when there is one, else start a new run: a command to re-run after an interruption), false (default: new run)",
    )
    job_options.add_argument(
        "--tracking",
        choices=["tensorboard", "mlflow"],
        default="tensorboard",
        help="where the server writes the sites' and the federation's scalars (default: TensorBoard event files)",
    )
    job_options.add_argument(
        "--tracking-uri",
        help="with --tracking mlflow: the MLflow tracking URI (default: SQLite mlflow.db in the server's prrfl/ folder, beside the workspace in the simulator)",
    )
    return job_options


def _add_jobs(sub, common: argparse.ArgumentParser, job_options: argparse.ArgumentParser) -> None:
    """`prrfl jobs export|check`."""
    jobs = sub.add_parser("jobs", help="FLARE job folders").add_subparsers(dest="action", required=True)
    export = jobs.add_parser("export", parents=[common, job_options], help="write the job folders from the code")
    export.add_argument("names", nargs="*", help="jobs to export (default: all)")
    export.add_argument("--out", default="jobs")
    export.add_argument("--profile", **PROFILE_OPTION)
    export.set_defaults(func=_jobs_export)
    check = jobs.add_parser("check", parents=[common], help="fail if the committed job folders differ from the code")
    check.add_argument("--dir", default="jobs")
    check.set_defaults(func=_jobs_check)


def _add_data(sub, common: argparse.ArgumentParser) -> None:
    """`prrfl data build`."""
    data = sub.add_parser("data", help="data sets").add_subparsers(dest="action", required=True)
    build = data.add_parser("build", parents=[common], help="generate and prepare a job's synthetic federation into the cache")
    build.add_argument("job")
    build.add_argument("--workers", type=int, default=1)
    build.add_argument("--profile", **PROFILE_OPTION)
    build.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a config field")
    build.set_defaults(func=_data_build)


def _add_results(sub, common: argparse.ArgumentParser) -> None:
    """`prrfl results`."""
    results = sub.add_parser("results", parents=[common], help="per-site table (the task's two main test metrics) of finished runs")
    results.add_argument(
        "workspaces",
        nargs="+",
        metavar="folder",
        help="searched at any depth for results.json: a simulator, `prrfl run`, POC or `prrfl deploy poc` workspace, a download",
    )
    results.set_defaults(func=_results)


def _add_report(sub, common: argparse.ArgumentParser) -> None:
    """`prrfl report`."""
    report = sub.add_parser(
        "report", parents=[common], help="per-site tables (Table II / III, Table X), retrogress and per-epoch curves of finished runs"
    )
    report.add_argument("workspaces", nargs="+", help="folders searched for <site>/prrfl/<run>/results.json")
    report.add_argument("--out", default="report", help="folder for report.md, the CSV files and the PNGs")
    report.add_argument("--methods", help="comma-separated methods to report, in this order (default: all found)")
    report.add_argument("--reference", default="prr", help="method the paired tests compare against")
    report.add_argument("--curves", help="comma-separated methods to plot per-epoch curves of (default: all reported)")
    report.add_argument("--task", help="the task to report when the workspaces hold runs of several")
    report.set_defaults(func=_report)


def _add_crosseval(sub, common: argparse.ArgumentParser) -> None:
    """`prrfl crosseval`."""
    crosseval = sub.add_parser(
        "crosseval",
        parents=[common],
        help="FCA's generalization/specialization protocol and the cross-site matrix of finished simulator runs",
    )
    crosseval.add_argument("workspaces", nargs="+", help="simulator workspaces; writes <workspace>/prrfl/<run>/crosseval.json")
    crosseval.add_argument("--device", default="cpu", help="torch device of the evaluation (default: cpu)")
    crosseval.set_defaults(func=_crosseval)


ACCEPT_UNVERIFIED_HELP = (
    "read a model card that cannot be verified (of the earlier format prrfl-model-card/1: its checksum, if any, leaves "
    "fields unbound) with a warning, instead of refusing it"
)


def _add_evaluate(sub, common: argparse.ArgumentParser) -> None:
    """`prrfl evaluate`."""
    evaluate = sub.add_parser("evaluate", parents=[common], help="metrics of a saved best model (with its model card) on a prepared split")
    evaluate.add_argument("--model", required=True, help="a best_<role>.pt, its model card best_<role>.json beside it")
    evaluate.add_argument("--data-root", required=True, help="prepared data of the model's task (python -m prrfl.tasks.<task> prepare)")
    evaluate.add_argument("--cohort", help="the cohort to score (default: the model's own)")
    evaluate.add_argument("--split", default="test", choices=["train", "valid", "test"])
    evaluate.add_argument("--device", default="cpu")
    evaluate.add_argument("--json", action="store_true", help="print the whole result as JSON too")
    evaluate.add_argument("--accept-unverified-card", action="store_true", help=ACCEPT_UNVERIFIED_HELP)
    evaluate.set_defaults(func=_evaluate)


def _add_predict(sub, common: argparse.ArgumentParser) -> None:
    """`prrfl predict`."""
    predict = sub.add_parser(
        "predict",
        parents=[common],
        help="a saved best model on new inputs, preprocessed as its card says: derm images -> a CSV of class "
        "probabilities; prostate NIfTI volumes -> a <stem>_mask.nii.gz per volume on the input's grid, and summary.csv",
        epilog=PREDICT_EXIT_STATUS,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    predict.add_argument("--model", required=True, help="a best_<role>.pt, its model card best_<role>.json beside it")
    predict.add_argument(
        "--input", required=True, help="derm: a JPEG/PNG image or a folder of them; prostate: a NIfTI volume or a folder of them"
    )
    predict.add_argument(
        "--out", required=True, help="derm: the CSV file to write; prostate: the folder to write (new, empty or a previous output)"
    )
    predict.add_argument("--device", default="cpu")
    predict.add_argument("--batch-size", type=_positive, help="images or slices per forward pass (default: the task's evaluation chunk)")
    predict.add_argument("-q", "--quiet", action="store_true", help="no progress lines (warnings and errors are still printed)")
    predict.add_argument("--accept-unverified-card", action="store_true", help=ACCEPT_UNVERIFIED_HELP)
    predict.set_defaults(func=_predict)


def _add_sweep(sub, common: argparse.ArgumentParser) -> None:
    """`prrfl sweep`."""
    sweep = sub.add_parser("sweep", parents=[common], help="run methods x seeds in the simulator one after another, then the report")
    sweep.add_argument("--methods", required=True, help="comma-separated methods; each runs its job <task>_<method>")
    sweep.add_argument("--task", default="derm", help="the task of every run (default: derm)")
    sweep.add_argument("--seeds", type=_integers, default="0", help="comma-separated seeds")
    sweep.add_argument("--workspace", required=True, help="folder for the jobs, simulator workspaces, logs and report")
    sweep.add_argument("--sites", type=int, default=None, help="how many of the task's sites run (default: all of them)")
    sweep.add_argument("--profile", **PROFILE_OPTION)
    sweep.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a config field of every run")
    sweep.set_defaults(func=_sweep)


def _add_run(sub, common: argparse.ArgumentParser, job_options: argparse.ArgumentParser) -> None:
    """`prrfl run`."""
    run = sub.add_parser(
        "run",
        parents=[common, job_options],
        help="build a job's FLARE recipe and run it on the simulator (SimEnv), a local POC (PocEnv) or a deployment (ProdEnv)",
    )
    run.add_argument("job", nargs="?", help="a job of `prrfl jobs export` (default: <task>_<method>, i.e. derm_prr)")
    run.add_argument("--task", help="with --method: the job <task>_<method> (default derm)")
    run.add_argument("--method", help="with --task: the job <task>_<method> (default prr)")
    run.add_argument("--env", choices=["sim", "poc", "prod"], default="sim", help="where the job runs (default: sim)")
    run.add_argument(
        "--sites",
        type=_positive,
        help="sim, poc: the sites site-1..site-N to start; prod: the sites that must be connected before the job starts (default: the task's number of sites)",
    )
    run.add_argument("--workspace", default="workspace", help="sim: the simulator runs in <workspace>/<job> (default: workspace)")
    run.add_argument("--threads", type=_positive, help="sim: sites run at once (default: all)")
    run.add_argument("--gpu", help="sim: GPU of each site, e.g. 0,0,0,0; poc: GPU ids, e.g. 0,1")
    run.add_argument("--startup-kit", help="prod: the admin's startup kit folder of the provisioned deployment")
    run.add_argument("--username", help="prod: the admin's name (default: the startup kit folder's name)")
    run.add_argument("--timeout", type=float, default=0.0, help="poc, prod: seconds to follow the job (default: until it ends)")
    run.set_defaults(func=_run)


def _add_deploy(sub, common: argparse.ArgumentParser) -> None:
    """`prrfl deploy poc`."""
    deploy = sub.add_parser("deploy", help="run a job on a provisioned FLARE deployment").add_subparsers(dest="action", required=True)
    poc = deploy.add_parser(
        "poc", parents=[common], help="provision, start server + sites on localhost (mTLS), submit, follow, download, stop"
    )
    poc.add_argument("--job", required=True, help="exported job folder, e.g. jobs/derm_prr")
    poc.add_argument("--sites", type=int, default=4, help="hospitals of workspace_templates/poc/project.yml to start")
    poc.add_argument("--workdir", help="folder for the kits, logs and results (default: a new temporary folder, kept)")
    poc.add_argument("--data-root", help="data root written to every site's local/prrfl_site.json (default: synthetic)")
    poc.add_argument("--device", help="device written to every site's local config, e.g. cpu or cuda:0")
    poc.add_argument("--timeout", type=float, default=3600, help="seconds the job may run")
    poc.set_defaults(func=_deploy)


def main(argv: list[str] | None = None) -> int:
    """Exit status and error format: errors.EXIT_STATUS (the --help epilog)."""
    args = _parser().parse_args(argv)
    return run_command(lambda: args.func(args), args.traceback)


LINGER_SECONDS = 10.0  # how long the command waits at its end for threads a library left running


RESUME_HINT = "run the same command with --resume auto to continue from the last completed round"
INTERRUPT_GRACE = 60.0  # seconds a Ctrl-C or SIGTERM may take to unwind through FLARE's code before the command ends itself
INTERRUPTED = {interruption(sig)[1] for sig in (signal.SIGINT, signal.SIGTERM)}  # their exit statuses: 130, 143


@contextlib.contextmanager
def interrupt_deadline(cleanup: Callable[[], None], hint: str, grace: float = INTERRUPT_GRACE) -> Iterator[list[int]]:
    """A Ctrl-C in the block raises KeyboardInterrupt as usual, and so does a SIGTERM (`timeout`, systemd, a batch
    scheduler, `kill`), which would otherwise end the process at once and leave what it started running. A SIGTERM
    after any signal is not raised again, so it does not cut short the stopping the first one began. Should the
    block not end within `grace` seconds of the first signal (a library that catches the KeyboardInterrupt, or
    waits on a server the signal has stopped), `cleanup` runs, the first signal's line is printed and the process
    ends with its status (prrfl.errors.interruption: 130, 143). Yields the signals seen, in order. Only in the
    main thread."""
    seen: list[int] = []
    if threading.current_thread() is not threading.main_thread():
        yield seen
        return
    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    timers: list[threading.Timer] = []

    def give_up() -> None:
        try:
            cleanup()
        finally:
            line, status = interruption(seen[0], hint)
            print(line, file=sys.stderr, flush=True)
            os._exit(status)

    def on_signal(signum: int, frame: Any) -> None:
        seen.append(signum)
        if not timers:
            timers.append(threading.Timer(grace, give_up))
            timers[0].daemon = True
            timers[0].start()
        if signum == signal.SIGINT and callable(previous[signum]):
            previous[signum](signum, frame)
        elif signum == signal.SIGINT or len(seen) == 1:
            raise KeyboardInterrupt

    for sig in previous:
        signal.signal(sig, on_signal)
    try:
        yield seen
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        for timer in timers:
            timer.cancel()


def console() -> None:
    """The `prrfl` command: `main`, then the process ends with its status. A library may leave threads running
    (FLARE's admin session keeps retrying a server that a Ctrl-C has just stopped); the command does not wait for
    them for more than a few seconds: after an interruption (Ctrl-C, SIGTERM) not at all, otherwise LINGER_SECONDS.
    An interrupted command, whose processes are stopped by then, also skips Python's teardown of its modules
    (seconds with torch and FLARE loaded)."""
    status = main()
    interrupted = status in INTERRUPTED
    deadline = time.monotonic() + (0.0 if interrupted else LINGER_SECONDS)
    for thread in threading.enumerate():
        if thread is not threading.main_thread() and not thread.daemon:
            thread.join(timeout=max(0.0, deadline - time.monotonic()))
    if interrupted or any(t.is_alive() and not t.daemon for t in threading.enumerate() if t is not threading.main_thread()):
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(status)
    sys.exit(status)


if __name__ == "__main__":
    console()
