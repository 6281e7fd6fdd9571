"""How much HarmoFL's weight perturbation slows the first epochs on the derm network (README, "Measured:
PRR, FCA, HarmoFL, FedBN and FedAvg"): one site's training split, the derm job's SGD settings, the plain
network (no amplitude normalization), `epochs` epochs with HarmoFL's step (`perturbed_step`) at each alpha.
alpha = 0 is a plain optimiser step, i.e. FedAvg's local training.

    python benchmarks/harmofl_perturbation.py [--cohort A] [--epochs 6] [--alphas 0.05,0]
"""

from __future__ import annotations

import argparse

import torch

from prrfl.flare.jobs import job_config
from prrfl.methods.harmofl import perturbed_step
from prrfl.registry import build_task


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--cohort", default="A")
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--alphas", type=lambda t: [float(a) for a in t.split(",")], default=[0.05, 0.0])
    args = parser.parse_args()
    cfg = job_config("derm_harmofl")
    task = build_task(cfg)
    data = task.load_site(args.cohort, torch.device("cpu"), None)
    print(f"site {args.cohort}: {len(data.train)} training images; SGD lr {cfg.lr}, momentum {cfg.momentum}, batch {cfg.batch_size}")
    print("| alpha | epoch | training loss | test F1 | test AUC |")
    print("|---|---|---|---|---|")
    for alpha in args.alphas:
        torch.manual_seed(cfg.seed)
        model = task.build_model()
        generator = torch.Generator().manual_seed(cfg.seed)
        opt = torch.optim.SGD(model.parameters(), lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay)
        for epoch in range(args.epochs):
            model.train()
            total = count = 0
            for x, y in task.train_batches(data.train, cfg.batch_size, generator):
                loss = perturbed_step(list(model.parameters()), lambda: task.loss(model(x)[0], y), opt, alpha)  # noqa: B023 (called at once)
                total, count = total + float(loss) * len(y), count + len(y)
            test = task.evaluate(model, data.test)
            print(f"| {alpha:g} | {epoch + 1} | {total / count:.3f} | {test['f1']:.1f} | {test['auc']:.1f} |", flush=True)


if __name__ == "__main__":
    main()
