"""The calibration's tools (docs/calibration.md): the grid runs the baselines only, the table reads kept runs."""

from __future__ import annotations

import gzip
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize(
    ("tasks", "methods"),
    [
        ("derm prostate", "prr"),
        ("derm prostate", "fedavg,fml"),
        ("derm prostate", "fedbn,harmofl"),
        ("derm", "local"),  # not a baseline of TMI's tables
        ("isic2019", "fedavg,fca"),
        ("isic2019", "fedbn"),  # a baseline of TMI's, judged on FCA's ground
        ("isic2019", "moon"),
    ],
)
def test_the_grid_refuses_a_method_the_bench_judges(tmp_path, tasks, methods):
    env = {**os.environ, "TASKS": tasks, "METHODS": methods, "PYTHON": sys.executable}
    done = subprocess.run(["bash", str(ROOT / "benchmarks/shift_grid.sh"), str(tmp_path / "w")], env=env, capture_output=True, text=True)
    assert done.returncode == 2
    assert "baselines only" in done.stderr
    assert not list((tmp_path / "w").glob("build_*"))  # nothing was built


def _kept_run(
    root: Path,
    device: str,
    task: str,
    shift: str,
    method: str,
    scores: dict[str, float],
    metric: str,
    reported_at: str | None = None,
    seed: int = 0,
    global_rounds: int = 2,
    rounds: int = 2,
) -> None:
    """A kept run of `rounds` rounds; a global-model run ("download") scored the aggregates of rounds 0 ..
    global_rounds - 1."""
    run = root / device / f"{task}_shift{shift}" / f"{method}_s{seed}"
    sites = {f"site-{i + 1}": {"cohort": c, "best": {"test": {metric: v}}} for i, (c, v) in enumerate(scores.items())}
    server = run / "server" / "simulate_job" / "results.json.gz"
    server.parent.mkdir(parents=True)
    server.write_bytes(gzip.compress(json.dumps({"sites": sites}).encode()))
    site = run / "site-1" / "prrfl" / f"{task}_{method}_s{seed}" / "results.json"
    site.parent.mkdir(parents=True)
    history = [{"kind": "download", "round": r + 1, "global_round": r} for r in range(global_rounds)]
    extra = {"reported_at": reported_at, "history": history} if reported_at else {}
    site.write_text(json.dumps({"code_commit": "abcdef0123456789", "rounds_completed": rounds, **extra}))
    (run.parent / f"{method}_s{seed}.done.json").write_text("{}")


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
    assert "| trained | cpu | abcdef0 | 2 | 3 | 0 | fedbn | 74.00 | 32.00 | 53.00 |" in text
    assert "| global | cpu | abcdef0 | 2 | 3 | 0 | fedbn | 10.00 | 10.00 | 10.00 |" in text
    # (74 + 32) / 2 - (70 + 30) / 2 = 3.00; the paper's FedBN gap on dermoscopy 60.96 - 51.64 = 9.32
    assert "* trained, cpu, 2 rounds, shift 3, seed 0: FedAvg 50.00; fedbn +3.00 (+9.3)" in text
    gaps = text.split("the paper's gap in brackets")[1]
    assert "h100, shift 3" not in gaps and "global, cpu" not in gaps  # no FedAvg of that device or protocol
    (tmp_path / "cpu/derm_shift3/fedbn_s0.done.json").unlink()  # marked as such in the table
    text = "\n".join(calibration_table.tables(calibration_table.runs(tmp_path)))
    assert _benchmark("keep_results").compact(tmp_path) == 4  # each run as one file (benchmarks/keep_results.py)
    assert sorted(p.name for p in tmp_path.rglob("*") if p.is_file())[0] == "fedavg_s0.kept.json.gz"
    assert "\n".join(calibration_table.tables(calibration_table.runs(tmp_path))) == text
    assert "| fedbn (no done marker) |" in text


def test_the_table_marks_runs_whose_last_aggregate_was_not_scored_and_reads_gaps_over_seeds(tmp_path):
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import calibration_table
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    old = tmp_path / "old"
    _kept_run(old, "cpu", "prostate", "1.5", "fedavg", {"U": 50.0, "R": 80.0}, "slice_dice", reported_at="download", global_rounds=1)
    assert "| global, last unscored | cpu | abcdef0 | 2 | 1.5 | 0 | fedavg |" in "\n".join(
        calibration_table.tables(calibration_table.runs(old))
    )
    # two seeds: FedBN's gaps 70 - 65 = +5 and 74 - 67 = +7 (mean +6.00, sample std sqrt(2) = 1.41); SiloBN one seed
    for seed, fedavg, fedbn in ((0, (50.0, 80.0), (60.0, 80.0)), (1, (54.0, 80.0), (68.0, 80.0))):
        _kept_run(tmp_path, "cpu", "prostate", "1.5", "fedavg", dict(zip("UR", fedavg)), "slice_dice", "download", seed)
        _kept_run(tmp_path, "cpu", "prostate", "1.5", "fedbn", dict(zip("UR", fedbn)), "slice_dice", "download", seed)
    _kept_run(tmp_path, "cpu", "prostate", "1.5", "silobn", {"U": 50.0, "R": 82.0}, "slice_dice", "download", 0)
    # a longer schedule of the same seed is a comparison of its own, not mixed into the one above
    longer = tmp_path / "schedule"
    _kept_run(longer, "cpu", "prostate", "1.5", "fedavg", {"U": 90.0, "R": 90.0}, "slice_dice", "download", 0, 6, 6)
    text = "\n".join(calibration_table.tables(calibration_table.runs(tmp_path)))
    assert "* global, cpu, 6 rounds, shift 1.5, seed 0: FedAvg 90.00; no other baseline yet" in text
    line = next(li for li in text.splitlines() if li.startswith("* global, cpu, 2 rounds, shift 1.5: FedAvg"))
    assert "FedAvg 66.00 ± 1.41 (n=2)" in line  # (65 + 67) / 2
    # CI: t(0.975, 1 dof) = 12.706, times 1.41421 / sqrt(2) = 12.71
    assert "fedbn +6.00 ± 1.41 (n=2; CI ±12.7; +5.2)" in line and "silobn +1.00 ± nan (n=1; CI ±nan; +4.0)" in line
    # the worst site U: 50 - 65 = -15 (FedBN 60) and 54 - 67 = -13 (FedBN 68)
    assert line.endswith("FedAvg's worst site per seed: U -15.0 (FedBN 60.0), U -13.0 (FedBN 68.0)")


def _benchmark(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _global_curve():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import global_curve
    finally:
        sys.path.pop(0)
    return global_curve


def test_the_rounds_rule_reads_the_smoothed_curve_of_the_global_model():
    gc = _global_curve()
    values = [26, 26, 40, 60, 62, 61, 63, 62]
    # centred means over 3 (2 at the ends): 26, 30.67, 42, 54, 61, 62, 62, 62.5
    assert gc.smoothed(values) == pytest.approx([26, 92 / 3, 42, 54, 61, 62, 62, 62.5])
    assert gc.rounds_needed(values, within=2) == 5  # 61 >= 62.5 - 2 first at aggregate 4
    assert gc.rounds_needed(values, within=10) == 4  # 54 >= 52.5 at aggregate 3
    assert gc.rounds_needed([50.0], within=0) == 1


def test_the_global_curve_is_the_mean_over_sites_of_each_aggregates_validation(tmp_path):
    gc = _global_curve()
    run = tmp_path / "fedavg_s0"
    for i, curve in enumerate(([20.0, 40.0, 60.0], [30.0, 50.0])):  # the second site missed the last aggregate
        history = [{"kind": "download", "round": r + 1, "global_round": r, "valid": {"f1": v}} for r, v in enumerate(curve)]
        history.insert(0, {"kind": "round", "round": 0, "valid": {"f1": 99.0}})  # a trained model's score: not read
        results = {"site": f"site-{i + 1}", "task": "derm", "history": history, "best": {"round": len(curve) - 1}}
        path = run / f"site-{i + 1}" / "prrfl" / "r" / "results.json"
        path.parent.mkdir(parents=True)
        path.write_text(json.dumps(results))
    task, curves, best = gc.site_curves(run)
    assert task == "derm" and best == {"site-1": 2, "site-2": 1}
    assert gc.mean_curve(curves) == [25.0, 45.0]
    with pytest.raises(SystemExit, match="no site's results.json"):
        gc.site_curves(tmp_path / "empty")


def test_a_kept_run_counts_for_the_bench_only_with_the_config_the_bench_would_run_now(tmp_path):
    """A calibration run that names the default shift matches; one of another schedule or method does not."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import kept_run_matches as krm
    finally:
        sys.path.pop(0)
    from prrfl.sweep import run_config
    from prrfl.tasks.prostate.task import DEFAULT_DATA

    config = run_config("fedavg", 0, [f"data.synthetic_shift={DEFAULT_DATA['synthetic_shift']}"], "prostate", "bench").to_dict()
    marker = tmp_path / "fedavg_s0.done.json"
    marker.write_text(json.dumps({"config": config}))
    assert krm.main([str(marker), "prostate", "fedavg", "0"]) == 0
    assert krm.main([str(marker), "prostate", "fedavg", "1"]) == 1  # another seed
    assert krm.main([str(marker), "prostate", "fedavg", "0", "num_rounds=2"]) == 1
    (tmp_path / "fedavg_s0/server/simulate_job").mkdir(parents=True)
    (tmp_path / "fedavg_s0/server/simulate_job/results.json").write_text(json.dumps({"run_id": "r", "config": config, "sites": {}}))
    assert _benchmark("keep_results").compact(tmp_path) == 1
    assert krm.main([str(tmp_path / "fedavg_s0.kept.json.gz"), "prostate", "fedavg", "0"]) == 0  # the kept run's marker
    assert krm.main([str(tmp_path / "fedavg_s0.kept.json.gz"), "prostate", "fedavg", "1"]) == 1
    marker.write_text("not json")
    assert krm.main([str(marker), "prostate", "fedavg", "0"]) == 2


def _fca_run(root: Path, loss: str, shift: str, method: str, seed: int, spec: float, gen: float) -> None:
    """A run folder of benchmarks/isic2019_calibration.sh's layout holding only its crosseval.json."""
    cross = root / loss / f"isic2019_shift{shift}" / f"{method}_s{seed}" / "prrfl" / f"isic2019_{method}_s{seed}" / "crosseval.json"
    cross.parent.mkdir(parents=True)
    values = {part: {"values": {"bacc": v, "auc": v + 10}} for part, v in (("specialization", spec), ("generalization", gen))}
    cross.write_text(json.dumps(values))


def test_the_fca_calibration_reads_table_4s_three_gaps_and_their_tolerances(tmp_path):
    table = _benchmark("fca_calibration_table")
    # seed 0 at shift 1: BSM - CE = 66 - 60 = +6 / 65 - 61 = +4 (Table 4: +6.0 / +5.9); Local - FedAvg = 67 - 66 = +1 /
    # 30 - 65 = -35 (+0.5 / -35.3); FedProx - FedAvg = 66.5 - 66 = +0.5 / 66 - 65 = +1 (+0.5 / +0.7); the distance
    # |6 - 6| + |4 - 5.9| + |1 - 0.5| + |-35 + 35.3| + |0.5 - 0.5| + |1 - 0.7| = 0 + 1.9 + 0.5 + 0.3 + 0 + 0.3 = 3.0
    for seed, bump in ((0, 0.0), (1, 2.0)):
        _fca_run(tmp_path, "ce", "1", "fedavg", seed, 60.0, 61.0)
        _fca_run(tmp_path, "bsm", "1", "fedavg", seed, 66.0 + bump, 65.0)
        _fca_run(tmp_path, "bsm", "1", "local", seed, 67.0, 30.0 + 10 * bump)
        _fca_run(tmp_path, "bsm", "1", "fedprox", seed, 66.5, 66.0)
    _fca_run(tmp_path, "bsm", "2", "fedavg", 0, 50.0, 50.0)  # a shift without its other runs: no distance
    text = "\n".join(table.tables(table.runs(tmp_path)))
    assert "| 1 | 0 | fedavg/bsm | 66.00 | 65.00 | 76.00 | 75.00 | 69.5 / 69.0 |" in text
    assert "* shift 1, seed 0: FedAvg BSM - CE +6.00 / +4.00 (+6.0 / +5.9); Local - FedAvg +1.00 / -35.00 (+0.5 / -35.3); " in text
    assert "FedProx - FedAvg +0.50 / +1.00 (+0.5 / +0.7); distance 3.00" in text
    assert "* shift 2, seed 0: not every gap yet" in text
    # over seeds 0 and 1: BSM - CE spec +6 and +8 (mean +7.00 ± 1.41, 1.0 from +6.0: met); Local gen 30 - 65 = -35
    # and 50 - 65 = -15 (mean -25.00 ± 14.14: at least 20 below, met); FedProx spec +0.5 and -1.5 (mean -0.50, 1.0 from +0.5: met)
    line = next(li for li in text.splitlines() if li.startswith("* shift 1: "))
    assert "FedAvg BSM - CE (n=2; within 3 of Table 4's): spec +7.00 ± 1.41 (met), gen +4.00 ± 0.00 (met)" in line
    assert "gen -25.00 ± 14.14 (met)" in line and "FedProx - FedAvg (n=2; within 2 of Table 4's): spec -0.50 ± 1.41 (met)" in line


def test_fca_table4_puts_the_papers_figures_beside_ours_and_tests_against_fca_and_prr():
    table = _benchmark("fca_table4")
    bsm = 'fedavg[class_loss="balanced_softmax"]'

    def protocol(method, seed, spec, gen):
        per_site = {f"site-{i + 1}": {"bacc": v, "auc": 80.0} for i, v in enumerate(spec)}
        return {
            "method": method,
            "seed": seed,
            "specialization": {"per_site": per_site, "values": {"bacc": sum(spec) / len(spec), "auc": 80.0}},
            "generalization": {"values": {"bacc": gen, "auc": 90.0}},
        }

    protocols = []
    for seed in range(3):
        protocols.append(protocol("fca", seed, [70.0 + seed, 60.0 + seed], 70.0 + seed))
        protocols.append(protocol("prr", seed, [65.0, 55.0 + seed], 60.0 + 2 * seed))
        protocols.append(protocol(bsm, seed, [60.0 + seed, 50.0], 66.0 + seed * seed))
    text = table.table4(protocols)
    row = next(li for li in text.splitlines() if f"(`{bsm}`)" in li)
    # specialization per seed: (60 + s + 50) / 2 = 55, 55.5, 56 (mean 55.50, sample std 0.50); Table 4's FedAvg 69.5 / 69.0
    assert row.startswith(
        f"| FedAvg (`{bsm}`) | balanced softmax | 3 | 55.50 ± 0.50 | 67.67 ± 2.08 | 80.00 ± 0.00 | 90.00 ± 0.00 | 69.5 / 69.0 |"
    )
    # generalization against FCA: differences 66 - 70 = -4, 67 - 71 = -4, 70 - 72 = -2 over 3 seeds: paired t-test,
    # t = -3.333 / (1.1547 / sqrt 3) = -5.0 with 2 dof: p = 0.0377
    # specialization against FCA: 6 (site, seed) pairs, every one below (-10, -10, -10, -10, -11, -12): the exact
    # two-sided Wilcoxon signed-rank p = 2 / 2^6 = 0.031; against PRR's P: 60 + s - 65 and 50 - 55 - s, all below
    # again (0.031); generalization against P: 66 - 60, 67 - 62, 70 - 64 = 6, 5, 6: t = 5.667 / (0.577 / sqrt 3) = 17.0,
    # p = 0.0034
    assert row.endswith("| 0.031 / 0.038 | 0.031 / 0.0034 |")
    assert next(li for li in text.splitlines() if "(`fca`)" in li).split("|")[-3].strip() == "–"  # FCA against itself
