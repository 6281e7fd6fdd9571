"""Site entry point under the FLARE Client API: receive a task, run it, send the result.

FLARE may start this process once per job or once per task (simulator with fewer threads than
sites), so nothing lives only in memory: the runtime is rebuilt from the site checkpoint when the
process is new, and written back after every round.

Tasks: the workflow's `prepare` and `train` (prrfl.flare.server_workflow); after them, FLARE's cross-site
evaluation (prrfl.flare.cross_site): `submit_model` sends this site's best personalized model with its
model card, `validate` scores a received model on this site's test split. These two need no runtime:
the best model is found from the run name (the script's --run-name, set by the recipe) and the site's
settings; a received model is rebuilt from the card that travels with it.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path

import nvflare.client as flare
import torch
from nvflare.app_common.abstract.fl_model import ParamsType
from nvflare.client.tracking import SummaryWriter

from prrfl.config import RunConfig
from prrfl.flare import places
from prrfl.flare import task_protocol as P
from prrfl.flare.console import quiet_flare_console
from prrfl.flare.cross_site import CARD
from prrfl.flare.liveness import end_site_with_simulator
from prrfl.flare.site_config import SettingsReport, SiteConfig, per_site_name
from prrfl.inference import load_saved_model
from prrfl.messages import PrepareReply
from prrfl.numerics import prepare_model
from prrfl.registry import build_method, build_task
from prrfl.site.state import SiteRuntime
from prrfl.site.trainer import estimate_round_seconds, run_round, score_last_download
from prrfl.tasks.contract import MissingCohort, SiteData, Task

log = logging.getLogger("prrfl.site")


def seed_for(seed: int, cohort: str) -> int:
    """A site's seed, from the run's seed and the site's cohort (the hospital its data is), not its FLARE
    client name: the simulator's site-1 and a deployment's client holding the same cohort draw the same
    numbers. Does not depend on Python's salted hash()."""
    return (seed * 1_000_003 + sum((i + 1) * ord(ch) for i, ch in enumerate(cohort))) % (2**31)


def state_dir_of(site: str, run_name: str, local: SiteConfig, job_id: str | None) -> Path:
    """The site's state folder of run `run_name`: its settings' state_dir, else the default place
    (prrfl.flare.places) in the site's workspace, where FLARE runs the site."""
    return Path(local.state_dir).resolve() if local.state_dir else places.default_state_dir(Path.cwd(), site, run_name, job_id)


def device_of(local: SiteConfig) -> torch.device:
    """The site's torch device: its settings' (checked by SiteConfig.load), else CUDA when there is one."""
    return torch.device(local.device or ("cuda" if torch.cuda.is_available() else "cpu"))


def load_site_data(site: str, task: Task, local: SiteConfig, device: torch.device) -> SiteData:
    """This site's cohort of `task` (its settings' cohort, else derived from the site name), loaded."""
    if local.cohort is not None and local.cohort not in task.cohorts:
        raise ValueError(
            f"{local.origin('cohort')} is {local.cohort!r}, not a cohort of the {task.name} task: expected one of {list(task.cohorts)}"
        )
    cohort = local.cohort or task.cohort_of(site)
    try:
        return task.load_site(cohort, device, local.data_root)
    except MissingCohort as e:
        named = f"set by {local.origin('cohort')}" if local.cohort else f"from the site name {site}"
        raise FileNotFoundError(
            f"site {site} is cohort {cohort!r} ({named}) but {e.root} ({local.origin('data_root')}) holds no prepared "
            f"cohort {cohort!r}, only {e.available}: set 'cohort' to one of them, or point data_root at data prepared with {cohort!r}"
        ) from e
    except FileNotFoundError as e:
        if not local.data_root:
            raise
        raise FileNotFoundError(f"{e} (data_root: {local.origin('data_root')})") from e


def build_runtime(site: str, meta: dict, local: SiteConfig, writer: SummaryWriter | None, job_id: str | None = None) -> SiteRuntime:
    cfg = RunConfig.from_dict(meta[P.CONFIG])  # build_task and build_method check the rest
    task = build_task(cfg)
    method = build_method(cfg, task)
    workspace = Path.cwd()  # FLARE runs the site in its workspace
    state_dir = state_dir_of(site, cfg.run_name, local, job_id)
    if P.ROUND not in meta:  # the prepare task of a new run: an earlier run's files are kept, not overwritten
        kept = places.set_aside_previous_run(state_dir)
        if kept:
            log.warning("site %s: a new run starts; the state of the earlier run in %s is kept in %s", site, state_dir, kept)
    places.ensure_writable(state_dir, f"site {site}", "set state_dir in the site's local/prrfl_site.json to a writable folder")
    device = device_of(local)
    if device.type == "cpu":
        torch.set_num_threads(local.num_threads or max(1, (os.cpu_count() or 1) // max(1, meta.get(P.NUM_SITES, 1))))
    data = load_site_data(site, task, local, device)
    if data.num_train < 1:
        source = local.data_root or "the embedded synthetic federation"
        raise ValueError(f"site {site}: cohort {data.cohort} has no training {task.sample_noun} in {source}")
    runtime = SiteRuntime.start(
        site,
        cfg,
        task,
        method,
        data,
        state_dir,
        model_seed=seed_for(cfg.seed, data.cohort),
        device=device,
        output_dir=places.output_dir(workspace, cfg.run_name),
        run_id=meta[P.RUN_ID],
        data_root=local.data_root,
        eval_batch_size=local.eval_batch_size,
        log_scalar=(lambda tag, value, step: writer.add_scalar(tag, float(value), global_step=step)) if writer else (lambda *a: None),
    )
    runtime.restore(before_round=meta.get(P.ROUND, 0))  # a prepare task (no round) starts a new run
    return runtime


def job_arguments(argv: list[str] | None) -> tuple[str | None, list[str]]:
    """(the run name the recipe passes as --run-name, the site settings' arguments)."""
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--run-name", help="the job's run: whose best model this site submits to cross-site evaluation")
    known, rest = parser.parse_known_args(sys.argv[1:] if argv is None else argv)
    return known.run_name, rest


def main(argv: list[str] | None = None) -> None:
    logging.basicConfig(level=logging.INFO)
    flare.init()
    quiet_flare_console()  # FLARE's INFO plumbing off this site's console (PRRFL_FLARE_LOG=full keeps it)
    end_site_with_simulator()  # in the simulator: this site ends when the simulator's main process is gone
    site, job_id = flare.get_site_name(), flare.get_job_id()
    run_name, argv = job_arguments(argv)
    try:
        local, settings = SiteConfig.load(site, argv)
        settings_error = None
    except ValueError as e:  # reported to the server with every answer: the site takes no part
        local, settings, settings_error = SiteConfig(), SettingsReport(), str(e)
        log.error("site %s: %s", site, e)
    for note in settings.notes:
        log.warning("site %s: %s", site, note)
    if not local.data_root:
        source = settings.used or f"no local/{per_site_name(site)} or local/prrfl_site.json"
        log.warning("site %s: no data_root (%s): training on the embedded synthetic federation", site, source)
    writer = SummaryWriter()
    runtime: SiteRuntime | None = None
    while flare.is_running():
        model = flare.receive()
        if model is None:
            break
        meta = model.meta or {}
        task_name = flare.get_task_name()
        try:
            if settings_error:
                raise ValueError(settings_error)
            if flare.is_submit_model():
                result = submit_best_model(site, state_dir_of(site, required_run_name(run_name), local, job_id))
            elif flare.is_evaluate():
                result = validate_model(site, model, local)
            else:
                runtime = runtime_for(runtime, site, meta, local, writer, job_id)
                result = run_task(runtime, task_name, model, settings)
        except Exception as e:  # noqa: BLE001 - reported to the server, which leaves this site out
            log.exception("site %s: task '%s' failed", site, task_name)
            runtime = None  # rebuilt from the last checkpoint if the server asks again
            result = flare.FLModel(params={}, meta={P.ERROR: f"{type(e).__name__}: {e}"})
        flare.send(result)


# ----- cross-site evaluation (FLARE's CrossSiteEval, prrfl.flare.cross_site) ----------------
def required_run_name(run_name: str | None) -> str:
    if not run_name:
        raise ValueError("the site script has no --run-name (a job exported before cross-site evaluation existed): export the job again")
    return run_name


def submit_best_model(site: str, state_dir: Path) -> flare.FLModel:
    """This site's best personalized model (best_<role>.pt of the run's state folder, checked against its
    model card: prrfl.inference.load_saved_model) with the card as meta, which the receivers rebuild it from."""
    found = sorted(state_dir.glob("best_*.pt"))  # one: the method's eval role
    if len(found) != 1:
        what = "no best_<role>.pt" if not found else f"{len(found)} best models ({', '.join(p.name for p in found)})"
        raise FileNotFoundError(f"site {site} has no best model to submit: {what} in {state_dir}")
    saved = load_saved_model(found[0], "cpu")
    log.info("site %s: submitting %s (round %d) to cross-site evaluation", site, saved.path, saved.card["round"])
    return flare.FLModel(params_type=ParamsType.FULL, params=P.streamable(saved.model.state_dict()), meta={CARD: saved.card})


def validate_model(site: str, model: flare.FLModel, local: SiteConfig) -> flare.FLModel:
    """The received model, rebuilt from its card (a network of its method, computing as it was trained) and scored
    by the task's evaluation on this site's own test split: the task's metrics (percent) as the result's metrics."""
    card = (model.meta or {}).get(CARD)
    if not card:
        raise ValueError(f"site {site}: the model to validate came without its model card ('{CARD}' in its meta)")
    cfg = RunConfig.from_dict(card["config"])
    task = build_task(cfg)
    network = build_method(cfg, task).build_model()
    device = device_of(local)
    params = {k: torch.as_tensor(v) for k, v in (model.params or {}).items()}
    try:
        network.load_state_dict(params)
    except RuntimeError as e:
        detail = " ".join(str(e).split())[:300]
        raise ValueError(f"the model of {card['site']} does not fit the {cfg.task}/{cfg.method} network of its card: {detail}") from None
    data = load_site_data(site, task, local, device)
    metrics = task.evaluate(prepare_model(network.to(device), cfg), data.test, local.eval_batch_size)
    log.info("site %s: the model of %s on test split %s: %s", site, card["site"], data.cohort, metrics)
    return flare.FLModel(metrics=metrics, meta={"cohort": data.cohort, "test_samples": len(data.test)})


def runtime_for(runtime: SiteRuntime | None, site: str, meta: dict, local: SiteConfig, writer, job_id: str | None = None) -> SiteRuntime:
    """The live runtime, or a new one restored from the checkpoint: in a new process, for another run,
    or when the server asks again for a round this process already trained (a resumed server)."""
    round_idx = meta.get(P.ROUND)
    if runtime is None or runtime.run_id != meta.get(P.RUN_ID) or (round_idx is not None and round_idx <= runtime.round_idx):
        return build_runtime(site, meta, local, writer, job_id)
    return runtime


def run_task(runtime: SiteRuntime, task_name: str, model: flare.FLModel, settings: SettingsReport | None = None) -> flare.FLModel:
    if task_name == P.TASK_PREPARE:
        data = runtime.data
        reply = PrepareReply(
            cohort=data.cohort,
            num_train=data.num_train,
            class_counts=data.class_counts,
            state_dir=str(runtime.state_dir),
            data_root=runtime.data_root,  # None: the embedded synthetic federation
            settings=(settings or SettingsReport()).to_meta(),
            round_estimate_s=estimate_round_seconds(runtime),  # for the first round's deadline
        )
        return flare.FLModel(params={}, meta=reply.to_meta())
    if task_name == P.TASK_TRAIN:
        download = P.model_to_download(model)
        upload = run_round(runtime, download, model.meta[P.ROUND])
        return P.upload_to_model(upload, round_summary(runtime, model.meta[P.ROUND]), download.params)
    if task_name == P.TASK_SCORE:
        score_last_download(runtime, P.model_to_download(model), model.meta[P.ROUND])
        return flare.FLModel(params={}, meta={"summary": round_summary(runtime, model.meta[P.ROUND])})
    raise ValueError(f"site {runtime.name}: unknown task '{task_name}'")


def round_summary(runtime: SiteRuntime, round_idx: int) -> dict:
    """What the server keeps of a site's task: its best and last scores, its out-of-distribution scores, its
    cohort and the drop right after round `round_idx`'s download (the federation run's mean drop). Where the site
    reports the model it downloads (a global-model method), `trained` adds the scores of its model after the round's
    local epochs (for FedBN and SiloBN the site's own model), which the federation's tracking run shows beside the
    reported one."""
    results = runtime.results()
    summary = {k: results[k] for k in ("best", "last", "ood", "cohort")}
    summary["download_drop"] = runtime.download_drop(round_idx)
    if runtime.method.reports_download():
        trained = next((h for h in reversed(runtime.history) if h["kind"] == "round" and h["round"] == round_idx), None)
        if trained is not None:
            summary["trained"] = {k: trained[k] for k in ("round", "epochs_done", "valid", "test")}
    return summary
