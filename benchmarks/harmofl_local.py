"""Which part of HarmoFL stops a site's model from learning? One site's first round alone (no federation):
the shared training loop on one cohort of a task's bench data, for FedAvg and for HarmoFL with and
without its parts, printing after each local epoch the test score of the task's primary metric and, for a
classification task, the test AUC, the mean training loss of the epoch (the task loss at the unperturbed
weights) and the test recall of each class; first the site's training images per class and the entropy of their
prior (the loss, in nats, of a model that predicts the prior for every image).

    python benchmarks/harmofl_local.py [--task derm] [--cohort A] [--epochs 2] [variant ...]

Variants: fedavg, harmofl (the paper's defaults), harmofl_alpha0 (no weight perturbation),
harmofl_dc (the authors' code's DC-only amplitude normalization), harmofl_dc_alpha0, harmofl_authors (the
authors' code's whole recipe: DC-only normalization from the first batch's amplitude, BatchNorm without affine
parameters or running statistics, alpha 0.05). Each starts from the same initial weights (torch seed 0) and
sees the same batches (generator seed 1). About a minute per variant and epoch for dermoscopy site A on one
CPU thread.
"""

from __future__ import annotations

import argparse
import math
import tempfile
import time
from dataclasses import dataclass
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
    "harmofl_authors": ("harmofl", {"amp_scope": "dc", "amp_update": "first_batch", "bn_plain": True}),
}


@dataclass
class FirstRound:
    """One variant's round 0 at one site."""

    metric: str  # the task's primary metric
    tests: list[dict[str, float]]  # the test metrics after each local epoch
    losses: list[float]  # the mean training loss of each local epoch
    class_counts: list[int]  # the site's training images per class
    class_names: list[str]


def first_round(task_name: str, cohort: str, epochs: int, variant: str, state_dir: Path) -> FirstRound:
    method_name, args = VARIANTS[variant]
    settings = job_config(f"{task_name}_{method_name}", "bench").to_dict()
    settings.update(method_args=args, num_rounds=1, local_epochs=epochs, eval_test_every_epoch=True)
    cfg = RunConfig.from_dict(settings)
    task = build_task(cfg)
    method = build_method(cfg, task)
    data = task.load_site(cohort, torch.device("cpu"), None)
    losses: list[float] = []

    def log_scalar(tag: str, value: float, step: int) -> None:
        if tag == f"loss/{method.eval_role}":
            losses.append(float(value))

    site = SiteRuntime.start(
        cohort, cfg, task, method, data, state_dir / variant, model_seed=0, generator_seed=1, run_id="harmofl-local", log_scalar=log_scalar
    )
    run_round(site, Download(params=site.models[method.upload_role].state_dict(), round=0), 0)
    tests = [h["test"] for h in site.history if h["kind"] == "epoch"]
    return FirstRound(task.primary_metric, tests, losses, list(data.class_counts or []), list(task.class_names))


def prior_entropy(counts: list[int]) -> float:
    """The entropy (nats) of the class prior of these counts: the cross-entropy of a model that predicts the
    prior for every image."""
    total = sum(counts)
    return -sum(c / total * math.log(c / total) for c in counts if c > 0)


def joined(tests: list[dict[str, float]], key: str) -> str:
    return ", ".join(f"{t[key]:.1f}" for t in tests)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--task", default="derm")
    parser.add_argument("--cohort", default="A")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("variants", nargs="*", help=f"any of {', '.join(VARIANTS)} (default: all)")
    args = parser.parse_args()
    unknown = [v for v in args.variants if v not in VARIANTS]
    if unknown:
        parser.error(f"unknown variant(s) {', '.join(unknown)}: choose from {', '.join(VARIANTS)}")
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        for i, variant in enumerate(args.variants or list(VARIANTS)):
            tick = time.perf_counter()
            run = first_round(args.task, args.cohort, args.epochs, variant, Path(tmp))
            classification = bool(run.class_counts) and "auc" in run.tests[0]
            if i == 0 and classification:
                entropy = prior_entropy(run.class_counts)
                print(f"site {args.cohort}: training images per class {run.class_counts}, class prior entropy {entropy:.3f} nats")

            line = f"{variant:18s} test {run.metric} after each epoch: {joined(run.tests, run.metric)}"
            if classification:
                line += f"; AUC {joined(run.tests, 'auc')}; training loss {', '.join(f'{v:.3f}' for v in run.losses)}"
                line += "".join(f"; recall of {name} {joined(run.tests, f'recall_{name}')}" for name in run.class_names)
            print(f"{line}  ({time.perf_counter() - tick:.0f} s)", flush=True)


if __name__ == "__main__":
    main()
