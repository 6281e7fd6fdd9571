"""Site entry point under the FLARE Client API: receive a task, run it, send the result.

FLARE may start this process once per job or once per task (simulator with fewer threads than
sites), so nothing lives only in memory: the runtime is rebuilt from the site checkpoint when the
process is new, and written back after every round.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import nvflare.client as flare
import torch
from nvflare.client.tracking import SummaryWriter

from prrfl.config import RunConfig
from prrfl.flare import places
from prrfl.flare import protocol as P
from prrfl.flare.site_config import SettingsReport, SiteConfig, per_site_name
from prrfl.registry import build_method, build_task
from prrfl.site.state import SiteRuntime
from prrfl.site.trainer import estimate_round_seconds, run_round
from prrfl.tasks.base import MissingCohort

log = logging.getLogger("prrfl.site")


def seed_for(seed: int, site: str) -> int:
    """A per-site seed that does not depend on Python's salted hash()."""
    return (seed * 1_000_003 + sum((i + 1) * ord(ch) for i, ch in enumerate(site))) % (2**31)


def build_runtime(site: str, meta: dict, local: SiteConfig, writer: SummaryWriter | None, job_id: str | None = None) -> SiteRuntime:
    cfg = RunConfig.from_dict(meta[P.CONFIG])  # build_task and build_method check the rest
    task = build_task(cfg)
    method = build_method(cfg, task)
    workspace = Path.cwd()  # FLARE runs the site in its workspace
    state_dir = Path(local.state_dir).resolve() if local.state_dir else places.default_state_dir(workspace, site, cfg.run_name, job_id)
    if P.ROUND not in meta:  # the prepare task of a new run: an earlier run's files are kept, not overwritten
        kept = places.set_aside_previous_run(state_dir)
        if kept:
            log.warning("site %s: a new run starts; the state of the earlier run in %s is kept in %s", site, state_dir, kept)
    places.ensure_writable(state_dir, f"site {site}", "set state_dir in the site's local/prrfl_site.json to a writable folder")
    device = torch.device(local.device or ("cuda" if torch.cuda.is_available() else "cpu"))  # checked by SiteConfig.load
    if device.type == "cpu":
        torch.set_num_threads(local.num_threads or max(1, (os.cpu_count() or 1) // max(1, meta.get(P.NUM_SITES, 1))))
    if local.cohort is not None and local.cohort not in task.cohorts:
        raise ValueError(
            f"{local.origin('cohort')} is {local.cohort!r}, not a cohort of the {task.name} task: expected one of {list(task.cohorts)}"
        )
    cohort = local.cohort or task.cohort_of(site)
    try:
        data = task.load_site(cohort, device, local.data_root)
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
    if data.num_train < 1:
        source = local.data_root or "the embedded synthetic federation"
        raise ValueError(f"site {site}: cohort {cohort} has no training {task.sample_noun} in {source}")
    torch.manual_seed(seed_for(cfg.seed, site))
    models = {role: method.build_model().to(device) for role in method.roles}
    optimizers = {role: method.build_optimizer(m) for role, m in models.items()}
    runtime = SiteRuntime(
        name=site,
        cfg=cfg,
        task=task,
        method=method,
        data=data,
        device=device,
        state_dir=state_dir,
        output_dir=places.output_dir(workspace, cfg.run_name),
        models=models,
        optimizers=optimizers,
        generator=torch.Generator().manual_seed(seed_for(cfg.seed, site)),
        run_id=meta[P.RUN_ID],
        data_root=local.data_root,
        eval_batch_size=local.eval_batch_size,
        log_scalar=(lambda tag, value, step: writer.add_scalar(tag, float(value), global_step=step)) if writer else (lambda *a: None),
    )
    runtime.restore(before_round=meta.get(P.ROUND, 0))  # a prepare task (no round) starts a new run
    return runtime


def main(argv: list[str] | None = None) -> None:
    logging.basicConfig(level=logging.INFO)
    flare.init()
    site, job_id = flare.get_site_name(), flare.get_job_id()
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
            runtime = runtime_for(runtime, site, meta, local, writer, job_id)
            result = run_task(runtime, task_name, model, settings)
        except Exception as e:  # noqa: BLE001 - reported to the server, which leaves this site out
            log.exception("site %s: task '%s' failed", site, task_name)
            runtime = None  # rebuilt from the last checkpoint if the server asks again
            result = flare.FLModel(params={}, meta={P.ERROR: f"{type(e).__name__}: {e}"})
        flare.send(result)


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
        return flare.FLModel(
            params={},
            meta={
                "cohort": data.cohort,
                "num_train": data.num_train,
                "class_counts": data.class_counts,
                "data_root": runtime.data_root,  # None: the embedded synthetic federation
                "state_dir": str(runtime.state_dir),
                "settings": (settings or SettingsReport()).to_meta(),
                "round_estimate_s": estimate_round_seconds(runtime),  # for the first round's deadline
            },
        )
    if task_name == P.TASK_TRAIN:
        download = P.model_to_download(model)
        upload = run_round(runtime, download, model.meta[P.ROUND])
        results = runtime.results()
        summary = {k: results[k] for k in ("best", "last", "ood", "cohort")}
        summary["download_drop"] = runtime.download_drop(model.meta[P.ROUND])  # the federation run's mean drop
        return P.upload_to_model(upload, summary, download.params)
    raise ValueError(f"site {runtime.name}: unknown task '{task_name}'")
