"""Every report in docs/results and the kept runs it is built from, in one list: `prrfl report` rebuilds each one's
tables from those runs alone (each run one `<run>.kept.json.gz`, benchmarks/keep_results.py), byte for byte.

    python benchmarks/results_reports.py                      # rebuild every report in place (tables and figures)
    python benchmarks/results_reports.py heldout/prostate     # the reports under these folders only
    python benchmarks/results_reports.py --check              # rebuild each into a scratch folder and compare its
                                                              # report.md with the one in docs/results; exit 1 if any differ
    python benchmarks/results_reports.py --list               # each report with the number of runs it reads
    RESULTS=/path/to/docs/results python benchmarks/results_reports.py --check

The held-out bench's reports read the baselines' runs from the calibration folder of each task's default data
(`data.synthetic_shift` of the task's DEFAULT_DATA), as benchmarks/bench_sweep.sh does while it runs (it calls this
script to write them). A report whose runs were never kept (ARCHIVED) is text only: its README says so, and nothing
here rebuilds it.
"""

from __future__ import annotations

import argparse
import importlib
import os
import shutil
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
KEPT = "*_s[0-9].kept.json.gz"  # a finished run of one seed, kept as one file


@dataclass(frozen=True)
class Report:
    runs: tuple[str, ...]  # globs under the results folder; {shift:<task>} is that task's default synthetic shift
    reference: str = "prr"  # the method the paired tests compare against


def calibration(task: str, folder: str = "calibration/bench/cpu") -> str:
    return f"{folder}/{task}_shift{{shift:{task}}}/{KEPT}"


REPORTS: dict[str, Report] = {
    # the held-out bench on the calibrated federations (docs/results/heldout/README.md)
    "heldout/prostate/report": Report((f"heldout/prostate/{KEPT}", calibration("prostate"))),
    "heldout/derm/report": Report((f"heldout/derm/{KEPT}", calibration("derm"))),
    "heldout/derm_ablation/report": Report(("heldout/derm/prr_s[0-9].kept.json.gz", "heldout/derm_ablation/*/prr_s[0-9].kept.json.gz")),
    "heldout/isic2019/report": Report(
        (
            f"heldout/isic2019/*/{KEPT}",
            calibration("isic2019", "isic2019_calibration/bsm"),
            calibration("isic2019", "isic2019_calibration/ce"),
        )
    ),
    "heldout/prostate_4_rounds/report": Report(
        (f"heldout/prostate_4_rounds/{KEPT}", f"calibration/global_every_round/cpu/prostate_shift1.5/{KEPT}")
    ),
    # the bench before the calibration (docs/results/bench/README.md)
    "bench/derm/report": Report((f"bench/derm/{KEPT}",)),
    "bench/prostate/report": Report((f"bench/prostate/{KEPT}", f"bench/prostate_rescue/{KEPT}")),
    "bench/prostate_ablation/report": Report(
        ("bench/prostate/prr_s[0-9].kept.json.gz", "bench/prostate_ablation/*/prr_s[0-9].kept.json.gz")
    ),
    # the first benches, kept for the record (each folder's README says what they were)
    "derm_bench/report": Report((f"derm_bench/{KEPT}",)),
    "derm_bench_e5/report": Report((f"derm_bench_e5/{KEPT}",)),
    "derm_ablation/report": Report(("derm_bench/prr_s[0-9].kept.json.gz", "derm_ablation/*/prr_s[0-9].kept.json.gz")),
    "prostate_bench/report": Report((f"prostate_bench/{KEPT}",)),
    "prostate_bench_e5/report": Report((f"prostate_bench_e5/{KEPT}",)),
}
# reports made before runs were kept: their tables are text, their README says so
ARCHIVED = ("derm_cpu_5methods_3seeds", "h100_prr_fedavg_fedbn", "prostate_cpu_prr_fedavg_fedbn")
KEPT_BESIDE = ("overlays.jpg",)  # figures a rebuild from kept runs cannot draw (no examples arrays): kept as they are


def default_shift(task: str) -> str:
    shift = importlib.import_module(f"prrfl.tasks.{task}.task").DEFAULT_DATA["synthetic_shift"]
    return f"{shift:g}"


def run_files(report: Report, results: Path) -> list[Path]:
    """The kept runs `report` reads, in the order of its globs (each glob's matches sorted)."""
    files: list[Path] = []
    for pattern in report.runs:
        for task in ("prostate", "derm", "isic2019"):
            if f"{{shift:{task}}}" in pattern:
                pattern = pattern.replace(f"{{shift:{task}}}", default_shift(task))
        files += sorted(results.glob(pattern))
    return files


def build(name: str, results: Path, out: Path | None = None) -> Path:
    """Write the report `name` (a key of REPORTS) into `out` (default: its folder in `results`); returns report.md."""
    from prrfl.report import build_report

    report = REPORTS[name]
    runs = run_files(report, results)
    if not runs:
        raise FileNotFoundError(f"report {name}: no kept run matches {', '.join(report.runs)} under {results}")
    out = out or results / name
    return build_report(runs, out, reference=report.reference)


def check(name: str, results: Path) -> str | None:
    """None when `name` rebuilt from its kept runs gives the report.md in `results` byte for byte, else what differs."""
    kept_md = results / name / "report.md"
    if not kept_md.is_file():
        return f"{kept_md} does not exist"
    with tempfile.TemporaryDirectory(prefix="prrfl_report_check_") as scratch:
        out = Path(scratch) / "report"
        out.mkdir()
        for figure in KEPT_BESIDE:
            if (results / name / figure).is_file():
                shutil.copy2(results / name / figure, out / figure)
        rebuilt = build(name, results, out).read_bytes()
    if rebuilt == kept_md.read_bytes():
        return None
    old, new = kept_md.read_text().splitlines(), rebuilt.decode().splitlines()
    line = next((i for i, (a, b) in enumerate(zip(old, new, strict=False)) if a != b), min(len(old), len(new)))
    kept_line, rebuilt_line = (lines[line] if line < len(lines) else "<end of file>" for lines in (old, new))
    return f"{name}/report.md differs from its rebuild at line {line + 1}:\n  kept:    {kept_line}\n  rebuilt: {rebuilt_line}"


def selected(prefixes: Sequence[str]) -> list[str]:
    names = [n for n in REPORTS if not prefixes or any(n == p.rstrip("/") or n.startswith(p.rstrip("/") + "/") for p in prefixes)]
    if not names:
        raise SystemExit(f"no report under {', '.join(prefixes)}; the reports: {', '.join(REPORTS)}")
    return names


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folders", nargs="*", help="only the reports under these folders of docs/results")
    parser.add_argument("--check", action="store_true", help="compare each rebuilt report.md with the kept one")
    parser.add_argument("--list", action="store_true", help="list the reports and how many runs each reads")
    parser.add_argument("--results", type=Path, default=Path(os.environ.get("RESULTS", ROOT / "docs" / "results")))
    args = parser.parse_args(argv)
    names = selected(args.folders)
    if args.list:
        for name in names:
            print(f"{name}: {len(run_files(REPORTS[name], args.results))} runs")
        return 0
    failed = 0
    for name in names:
        if args.check:
            problem = check(name, args.results)
            print(f"{'same' if problem is None else 'DIFFERS'}: {name}" + ("" if problem is None else f"\n{problem}"))
            failed += problem is not None
        elif not run_files(REPORTS[name], args.results):  # a plan under way: none of its runs kept yet
            print(f"{name}: no kept run yet, not built")
        else:
            print(f"{build(name, args.results)}")
    if args.check:
        print(f"{len(names) - failed} of {len(names)} reports rebuilt byte for byte from their kept runs")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
