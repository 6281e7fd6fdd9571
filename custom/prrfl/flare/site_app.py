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
from prrfl.flare import protocol as P
from prrfl.flare.site_config import SiteConfig
from prrfl.registry import build_method, build_task
from prrfl.site.state import SiteRuntime
from prrfl.site.trainer import run_round

log = logging.getLogger("prrfl.site")


def seed_for(seed: int, site: str) -> int:
    """A per-site seed that does not depend on Python's salted hash()."""
    return (seed * 1_000_003 + sum((i + 1) * ord(ch) for i, ch in enumerate(site))) % (2**31)


def build_runtime(site: str, meta: dict, local: SiteConfig, writer: SummaryWriter | None) -> SiteRuntime:
    cfg = RunConfig.from_dict(meta[P.CONFIG])
    task = build_task(cfg)
    method = build_method(cfg, task)
    device = torch.device(local.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if device.type == "cpu":
        torch.set_num_threads(local.num_threads or max(1, (os.cpu_count() or 1) // max(1, meta.get(P.NUM_SITES, 1))))
    cohort = local.cohort or task.cohort_of(site)
    data = task.load_site(cohort, device, local.data_root)
    torch.manual_seed(seed_for(cfg.seed, site))
    models = {role: task.build_model().to(device) for role in method.roles}
    optimizers = {
        role: torch.optim.SGD(m.parameters(), lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay)
        for role, m in models.items()
    }
    runtime = SiteRuntime(
        name=site,
        cfg=cfg,
        task=task,
        method=method,
        data=data,
        device=device,
        state_dir=Path(local.state_dir or Path("prrfl") / cfg.run_name).resolve(),
        models=models,
        optimizers=optimizers,
        generator=torch.Generator().manual_seed(seed_for(cfg.seed, site)),
        run_id=meta[P.RUN_ID],
        data_root=local.data_root,
        log_scalar=(lambda tag, value, step: writer.add_scalar(tag, float(value), global_step=step)) if writer else (lambda *a: None),
    )
    runtime.restore(before_round=meta.get(P.ROUND, 0))  # a prepare task (no round) starts a new run
    return runtime


def main(argv: list[str] | None = None) -> None:
    logging.basicConfig(level=logging.INFO)
    local = SiteConfig.load(argv)
    flare.init()
    site = flare.get_site_name()
    writer = SummaryWriter()
    runtime: SiteRuntime | None = None
    while flare.is_running():
        model = flare.receive()
        if model is None:
            break
        meta = model.meta or {}
        task_name = flare.get_task_name()
        try:
            runtime = runtime_for(runtime, site, meta, local, writer)
            result = run_task(runtime, task_name, model)
        except Exception as e:  # noqa: BLE001 - reported to the server, which leaves this site out
            log.exception("site %s: task '%s' failed", site, task_name)
            runtime = None  # rebuilt from the last checkpoint if the server asks again
            result = flare.FLModel(params={}, meta={P.ERROR: f"{type(e).__name__}: {e}"})
        flare.send(result)


def runtime_for(runtime: SiteRuntime | None, site: str, meta: dict, local: SiteConfig, writer) -> SiteRuntime:
    """The live runtime, or a new one restored from the checkpoint: in a new process, for another run,
    or when the server asks again for a round this process already trained (a resumed server)."""
    round_idx = meta.get(P.ROUND)
    if runtime is None or runtime.run_id != meta.get(P.RUN_ID) or (round_idx is not None and round_idx <= runtime.round_idx):
        return build_runtime(site, meta, local, writer)
    return runtime


def run_task(runtime: SiteRuntime, task_name: str, model: flare.FLModel) -> flare.FLModel:
    if task_name == P.TASK_PREPARE:
        data = runtime.data
        return flare.FLModel(params={}, meta={"cohort": data.cohort, "num_train": data.num_train, "class_counts": data.class_counts})
    if task_name == P.TASK_TRAIN:
        download = P.model_to_download(model)
        upload = run_round(runtime, download, model.meta[P.ROUND])
        results = runtime.results()
        return P.upload_to_model(upload, {k: results[k] for k in ("best", "last", "ood", "cohort")}, download.params)
    raise ValueError(f"site {runtime.name}: unknown task '{task_name}'")
