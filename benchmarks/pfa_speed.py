"""The server's aggregation time on real CNNs: Progressive Fourier Aggregation (PRR) against the plain weighted average
(FedAvg) of the same state dicts, in the same run, for 3 and 10 clients of torchvision's ResNet-18 and of the project's
DeepLab-v2 (ResNet-18 backbone, the prostate model), on the CPU and, when there is one, on the GPU.

    python benchmarks/pfa_speed.py                       # CPU, torch's default threads
    python benchmarks/pfa_speed.py --threads 1 --repeats 5
    python benchmarks/pfa_speed.py --device cuda         # on a GPU machine

The "definition" column times the same aggregation with each tensor mixed by `pfa.reference_mix` (the full
complex spectrum, fftshift, box, full inverse FFT, as the paper describes it), the "deviation" column the largest
difference between the two outputs over every key and client, for float64 client states (float32 states come back
cast to float32, where a float64 rounding difference can flip the last bit of a weight).

On a GPU `pfa.fourier_mix` is the definition itself (measured faster there than the half spectrum's bookkeeping), so
the two columns time the same computation.

Each figure is the fastest of `--repeats` runs (the machine's other load only ever adds time), in seconds, with PFA's
time as a multiple of the average's. The aggregation is exactly the server's: prrfl.server.aggregation.Fourier at r =
0.35 (the first round's box) and FedAvg, each client weighted by its (made-up) training-set size; BatchNorm stays local
in PFA, as in PRR. Client states are the model's initial weights with seeded noise, one per client.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from functools import partial
from unittest import mock

import torch
import torchvision

from prrfl.algorithms import pfa
from prrfl.models.deeplab import DeepLabV2ResNet18
from prrfl.server.aggregation import FedAvg, Fourier, local_batchnorm_keys

MODELS: dict[str, Callable[[], torch.nn.Module]] = {
    "resnet18": lambda: torchvision.models.resnet18(num_classes=10),
    "deeplab": lambda: DeepLabV2ResNet18(num_classes=2),
}


def client_states(model: torch.nn.Module, clients: int, device: str) -> dict[str, dict[str, torch.Tensor]]:
    base = model.state_dict()
    states = {}
    for c in range(clients):
        g = torch.Generator().manual_seed(c)
        states[f"site-{c + 1}"] = {
            k: (v + 0.01 * torch.randn(v.shape, generator=g) if v.is_floating_point() else v.clone()).to(device) for k, v in base.items()
        }
    return states


def as_float64(states: dict[str, dict[str, torch.Tensor]]) -> dict[str, dict[str, torch.Tensor]]:
    return {c: {k: v.double() if v.is_floating_point() else v for k, v in s.items()} for c, s in states.items()}


def fastest(fn: Callable[[], object], repeats: int, device: str) -> float:
    best = float("inf")
    for _ in range(repeats):
        if device == "cuda":
            torch.cuda.synchronize()
        tick = time.perf_counter()
        fn()
        if device == "cuda":
            torch.cuda.synchronize()
        best = min(best, time.perf_counter() - tick)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--clients", type=int, nargs="+", default=[3, 10])
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    where = torch.cuda.get_device_name() if args.device == "cuda" else f"CPU, {torch.get_num_threads()} threads"
    print(f"{where}; torch {torch.__version__}; fastest of {args.repeats}")
    print("| model | params | clients | PFA (s) | definition (s) | FedAvg (s) | PFA / FedAvg | deviation (float64) |")
    print("|---|---|---|---|---|---|---|---|")
    for name in args.models:
        torch.manual_seed(0)
        model = MODELS[name]()
        params = sum(p.numel() for p in model.parameters())
        for clients in args.clients:
            states = client_states(model, clients, args.device)
            sizes = {c: 10 + i for i, c in enumerate(states)}
            fourier = Fourier(weighting="samples", bn_keys=local_batchnorm_keys(model))
            fedavg = FedAvg(weighting="samples")
            t_pfa = fastest(partial(fourier.aggregate_states, states, sizes, 0, 10), args.repeats, args.device)
            t_avg = fastest(partial(fedavg.aggregate_states, states, sizes, 0, 10), args.repeats, args.device)
            with mock.patch.object(pfa, "fourier_mix", pfa.reference_mix):
                t_def = fastest(partial(fourier.aggregate_states, states, sizes, 0, 10), args.repeats, args.device)
                by_definition = fourier.aggregate_states(as_float64(states), sizes, 0, 10)
            fast = fourier.aggregate_states(as_float64(states), sizes, 0, 10)
            deviation = max((fast[c][k] - by_definition[c][k]).abs().max().item() for c in fast for k in fast[c])
            print(
                f"| {name} | {params / 1e6:.1f} M | {clients} | {t_pfa:.2f} | {t_def:.2f} | {t_avg:.3f} | {t_pfa / t_avg:.0f}x | {deviation:.1e} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
