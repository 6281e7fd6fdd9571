"""Training throughput of the site loop beside a bare PyTorch loop: what the hardware allows for the network.

    python benchmarks/site_throughput.py [job] [--threads N] [--device cpu|cuda] [--epochs E] [--methods fedavg,prr]

For a job's task, data and batch size (default derm_prr: the quick dermoscopy federation, 64 px, batch 16), at one
site (its first cohort), on the same machine, one after the other:

* **bare**: the task's network, SGD at the job's learning rate, cross entropy, over the same training images already
  normalized on the device, in the same batches: forward, backward, step, nothing else. The limit of the hardware
  for this network and batch size.
* **bare + augmentation**: the same, with the task's training augmentation drawn per batch (the site loop's input).
* **site loop**: `prrfl.site.trainer.train_epoch` of each method (FedAvg trains one model, PRR two: P and D, every
  model counted), the one loop every method runs.

Threads default to what a simulator site gets: the machine's cores divided by the task's sites (at least 1).
Images/s are the best of the epochs after a warm-up epoch. A benchmark, not a test: compare lines of one run.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import torch

from prrfl.config import RunConfig
from prrfl.messages import Download
from prrfl.registry import build_method, build_task
from prrfl.site.state import SiteRuntime
from prrfl.site.trainer import _synchronized, train_epoch

ROOT = Path(__file__).resolve().parents[1]


def job_config(job: str) -> dict:
    server = json.loads((ROOT / "jobs" / job / "app" / "config" / "config_fed_server.json").read_text())
    return next(w["args"]["config"] for w in server["workflows"] if "config" in w.get("args", {}))


def best_rate(epochs: int, images: int, one_epoch, device: torch.device) -> float:
    seconds = []
    for _ in range(epochs + 1):  # the first warms up
        tick = time.perf_counter()
        one_epoch()
        seconds.append(_synchronized(device) - tick)
    return images / min(seconds[1:])


def bare_loop(task, train, cfg: RunConfig, device: torch.device, augment: bool, epochs: int) -> float:
    torch.manual_seed(0)
    model = task.build_model().to(device).train()
    opt = torch.optim.SGD(model.parameters(), lr=cfg.lr)
    generator = torch.Generator().manual_seed(0)
    n, b = len(train), cfg.batch_size
    if augment:
        batches = lambda: task.train_batches(train, b, generator)  # noqa: E731
    else:
        inputs, targets = task.eval_transform(train.images, train.targets)
        batches = lambda: ((inputs[i : i + b], targets[i : i + b]) for i in range(0, n - 1, b))  # noqa: E731

    def one_epoch() -> None:
        for x, y in batches():
            logits, _ = model(x)
            loss = torch.nn.functional.cross_entropy(logits, y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()

    return best_rate(epochs, n, one_epoch, device)


def site_loop(cfg: RunConfig, task, data, device: torch.device, epochs: int) -> float:
    method = build_method(cfg, task)
    with tempfile.TemporaryDirectory() as tmp:
        site = SiteRuntime.start("A", cfg, task, method, data, Path(tmp), model_seed=0, device=device, run_id="bench")
        view = site.view()
        download = Download(params=method.build_model().state_dict(), round=0, global_class_counts=data.class_counts)
        method.on_download(view, download, first=True)
        method.before_epoch(view, 0)  # PRR: DET's phase of the round's first epoch (Recover)
        return best_rate(epochs, data.num_train * len(method.roles), lambda: train_epoch(site, view), device)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("job", nargs="?", default="derm_prr")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--methods", default="fedavg,prr")
    args = parser.parse_args(argv)
    base = job_config(args.job)
    task = build_task(RunConfig.from_dict(base))
    threads = args.threads or max(1, (os.cpu_count() or 1) // len(task.site_names))
    torch.set_num_threads(threads)
    device = torch.device(args.device)
    data = task.load_site(task.cohorts[0], device, None)
    cfg = RunConfig.from_dict(base)
    print(f"{args.job}: site {data.cohort}, {data.num_train} training images, batch {cfg.batch_size}, {threads} thread(s), {device}")
    bare = bare_loop(task, data.train, cfg, device, augment=False, epochs=args.epochs)
    print(f"bare loop (normalized inputs, forward/backward/step): {bare:.1f} images/s")
    augmented = bare_loop(task, data.train, cfg, device, augment=True, epochs=args.epochs)
    print(f"bare loop + the task's augmentation: {augmented:.1f} images/s ({100 * augmented / bare:.0f} % of bare)")
    for name in args.methods.split(","):
        rate = site_loop(RunConfig.from_dict({**base, "method": name}), task, data, device, args.epochs)
        print(f"site loop, {name} (every model counted): {rate:.1f} images/s ({100 * rate / bare:.0f} % of bare)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
