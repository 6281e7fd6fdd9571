"""Training throughput of the site loop beside a bare PyTorch loop: what the hardware allows for the network.

    python benchmarks/site_throughput.py [job] [--threads N] [--device cpu|cuda] [--epochs E] [--methods fedavg,prr]
                                         [--numerics float32,bf16,channels_last,compile,bf16+channels_last+compile]
                                         [--set KEY=VALUE ...]

For a job's task, data and batch size (default derm_prr: the quick dermoscopy federation, 64 px, batch 16), at one
site (its first cohort), on the same machine, one after the other:

* **bare**: the task's network, SGD at the job's learning rate, cross entropy, over the same training images already
  normalized on the device, in the same batches: forward, backward, step, nothing else. The limit of the hardware
  for this network and batch size.
* **bare + augmentation**: the same, with the task's training augmentation drawn per batch (the site loop's input).
* **site loop**: `prrfl.site.trainer.train_epoch` of each method (FedAvg trains one model, PRR two: P and D, every
  model counted), the one loop every method runs.

`--numerics` measures all three once per numerics of the run's config (`prrfl.numerics`; docs/running.md, "Faster
numerics on a GPU"), comma-separated, each a `+`-joined set of `float32` (the default: none), `bf16` (precision
"bf16"), `channels_last` and `compile` (torch_compile): the bare loops compute as the site loop does. The last lines
are a table of every numerics' images/s and its speed-up over the first.

Threads default to what a simulator site gets: the machine's cores divided by the task's sites (at least 1).
Images/s are the best of the epochs after a warm-up epoch (which also compiles, with `compile`). A benchmark, not a
test: compare lines of one run.
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

from prrfl.config import RunConfig, apply_overrides
from prrfl.messages import Download
from prrfl.numerics import prepare_model
from prrfl.registry import build_method, build_task
from prrfl.site.state import SiteRuntime
from prrfl.site.trainer import _synchronized, train_epoch

ROOT = Path(__file__).resolve().parents[1]
# --numerics words -> the config settings they stand for
NUMERICS = {"float32": {}, "bf16": {"precision": "bf16"}, "channels_last": {"channels_last": True}, "compile": {"torch_compile": True}}


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
    model = prepare_model(task.build_model().to(device), cfg, compiled=True).train()
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


def numerics_settings(spec: str) -> dict[str, dict]:
    """`--numerics` -> {its name: the config settings}, e.g. "float32,bf16+compile"; an unknown word is an error naming the known ones."""
    out = {}
    for name in spec.split(","):
        unknown = [w for w in name.split("+") if w not in NUMERICS]
        if unknown:
            raise argparse.ArgumentTypeError(f"unknown numerics {unknown} in {name!r}: join some of {list(NUMERICS)} with +")
        out[name] = {k: v for w in name.split("+") for k, v in NUMERICS[w].items()}
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("job", nargs="?", default="derm_prr")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--methods", default="fedavg,prr")
    parser.add_argument("--numerics", type=numerics_settings, default="float32", help="comma-separated, each words joined by +")
    parser.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE", help="a config field of the job, e.g. data.synthetic_raw_size=[200,150]"
    )
    args = parser.parse_args(argv)
    base = apply_overrides(job_config(args.job), args.set)
    task = build_task(RunConfig.from_dict(base))
    threads = args.threads or max(1, (os.cpu_count() or 1) // len(task.site_names))
    torch.set_num_threads(threads)
    device = torch.device(args.device)
    data = task.load_site(task.cohorts[0], device, None)
    methods = args.methods.split(",")
    print(f"{args.job}: site {data.cohort}, {data.num_train} training images, batch {base['batch_size']}, {threads} thread(s), {device}")
    rates: dict[str, list[float]] = {}
    for name, settings in args.numerics.items():
        cfg = RunConfig.from_dict({**base, **settings})
        bare = bare_loop(task, data.train, cfg, device, augment=False, epochs=args.epochs)
        print(f"[{name}] bare loop (normalized inputs, forward/backward/step): {bare:.1f} images/s")
        augmented = bare_loop(task, data.train, cfg, device, augment=True, epochs=args.epochs)
        print(f"[{name}] bare loop + the task's augmentation: {augmented:.1f} images/s ({100 * augmented / bare:.0f} % of bare)")
        rates[name] = [bare, augmented]
        for method in methods:
            rate = site_loop(RunConfig.from_dict({**base, **settings, "method": method}), task, data, device, args.epochs)
            print(f"[{name}] site loop, {method} (every model counted): {rate:.1f} images/s ({100 * rate / bare:.0f} % of bare)")
            rates[name].append(rate)
    first = next(iter(rates.values()))
    print(f"\n| numerics | bare | bare + augmentation | {' | '.join(f'site loop, {m}' for m in methods)} |")
    print("|---|" + "---|" * (2 + len(methods)))
    for name, row in rates.items():
        print(f"| {name} | " + " | ".join(f"{r:.1f} ({r / f:.2f}x)" for r, f in zip(row, first)) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
