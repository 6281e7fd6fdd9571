"""FCA's Table 4 from the held-out Fed-ISIC2019 bench's kept runs, with the paper's figures beside ours.

Reads the kept runs (benchmarks/bench_sweep.sh with TASKS=isic2019: docs/results/heldout/isic2019/<loss>/, and the
runs of Table 4's baselines kept by the calibration at the task's default shift) and prints, in Markdown:

1. Table 4's layout: per method (and the loss it trained with), specialization and generalization bACC and bAUC,
   mean ± sample std over seeds, FCA's bACC beside them, and the paired tests of each method against FCA and against
   PRR's P (the paper's own loss, CPA): specialization over the (centre, seed) pairs (Wilcoxon signed-rank),
   generalization over the seeds (paired t-test: one value per seed);
2. each centre that lacks classes in training: its model's test recall of each class its test split holds, per
   method, mean over seeds.

    python benchmarks/fca_table4.py [<kept run or folder> ...] [--out docs/results/heldout/isic2019/table4.md]
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
from collections import defaultdict
from pathlib import Path

from prrfl.report.protocol import protocol_results
from prrfl.report.runs import find_results
from prrfl.report.stats import MISSING, mean_std, paired_test
from prrfl.storage import save_text
from prrfl.tasks.isic2019.task import DEFAULT_DATA

BSM = '[class_loss="balanced_softmax"]'
# label -> (Table 4's row, its specialization / generalization bACC); FCA trains every framework with balanced softmax
TABLE4 = {
    f"local{BSM}": ("Local Learning", 70.0, 33.7),
    f"fedavg{BSM}": ("FedAvg", 69.5, 69.0),
    f"fedprox{BSM}": ("FedProx", 70.0, 69.7),
    f"moon{BSM}": ("MOON", 69.5, 67.6),
    f"creff{BSM}": ("CReRF", 67.6, 68.6),
    "creff": ("CReRF", 67.6, 68.6),
    "fedrs": ("FedRS", 70.2, 69.4),
    "fedlc": ("FedLC", 67.8, 69.5),
    "balancefl": ("BalanceFL", 66.4, 70.8),
    f"fedrep{BSM}": ("FedRep", 72.6, 69.2),
    f"fedbabu{BSM}": ("FedBABU", 72.1, 68.4),
    "fca": ("FCA", 75.9, 74.3),
    "fedavg": ("FedAvg, cross entropy (loss comparison)", 63.5, 63.1),
}
# the other methods of the bench: PRR (its personalized model P, its deputy D) and TMI's methods
NAMES = {"prr": "PRR, P", "prr/deputy": "PRR, D", "fml": "FML", "fedproto": "FedProto", "fedbn": "FedBN", "harmofl": "HarmoFL"}
FCA, PRR_P = "fca", "prr"  # PRR with the paper's CPA loss, its personalized model P
MISSING_CLASS_CENTRES = ("HAM_vidir_molemax", "MSK", "HAM_vienna_dias")


def default_runs(root: Path) -> list[Path]:
    shift = f"{DEFAULT_DATA['synthetic_shift']:g}"
    calibration = [root / "isic2019_calibration" / loss / f"isic2019_shift{shift}" for loss in ("bsm", "ce")]
    return sorted((root / "heldout" / "isic2019").glob("*/*_s[0-9].kept.json.gz")) + [
        p for folder in calibration for p in sorted(folder.glob("*_s[0-9].kept.json.gz"))
    ]


def loss_of(label: str) -> str:
    base = label.split("/")[0]
    if BSM in base:
        return "balanced softmax"
    own = {
        "fca": "balanced softmax (its own)",
        "prr": "CPA (its own)",
        "fedrs": "restricted softmax (its own)",
        "fedlc": "logit calibration (its own)",
        "balancefl": "class-balanced batches (its own)",
        "fedavg": "cross entropy",
    }
    return own.get(base, "its own")


def table4(protocols: list[dict]) -> str:
    by_label: dict[str, list[dict]] = defaultdict(list)
    for p in protocols:
        by_label[p["method"]].append(p)

    def spec(label: str) -> dict[tuple[str, int], float]:
        return {(site, p["seed"]): v["bacc"] for p in by_label[label] for site, v in p["specialization"]["per_site"].items()}

    def gen(label: str) -> dict[int, float]:
        return {p["seed"]: p["generalization"]["values"]["bacc"] for p in by_label[label] if p.get("generalization")}

    order = sorted(by_label, key=lambda m: (list(TABLE4).index(m) if m in TABLE4 else len(TABLE4), m))
    header = "| method | loss | seeds | Spec bACC | Gen bACC | Spec bAUC | Gen bAUC | FCA's Table 4 Spec / Gen bACC | p Spec / Gen vs FCA | p Spec / Gen vs PRR's P |"
    lines = [header, "|---" * 10 + "|"]
    for label in order:
        runs = by_label[label]
        cells = []
        for metric in ("bacc", "auc"):
            for part in ("specialization", "generalization"):
                cells.append(mean_std([p[part]["values"][metric] for p in runs if p.get(part)]))
        paper = TABLE4.get(label)
        tests = []
        for ref in (FCA, PRR_P):
            if label == ref or ref not in by_label:
                tests.append(MISSING)
            else:
                tests.append(f"{fmt(paired_test(spec(label), spec(ref)).p)} / {fmt(paired_test(gen(label), gen(ref)).p)}")
        base, _, role = label.partition("/")
        plain = base.split("[")[0] + (f"/{role}" if role else "")
        name = paper[0] if paper else NAMES.get(plain, label)
        lines.append(
            f"| {name} (`{label}`) | {loss_of(label)} | {len(runs)} | {cells[0]} | {cells[1]} | {cells[2]} | {cells[3]} | "
            f"{f'{paper[1]} / {paper[2]}' if paper else MISSING} | {tests[0]} | {tests[1]} |"
        )
    return "\n".join(lines)


def fmt(p: float) -> str:
    return MISSING if math.isnan(p) else f"{p:.2g}"


def class_recall(results: list) -> str:
    """Each centre lacking classes in training: its model's test recall per class present in its test split."""
    from prrfl.tasks.isic2019.layout import CLASS_NAMES

    lines = []
    for centre in MISSING_CLASS_CENTRES:
        mine = [r for r in results if r.cohort == centre and r.best and not r.other_model]
        if not mine:
            continue
        present = [c for c in CLASS_NAMES if any(not math.isnan(r.best["test"].get(f"recall_{c}", math.nan)) for r in mine)]
        counts = mine[0].class_counts or []
        lacks = [c for c, n in zip(CLASS_NAMES, counts, strict=False) if n == 0]
        lines += [f"**{centre}** (no training image of {', '.join(lacks) or 'none'}): test recall (%) per class, mean over seeds", ""]
        lines += ["| method | " + " | ".join(present) + " | bACC |", "|---" * (len(present) + 2) + "|"]
        by_method: dict[str, list] = defaultdict(list)
        for r in mine:
            by_method[r.method].append(r.best["test"])
        for method in sorted(by_method, key=lambda m: (list(TABLE4).index(m) if m in TABLE4 else len(TABLE4), m)):
            tests = by_method[method]
            cells = [f"{statistics.mean(t[f'recall_{c}'] for t in tests):.1f}" for c in present]
            lines.append(f"| `{method}` | " + " | ".join(cells) + f" | {statistics.mean(t['bacc'] for t in tests):.1f} |")
        lines.append("")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="*", type=Path, help="kept runs or folders (default: the bench's and the calibration's)")
    parser.add_argument("--results", type=Path, default=Path("docs/results"), help="where the kept runs lie (default docs/results)")
    parser.add_argument("--out", type=Path, help="write the Markdown here instead of printing it")
    args = parser.parse_args(argv)
    runs = args.runs or default_runs(args.results)
    if not runs:
        print(f"no kept isic2019 run under {args.results}", file=sys.stderr)
        return 2
    results = find_results(runs, task="isic2019")
    text = (
        "## FCA's Table 4 layout (Fed-ISIC2019)\n\n"
        + table4(protocol_results(results))
        + "\n\n## Centres with missing classes\n\n"
        + class_recall(results)
    )
    if args.out:
        save_text(text, args.out)
    else:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
