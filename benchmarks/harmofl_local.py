"""Which part of HarmoFL stops a site's model from learning? One site's first round alone (no federation):
the shared training loop on one cohort of a task's bench data, for FedAvg and for HarmoFL with and
without its parts, printing the test score of the task's primary metric after each local epoch.

    python benchmarks/harmofl_local.py [--task derm] [--cohort A] [--epochs 2] [variant ...]

Variants: fedavg, harmofl (the paper's defaults), harmofl_alpha0 (no weight perturbation),
harmofl_dc (the authors' code's DC-only amplitude normalization), harmofl_dc_alpha0. Each starts from the
same initial weights (torch seed 0) and sees the same batches (generator seed 1). About a minute per
variant and epoch for dermoscopy site A on one CPU thread.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import torch

from prrfl.config import RunConfig
from prrfl.flare.jobs import job_config
from prrfl.messages import Download
from prrfl.registry import build_method, build_task
from prrfl.site.state import SiteRuntime
from prrfl.site.trainer import run_round

VARIANTS = {
    "fedavg": ("fedavg", {}),
    "harmofl": ("harmofl", {}),
    "harmofl_alpha0": ("harmofl", {"alpha": 0.0}),
    "harmofl_dc": ("harmofl", {"amp_scope": "dc"}),
    "harmofl_dc_alpha0": ("harmofl", {"amp_scope": "dc", "alpha": 0.0}),
}


def first_round(task_name: str, cohort: str, epochs: int, variant: str, state_dir: Path) -> list[float]:
    """The primary test metric after each local epoch of round 0 at one site."""
    method_name, args = VARIANTS[variant]
    settings = job_config(f"{task_name}_{method_name}", "bench").to_dict()
    settings.update(method_args=args, num_rounds=1, local_epochs=epochs, eval_test_every_epoch=True)
    cfg = RunConfig.from_dict(settings)
    task = build_task(cfg)
    method = build_method(cfg, task)
    data = task.load_site(cohort, torch.device("cpu"), None)
    site = SiteRuntime.start(cohort, cfg, task, method, data, state_dir / variant, model_seed=0, generator_seed=1, run_id="harmofl-local")
    run_round(site, Download(params=site.models[method.upload_role].state_dict(), round=0), 0)
    return [h["test"][task.primary_metric] for h in site.history if h["kind"] == "epoch"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--task", default="derm")
    parser.add_argument("--cohort", default="A")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("variants", nargs="*", default=list(VARIANTS), choices=list(VARIANTS))
    args = parser.parse_args()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        for variant in args.variants:
            tick = time.perf_counter()
            scores = first_round(args.task, args.cohort, args.epochs, variant, Path(tmp))
            shown = ", ".join(f"{s:.1f}" for s in scores)
            print(f"{variant:18s} test after each epoch: {shown}  ({time.perf_counter() - tick:.0f} s)", flush=True)


if __name__ == "__main__":
    main()
