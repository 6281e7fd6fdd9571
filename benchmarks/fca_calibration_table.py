"""The Fed-ISIC2019 calibration's runs and their gaps against FCA's Table 4 (docs/calibration.md, "Fed-ISIC2019").

Reads every kept run of benchmarks/isic2019_calibration.sh,
<root>/<loss>/isic2019_shift<s>/<method>_s<seed>.kept.json.gz (<loss>: bsm, balanced softmax; ce, cross entropy),
and prints: each run's specialization and generalization (FCA's protocol, `prrfl crosseval`: bACC and bAUC); per
(shift, seed) the three gaps of Table 4's baseline pattern beside the paper's and the sum of their distances (the
screen's rule); over the seeds of each shift, each gap's mean ± sample std and whether it meets its tolerance.

    python benchmarks/fca_calibration_table.py [docs/results/isic2019_calibration] [--write docs/calibration.md]

`--write` puts the tables between the document's `<!-- fca_calibration_table: begin -->` and `end` lines.
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys
from collections import defaultdict
from pathlib import Path

from prrfl.kept import KEPT_SUFFIX, run_name
from prrfl.storage import find_json, load_json

# FCA's Table 4 (bACC, %): (specialization, generalization)
TABLE4 = {"fedavg/ce": (63.5, 63.1), "fedavg/bsm": (69.5, 69.0), "local/bsm": (70.0, 33.7), "fedprox/bsm": (70.0, 69.7)}
# the pattern: (label, run, minus run, tolerance per part (spec, gen) as a test of (our gap, Table 4's), in words)
GAPS = [
    ("FedAvg BSM - CE", "fedavg/bsm", "fedavg/ce", (lambda o, p: abs(o - p) <= 3,) * 2, "within 3 of Table 4's"),
    (
        "Local - FedAvg",
        "local/bsm",
        "fedavg/bsm",
        (lambda o, p: abs(o - p) <= 5, lambda o, p: o <= -20),
        "spec within 5 of Table 4's; gen at least 20 below",
    ),
    ("FedProx - FedAvg", "fedprox/bsm", "fedavg/bsm", (lambda o, p: abs(o - p) <= 2,) * 2, "within 2 of Table 4's"),
]
RUN = re.compile(r"(?P<method>[a-z0-9]+)_s(?P<seed>\d+)$")
FOLDER = re.compile(r"isic2019_shift(?P<shift>[0-9.]+)$")
PARTS = ("specialization", "generalization")


def runs(root: Path) -> dict[tuple[float, int], dict[str, dict[str, dict[str, float]]]]:
    """(shift, seed) -> "<method>/<loss>" -> part -> {"bacc", "auc"}."""
    found: dict[tuple[float, int], dict] = defaultdict(dict)
    for kept in sorted(root.glob("*/isic2019_shift*/*_s*")):  # kept runs (or run folders, as a sweep leaves them)
        if not (kept.is_dir() or kept.name.endswith(KEPT_SUFFIX)):
            continue
        run, folder = RUN.match(run_name(kept)), FOLDER.match(kept.parent.name)
        if not (run and folder):
            continue
        cross = find_json(kept, "crosseval.json", recursive=True)
        cross = [load_json(p) for p in cross if p.parent.parent.name == "prrfl"]
        if not cross:
            continue
        found[(float(folder["shift"]), int(run["seed"]))][f"{run['method']}/{kept.parent.parent.name}"] = {
            part: cross[0][part]["values"] for part in PARTS
        }
    return found


def gaps(means: dict[str, dict[str, dict[str, float]]]) -> list[tuple[str, tuple[float, float], tuple[float, float]]]:
    """(label, our gap (spec, gen), Table 4's gap) for every gap both runs of which are there."""
    out = []
    for label, run, minus, _, _ in GAPS:
        if run in means and minus in means:
            ours = tuple(means[run][p]["bacc"] - means[minus][p]["bacc"] for p in PARTS)
            paper = tuple(TABLE4[run][i] - TABLE4[minus][i] for i in range(2))
            out.append((label, ours, paper))
    return out


def distance(found: list) -> float:
    return sum(abs(o - p) for _, ours, paper in found for o, p in zip(ours, paper, strict=True))


def tables(found: dict) -> list[str]:
    lines = ["| shift | seed | run | Spec bACC | Gen bACC | Spec bAUC | Gen bAUC | Table 4 Spec / Gen bACC |", "|---" * 8 + "|"]
    for (shift, seed), means in sorted(found.items()):
        for run in sorted(means, key=list(TABLE4).index):
            m = means[run]
            cells = " | ".join(f"{m[p][k]:.2f}" for k in ("bacc", "auc") for p in PARTS)
            lines.append(f"| {shift:g} | {seed} | {run} | {cells} | {TABLE4[run][0]} / {TABLE4[run][1]} |")
    lines += ["", "Gaps in bACC, specialization / generalization (Table 4's in brackets), and their distance to Table 4's:", ""]
    for (shift, seed), means in sorted(found.items()):
        g = gaps(means)
        parts = [f"{label} {o[0]:+.2f} / {o[1]:+.2f} ({p[0]:+.1f} / {p[1]:+.1f})" for label, o, p in g]
        whole = f"distance {distance(g):.2f}" if len(g) == len(GAPS) else "not every gap yet"
        lines.append(f"* shift {shift:g}, seed {seed}: " + "; ".join([*parts, whole]))
    lines += ["", "Over seeds (mean ± sample std of the per-seed gaps; tolerance met?):", ""]
    by_shift: dict[float, list[list]] = defaultdict(list)
    for (shift, _), means in sorted(found.items()):
        by_shift[shift].append(gaps(means))
    for shift, per_seed in sorted(by_shift.items()):
        parts = []
        for i, (label, _, _, tests, words) in enumerate(GAPS):
            seen = [g[i] for g in per_seed if len(g) == len(GAPS)]
            if len(seen) < 2:
                continue
            paper = seen[0][2]
            cells = []
            for j, part in enumerate(("spec", "gen")):
                values = [s[1][j] for s in seen]
                mean = statistics.mean(values)
                met = tests[j](mean, paper[j])
                cells.append(f"{part} {mean:+.2f} ± {statistics.stdev(values):.2f} ({'met' if met else 'not met'})")
            parts.append(f"{label} (n={len(seen)}; {words}): " + ", ".join(cells))
        if parts:
            lines.append(f"* shift {shift:g}: " + "; ".join(parts))
    return lines


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("root", nargs="?", default="docs/results/isic2019_calibration", type=Path)
    parser.add_argument("--write", type=Path, help="the document to write the tables into")
    args = parser.parse_args(argv)
    text = "\n".join(tables(runs(args.root))) + "\n"
    if args.write:
        from calibration_table import write_into  # beside this script (its folder leads sys.path)

        write_into(args.write, text, "fca_calibration_table")
    else:
        print(text, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
