"""Every kept calibration run in one table per task, and the gaps the calibration targets (docs/calibration.md).

Reads <root>/<device>/<task>_shift<s>/<method>_s<seed>.kept.json.gz as benchmarks/keep_results.py keeps a sweep
of benchmarks/shift_grid.sh (or the run folders <method>_s<seed>/ of a sweep), and prints, per task: each run's test
metric of the papers' tables (F1; Dice per slice) at every site's best validation round and their mean, with the commit the
run was made with and the model it reports ("global": the global model as each site receives it, every round's
aggregate scored; "global, last unscored": the same before the last round's aggregate was scored too; "trained": the
site's model after its local epochs, the protocol of runs made before `report_global_model` existed); then, per
(device, model reported, rounds, shift, seed), each baseline's mean minus FedAvg's, beside the paper's gap. A gap is read
between runs of one device: GPU and CPU runs of one seed do not give the same numbers.

    python benchmarks/calibration_table.py [docs/results/calibration] [--write docs/calibration.md]

`--write` puts the tables into the document, between its `<!-- calibration_table: begin -->` and `end` lines.
"""

from __future__ import annotations

import math
import re
import statistics
import sys
from collections import defaultdict
from pathlib import Path

import scipy.stats

from prrfl.kept import done_marker, run_name
from prrfl.storage import existing_json, find_json, load_json

METRIC = {"derm": "f1", "prostate": "slice_dice"}
# TMI 2022 Tables II and III: each baseline's mean minus FedAvg's (FedAvg: dermoscopy 51.64 F1, prostate 69.11 Dice)
PAPER_GAP = {
    "derm": {"fedbn": 60.96 - 51.64, "silobn": 57.63 - 51.64, "fedprox": 49.11 - 51.64, "ida": 49.64 - 51.64},
    "prostate": {"fedbn": 74.26 - 69.11, "silobn": 73.16 - 69.11},
}
RUN = re.compile(r"(?P<method>[a-z0-9]+)_s(?P<seed>\d+)$")
FOLDER = re.compile(r"(?P<task>[a-z]+)_shift(?P<shift>[0-9.]+)$")


def runs(root: Path) -> list[dict]:
    found = []
    for server in find_json(root, "results.json", recursive=True):
        if server.parent.name != "simulate_job":
            continue
        run_dir = server.parents[2]
        run, folder = RUN.match(run_name(run_dir)), FOLDER.match(run_dir.parent.name)
        if not (run and folder):
            continue
        task = folder["task"]
        sites = load_json(server)["sites"]
        site_files = find_json(run_dir, "results.json", recursive=True)
        first = next((load_json(p) for p in site_files if p.parent.name != "simulate_job"), {})
        commit = first.get("code_commit")
        scores = {v["cohort"]: v["best"]["test"][METRIC[task]] for v in sites.values() if v.get("best")}
        found.append(
            {
                "device": run_dir.parents[1].name,
                "task": task,
                "shift": float(folder["shift"]),
                "method": run["method"],
                "seed": int(run["seed"]),
                "commit": (commit or "?")[:7],
                "rounds": first.get("rounds_completed", "?"),
                "reports": reported(first),
                "sites": scores,
                "mean": sum(scores.values()) / len(scores) if scores else float("nan"),
                "done": existing_json(done_marker(run_dir)) is not None,
            }
        )
    return sorted(found, key=lambda r: (r["task"], r["reports"], r["device"], str(r["rounds"]), r["shift"], r["seed"], r["method"]))


def reported(site: dict) -> str:
    """ "trained": the model after the local epochs; "global": the global model as received, every round's aggregate
    scored; "global, last unscored": runs made before the last round's aggregate was scored (TASK_SCORE)."""
    if site.get("reported_at") != "download":
        return "trained"
    scored = [h["global_round"] for h in site.get("history", []) if h.get("kind") == "download" and "global_round" in h]
    return "global" if scored and max(scored) == site["rounds_completed"] - 1 else "global, last unscored"


def tables(found: list[dict]) -> list[str]:
    lines = []
    for task in sorted({r["task"] for r in found}):
        mine = [r for r in found if r["task"] == task]
        cohorts = list(dict.fromkeys(c for r in mine for c in r["sites"]))
        lines += [f"### {task}: test {METRIC[task]} at each site's best validation round", ""]
        lines += ["| model reported | device | commit | rounds | shift | seed | method | " + " | ".join(cohorts) + " | mean |"]
        lines += ["|---" * (8 + len(cohorts)) + "|"]
        for r in mine:
            cells = " | ".join(f"{r['sites'][c]:.2f}" if c in r["sites"] else "–" for c in cohorts)
            mark = "" if r["done"] else " (no done marker)"
            lines.append(
                f"| {r['reports']} | {r['device']} | {r['commit']} | {r['rounds']} | {r['shift']:g} | {r['seed']} | {r['method']}{mark} | {cells} | {r['mean']:.2f} |"
            )
        lines += [
            "",
            "Each baseline's mean minus FedAvg's of the same model reported, device, rounds, shift and seed (the paper's gap in brackets):",
            "",
        ]
        groups: dict[tuple, dict[str, float]] = defaultdict(dict)
        for r in mine:
            groups[(r["reports"], r["device"], r["rounds"], r["shift"], r["seed"])][r["method"]] = r["mean"]
        for (reports, device, rounds, shift, seed), means in groups.items():
            if "fedavg" not in means:
                continue
            gaps = [f"{m} {means[m] - means['fedavg']:+.2f} ({target(task, m)})" for m in means if m != "fedavg"]
            lines.append(
                f"* {reports}, {device}, {rounds} rounds, shift {shift:g}, seed {seed}: FedAvg {means['fedavg']:.2f}; "
                + ("; ".join(gaps) or "no other baseline yet")
            )
        lines += ["", *over_seeds(task, mine), ""]
    return lines


def over_seeds(task: str, mine: list[dict]) -> list[str]:
    """Per (model reported, device, rounds, shift) with FedAvg at two seeds or more: each baseline's gap to FedAvg, mean ±
    sample std over the seeds both ran (the targets' reading), and FedAvg's worst site: its mean distance below
    FedAvg's mean and what FedBN scores there."""
    by: dict[tuple, dict[int, dict[str, dict]]] = defaultdict(lambda: defaultdict(dict))
    for r in mine:
        by[(r["reports"], r["device"], r["rounds"], r["shift"])][r["seed"]][r["method"]] = r
    lines = []
    for (reports, device, rounds, shift), seeds in by.items():
        with_fedavg = {s: m for s, m in seeds.items() if "fedavg" in m}
        if len(with_fedavg) < 2:
            continue
        if not lines:
            lines += [
                "Over seeds (mean ± sample std of the per-seed gaps; n = seeds where both ran; CI: half-width of the 95 % "
                "confidence interval of the mean gap, Student's t with n - 1 degrees of freedom):",
                "",
            ]
        methods = sorted({m for ms in with_fedavg.values() for m in ms} - {"fedavg"})
        base = [ms["fedavg"]["mean"] for ms in with_fedavg.values()]
        parts = [f"FedAvg {statistics.mean(base):.2f} ± {_std(base):.2f} (n={len(base)})"]
        for m in methods:
            gaps = [ms[m]["mean"] - ms["fedavg"]["mean"] for ms in with_fedavg.values() if m in ms]
            parts.append(f"{m} {statistics.mean(gaps):+.2f} ± {_std(gaps):.2f} (n={len(gaps)}; CI ±{_ci(gaps):.1f}; {target(task, m)})")
        worst = []
        for ms in with_fedavg.values():
            sites = ms["fedavg"]["sites"]
            site = min(sites, key=sites.get)
            lifted = ms["fedbn"]["sites"].get(site) if "fedbn" in ms else None
            worst.append(f"{site} {sites[site] - ms['fedavg']['mean']:+.1f}" + (f" (FedBN {lifted:.1f})" if lifted is not None else ""))
        lines.append(
            f"* {reports}, {device}, {rounds} rounds, shift {shift:g}: "
            + "; ".join(parts)
            + "; FedAvg's worst site per seed: "
            + ", ".join(worst)
        )
    return lines


def target(task: str, method: str) -> str:
    """The paper's gap to FedAvg where its table gives one ("+9.3"), and for FedProx and IDA the calibration's bound."""
    parts = [f"{PAPER_GAP[task][method]:+.1f}"] if method in PAPER_GAP[task] else []
    if method in ("fedprox", "ida"):
        parts.append("target at most +2")
    return "; ".join(parts) or "no paper value"


def _std(values: list[float]) -> float:
    return statistics.stdev(values) if len(values) > 1 else float("nan")


def _ci(values: list[float]) -> float:
    """Half-width of the 95 % confidence interval of the mean of `values` (Student's t); nan below 2 values."""
    if len(values) < 2:
        return float("nan")
    return float(scipy.stats.t.ppf(0.975, len(values) - 1)) * _std(values) / math.sqrt(len(values))


def write_into(doc: Path, text: str, name: str = "calibration_table") -> None:
    """Replace what stands between the `<!-- <name>: begin -->` and `<!-- <name>: end -->` lines of `doc` with `text`
    (benchmarks/fca_calibration_table.py writes its own tables by its own name)."""
    BEGIN, END = f"<!-- {name}: begin -->", f"<!-- {name}: end -->"
    content = doc.read_text()
    if content.count(BEGIN) != 1 or content.count(END) != 1:
        raise SystemExit(f"{doc}: expected one '{BEGIN}' and one '{END}' line to write the tables between")
    head, rest = content.split(BEGIN)
    tail = rest.split(END)[1]
    doc.write_text(f"{head}{BEGIN}\n\n{text.strip()}\n\n{END}{tail}")


def main() -> None:
    args = sys.argv[1:]
    doc = None
    if "--write" in args:
        i = args.index("--write")
        doc = Path(args[i + 1])
        del args[i : i + 2]
    root = Path(args[0] if args else "docs/results/calibration")
    text = "\n".join(tables(runs(root)))
    if doc is None:
        print(text)
    else:
        write_into(doc, text)


if __name__ == "__main__":
    main()
