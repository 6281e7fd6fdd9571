"""The reports in docs/results and the kept runs they come from (benchmarks/results_reports.py): every report in git is
in its list or an archive whose README says its runs were not kept; every listed report reads kept runs in git; one
report rebuilt from those runs alone is the report.md in git byte for byte (`python benchmarks/results_reports.py
--check` does the same for all of them)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "docs" / "results"


@pytest.fixture(scope="module")
def reports():
    spec = importlib.util.spec_from_file_location("results_reports", ROOT / "benchmarks" / "results_reports.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


def tracked(pattern: str) -> list[Path]:
    if not (ROOT / ".git").exists():
        return sorted(RESULTS.rglob(pattern))
    done = subprocess.run(
        ["git", "ls-files", "-z", f"docs/results/**/{pattern}", f"docs/results/{pattern}"], cwd=ROOT, capture_output=True, check=True
    )
    return sorted(ROOT / name for name in done.stdout.decode().split("\0") if name)


def test_every_report_in_git_is_listed_or_an_archive_that_says_so(reports):
    folders = [str(p.parent.relative_to(RESULTS)) for p in tracked("report.md")]
    assert folders, "no report.md found in docs/results"
    unlisted = [f for f in folders if f not in reports.REPORTS and f not in reports.ARCHIVED]
    assert not unlisted, f"reports no list rebuilds (add them to benchmarks/results_reports.py): {unlisted}"
    assert set(reports.REPORTS) <= set(folders), f"listed reports missing from git: {sorted(set(reports.REPORTS) - set(folders))}"
    for archive in reports.ARCHIVED:
        readme = (RESULTS / archive / "README.md").read_text()
        assert "not kept" in readme, f"{archive}/README.md must say that its runs were not kept (nothing rebuilds its report)"


def test_every_listed_report_reads_kept_runs_that_are_in_git(reports):
    in_git = set(tracked("*.kept.json.gz"))
    for name, report in reports.REPORTS.items():
        runs = reports.run_files(report, RESULTS)
        assert runs, f"{name}: no kept run matches {report.runs}"
        assert set(runs) <= in_git, f"{name} reads runs not in git: {sorted(set(runs) - in_git)[:3]}"


def test_the_ablation_report_rebuilds_from_its_kept_runs_byte_for_byte(reports):
    """The held-out bench's dermoscopy ablations (12 runs): the smallest held-out report, so the test stays short."""
    assert reports.check("heldout/derm_ablation/report", RESULTS) is None


def test_a_changed_report_is_named_with_its_first_differing_line(reports, tmp_path):
    name = "derm_bench_e5/report"
    copy = tmp_path / "results"
    for run in reports.run_files(reports.REPORTS[name], RESULTS):
        target = copy / run.relative_to(RESULTS)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(run.read_bytes())
    kept = (RESULTS / name / "report.md").read_text().splitlines()
    kept[2] += " (edited)"
    (copy / name).mkdir(parents=True)
    (copy / name / "report.md").write_text("\n".join(kept) + "\n")
    problem = reports.check(name, copy)
    assert problem is not None and "line 3" in problem and "(edited)" in problem
