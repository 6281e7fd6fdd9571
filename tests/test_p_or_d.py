"""benchmarks/p_or_d.py: per site, the one of P and D whose best validation Dice is higher, read from kept runs."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def p_or_d():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import p_or_d
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    return p_or_d


def _site(root: Path, seed: int, site: str, cohort: str, rounds: list[tuple[float, float, float, float]]) -> None:
    """A PRR site whose rounds score (P valid, P test, D valid, D test) Dice; P's best round chosen as the site does."""
    history = [
        {
            "kind": "round",
            "round": r,
            "epochs_done": r + 1,
            "valid": {"dice": pv, "slice_dice": pv},
            "test": {"dice": pt, "slice_dice": pt},
            "other_models": {"deputy": {"valid": {"dice": dv, "slice_dice": dv}, "test": {"dice": dt, "slice_dice": dt}}},
        }
        for r, (pv, pt, dv, dt) in enumerate(rounds)
    ]
    best_round = max(range(len(rounds)), key=lambda r: (rounds[r][0], -r))  # the first maximum
    best = {k: history[best_round][k] for k in ("round", "valid", "test")}
    path = root / f"prr_s{seed}" / site / "prrfl" / f"prostate_prr_s{seed}" / "results.json"
    path.parent.mkdir(parents=True)
    record = {"task": "prostate", "method": "prr", "seed": seed, "run_id": f"run{seed}", "site": site, "cohort": cohort}
    record |= {"rounds_completed": len(rounds), "best": best, "last": history[-1], "history": history, "reported_model": "personal"}
    path.write_text(json.dumps(record))


def test_each_site_reports_the_model_whose_best_validation_is_higher(p_or_d, tmp_path):
    # site A: P's best validation 80 (round 1, test 75), D's 85 (round 0, test 70): D is chosen and tests 70
    _site(tmp_path, 0, "site-1", "A", [(70.0, 60.0, 85.0, 70.0), (80.0, 75.0, 82.0, 90.0)])
    # site B: P 90 (round 0, test 88) against D 90 (round 1): a tie keeps P
    _site(tmp_path, 0, "site-2", "B", [(90.0, 88.0, 50.0, 40.0), (89.0, 99.0, 90.0, 95.0)])
    results = p_or_d.find_results([tmp_path])
    metric, rows = p_or_d.readings(results)
    assert metric == "slice_dice"
    assert [(r["cohort"], r["choice"], r["P"], r["D"], r["chosen"]) for r in rows] == [
        ("A", "D", 75.0, 70.0, 70.0),
        ("B", "P", 88.0, 95.0, 88.0),
    ]
    assert p_or_d.summary(rows) == {"P": [81.5], "D": [82.5], "chosen": [79.0]}  # (75+88)/2, (70+95)/2, (70+88)/2


def test_a_run_without_its_deputy_is_refused(p_or_d, tmp_path):
    _site(tmp_path, 1, "site-1", "A", [(70.0, 60.0, 85.0, 70.0)])
    results = [r for r in p_or_d.find_results([tmp_path]) if r.method == "prr"]  # as if D were never recorded
    with pytest.raises(SystemExit, match="P and D are not both recorded"):
        p_or_d.readings(results)
