"""The calibration's tools (docs/calibration.md): the grid runs the baselines only, the table reads kept runs."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("methods", ["prr", "fedavg,fml", "fedbn,harmofl"])
def test_the_grid_refuses_a_method_the_bench_judges(tmp_path, methods):
    env = {**os.environ, "METHODS": methods, "PYTHON": sys.executable}
    done = subprocess.run(["bash", str(ROOT / "benchmarks/shift_grid.sh"), str(tmp_path / "w")], env=env, capture_output=True, text=True)
    assert done.returncode == 2
    assert "baselines only" in done.stderr
    assert not list((tmp_path / "w").glob("build_*"))  # nothing was built


def _kept_run(
    root: Path, device: str, task: str, shift: str, method: str, scores: dict[str, float], metric: str, reported_at: str | None = None
) -> None:
    run = root / device / f"{task}_shift{shift}" / f"{method}_s0"
    sites = {f"site-{i + 1}": {"cohort": c, "best": {"test": {metric: v}}} for i, (c, v) in enumerate(scores.items())}
    server = run / "server" / "simulate_job" / "results.json.gz"
    server.parent.mkdir(parents=True)
    server.write_bytes(gzip.compress(json.dumps({"sites": sites}).encode()))
    site = run / "site-1" / "prrfl" / f"{task}_{method}_s0" / "results.json"
    site.parent.mkdir(parents=True)
    site.write_text(json.dumps({"code_commit": "abcdef0123456789", **({"reported_at": reported_at} if reported_at else {})}))
    (run.parent / f"{method}_s0.done.json").write_text("{}")


def test_the_table_gives_each_baselines_gap_to_fedavg_of_the_same_device_and_shift(tmp_path):
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import calibration_table
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    _kept_run(tmp_path, "cpu", "derm", "3", "fedavg", {"A": 70.0, "B": 30.0}, "f1")
    _kept_run(tmp_path, "cpu", "derm", "3", "fedbn", {"A": 74.0, "B": 32.0}, "f1")
    _kept_run(tmp_path, "h100", "derm", "3", "fedbn", {"A": 90.0, "B": 90.0}, "f1")  # another device: no gap to cpu's FedAvg
    text = "\n".join(calibration_table.tables(calibration_table.runs(tmp_path)))
    _kept_run(tmp_path / "global", "cpu", "derm", "3", "fedbn", {"A": 10.0, "B": 10.0}, "f1", reported_at="download")
    text = "\n".join(calibration_table.tables(calibration_table.runs(tmp_path)))
    assert "| trained | cpu | abcdef0 | 3 | 0 | fedbn | 74.00 | 32.00 | 53.00 |" in text
    assert "| global | cpu | abcdef0 | 3 | 0 | fedbn | 10.00 | 10.00 | 10.00 |" in text
    # (74 + 32) / 2 - (70 + 30) / 2 = 3.00; the paper's FedBN gap on dermoscopy 60.96 - 51.64 = 9.32
    assert "* trained, cpu, shift 3, seed 0: FedAvg 50.00; fedbn +3.00 (+9.3)" in text
    gaps = text.split("the paper's gap in brackets")[1]
    assert "h100, shift 3" not in gaps and "global, cpu" not in gaps  # no FedAvg of that device or protocol
