"""Why PRR's personalized model P fails at a small prostate site: PRR's variants side by side, in process.

Runs the quick prostate federation (5 synthetic sites, 64 px, 10 rounds x 2 epochs; UCL, BIDMC and HK train
on 2 volumes each) without FLARE, the sites and the server in one process (prrfl.site.trainer.run_round and
the method's aggregate, as the FLARE jobs run them), for each variant and seed, and prints per site the test
Dice per volume of P and D over the last five rounds (mean), P's at its best validation round, and what P
predicts on the test split (foreground share of the pixels, % of the truth's).

    python benchmarks/prr_small_site.py                          # the default variants, seeds 0 and 1
    python benchmarks/prr_small_site.py --variants prr no_distillation --seeds 0

Variants (each a job setting, `--set` style):
  prr               the paper's PRR (KL distillation, DET on the validation split)
  no_distillation   P trains on its site's slices alone (det_phases=["recover"]: only D distils, from P)
  mse10             the authors' segmentation distillation: 10 x MSE of the softmax maps
  rescue            det_rescue=0.9: P takes D's weights when phi(P) < 0.9 phi(D)
  no_pfa            pfa_enabled=false: D receives the plain average of the deputies' shared weights (FedBN-like)
  kept_optimizers   optimizers=kept: Adam's moments carry over from round to round
  prox, prox1       personal_prox=0.1, 1: P's loss gains (mu / 2) ||P - download||^2 on its shared weights (Ditto's pull)
  extended_aug      data.augmentation=extended (gamma, contrast, noise, zoom; a protocol change: for reading only)
  fedbn             FedBN on the same federation (shared convolutions, local BatchNorm)
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import torch

from prrfl.config import RunConfig, apply_overrides
from prrfl.flare.jobs import job_config
from prrfl.flare.site_app import seed_for
from prrfl.messages import Download
from prrfl.registry import build_method, task_class
from prrfl.site.state import SiteRuntime
from prrfl.site.trainer import run_round

VARIANTS: dict[str, tuple[str, list[str]]] = {
    "prr": ("prr", []),
    "no_distillation": ("prr", ['method_args.det_phases=["recover"]']),
    "mse10": ("prr", ["method_args.distillation=mse", "method_args.distill_weight=10"]),
    "rescue": ("prr", ["method_args.det_rescue=0.9"]),
    "no_pfa": ("prr", ["method_args.pfa_enabled=false"]),
    "kept_optimizers": ("prr", ["method_args.optimizers=kept"]),
    "prox": ("prr", ["method_args.personal_prox=0.1"]),
    "prox1": ("prr", ["method_args.personal_prox=1"]),
    "extended_aug": ("prr", ["data.augmentation=extended"]),
    "fedbn": ("fedbn", []),
}


def run(method: str, settings: list[str], seed: int) -> dict[str, dict[str, float]]:
    """Per site: the rounds' test Dice of the reported model and of D, P's best-validation round, and the
    reported model's predicted foreground share on the test split at the end."""
    values = apply_overrides(job_config(f"prostate_{method}").to_dict(), [*settings, f"seed={seed}", "eval_test_every_epoch=false"])
    cfg = RunConfig.from_dict(values)
    task = task_class("prostate")(cfg.data)
    state = Path(tempfile.mkdtemp(prefix="prr_small_site_"))
    sites = []
    for cohort in task.site_names:
        data = task.load_site(cohort, torch.device("cpu"), None)
        sites.append(
            SiteRuntime.start(
                cohort, cfg, task, build_method(cfg, task), data, state / cohort, model_seed=seed_for(seed, cohort), run_id="bench"
            )
        )
    counts = [sum(s.data.class_counts[c] for s in sites) for c in range(task.num_classes)]
    method_obj = sites[0].method
    torch.manual_seed(cfg.seed)
    initial = method_obj.build_model().state_dict()
    downloads = {s.name: Download(params=initial, round=0, global_class_counts=counts) for s in sites}
    server: dict = {}
    for r in range(cfg.num_rounds):
        uploads = [run_round(s, downloads[s.name], r) for s in sites]
        out = method_obj.aggregate(uploads, r, server)
        downloads = {k: Download(params=d.params, meta=d.meta, round=r + 1, global_class_counts=counts) for k, d in out.items()}
    table = {}
    for s in sites:
        rounds = [h for h in s.history if h["kind"] == "round"]
        late = rounds[-5:]
        deputy = [h["other_models"]["deputy"]["test"]["dice"] for h in late if "deputy" in h.get("other_models", {})]
        model = s.models[s.method.eval_role].eval()
        split = s.data.test
        with torch.no_grad():
            pred = torch.cat([model(x)[0].argmax(1) for x, _, _ in task.eval_batches(split)])
        table[s.name] = {
            "reported_last5": sum(h["test"]["dice"] for h in late) / len(late),
            "deputy_last5": sum(deputy) / len(deputy) if deputy else float("nan"),
            "selected": s.best["test"]["dice"],
            "selected_round": s.best["round"],
            "foreground_pct_of_truth": 100.0 * float(pred.float().mean() / split.targets.float().mean()),
            "train_volumes": int(s.data.train.groups.max()) + 1,
            "valid_volumes": int(s.data.valid.groups.max()) + 1,
        }
    return table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, help="write every figure as JSON here")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    found = {}
    for name in args.variants:
        method, settings = VARIANTS[name]
        for seed in args.seeds:
            tick = time.perf_counter()
            table = run(method, settings, seed)
            found[f"{name}/s{seed}"] = table
            cells = " | ".join(
                f"{site} P {v['reported_last5']:5.1f} D {v['deputy_last5']:5.1f} sel {v['selected']:5.1f} fg {v['foreground_pct_of_truth']:4.0f}%"
                for site, v in table.items()
            )
            print(f"{name:16s} s{seed} ({time.perf_counter() - tick:4.0f} s) | {cells}", flush=True)
    print("P, D: test Dice per volume, mean over the last 5 rounds; sel: P's test Dice at its best validation round; ")
    print("fg: the reported model's predicted foreground on the test split at the end, % of the true foreground")
    if args.out:
        args.out.write_text(json.dumps(found, indent=1))


if __name__ == "__main__":
    main()
