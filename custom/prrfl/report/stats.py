"""The tidy tables every report is built from (one row per method, seed, site, split and metric; the
retrogress drops), and the statistics over them: mean ± sample std, the paired test against the reference."""

from __future__ import annotations

import csv
import logging
import math
import warnings
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from prrfl.metrics import download_drops, nanmean, shared_model_drops
from prrfl.report.runs import SiteResult

log = logging.getLogger(__name__)


LONG_FIELDS = ("method", "seed", "run_id", "site", "cohort", "split", "metric", "value")
RETROGRESS_FIELDS = ("method", "seed", "run_id", "site", "cohort", "model", "round", "before", "after", "drop")
WILCOXON_MIN_PAIRS = 6  # below this the signed-rank test cannot reach p < 0.05: use a paired t-test
MISSING = "–"


# ----- tidy tables -------------------------------------------------------------------------
def long_rows(results: Sequence[SiteResult]) -> list[dict[str, Any]]:
    """One row per (method, seed, site, split, metric): the tidy form every table is built from."""
    rows = []
    for r in results:
        for split, metrics in r.evaluations().items():
            for metric in sorted(metrics):
                rows.append({**r.identity(), "split": split, "metric": metric, "value": metrics[metric]})
    return rows


def retrogress_rows(results: Sequence[SiteResult], metric: str, model: str = "reported") -> list[dict[str, Any]]:
    """One row per site and communication round r >= 1: the test metric of the last local epoch of
    round r-1 (just before communication), right after the download of round r, and the drop; of the
    site's reported model, or with model="shared" of the model it uploads and the download overwrites
    (PRR's deputy; the reported model for most methods; recorded by newer runs only)."""
    drops = {"reported": download_drops, "shared": shared_model_drops}[model]
    rows = []
    for r in results:
        for rnd, (before, after) in drops(r.history, metric).items():
            rows.append({**r.identity(), "model": model, "round": rnd, "before": before, "after": after, "drop": before - after})
    return rows


def write_csv(rows: Sequence[dict[str, Any]], fields: Sequence[str], path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=fields)
        writer.writeheader()
        writer.writerows(rows)
    return path


def values_by_method(rows: Sequence[dict[str, Any]], split: str, metric: str) -> dict[str, dict[tuple[str, int], float]]:
    """method -> {(cohort, seed): value} for one split and metric."""
    out: dict[str, dict[tuple[str, int], float]] = defaultdict(dict)
    for row in rows:
        if row["split"] == split and row["metric"] == metric:
            out[row["method"]][(row["cohort"], row["seed"])] = row["value"]
    return out


# ----- statistics --------------------------------------------------------------------------
def mean_std(values: Sequence[float]) -> str:
    """'mean ± std' (sample std, ddof=1) over seeds; the bare value for one seed."""
    finite = [v for v in values if not math.isnan(v)]
    if not finite:
        return MISSING
    if len(finite) == 1:
        return f"{finite[0]:.2f}"
    return f"{np.mean(finite):.2f} ± {sample_std(finite):.2f}"


def sample_std(values: Sequence[float]) -> float:
    """Sample standard deviation (ddof=1); 0 for a single value."""
    return float(np.std(values, ddof=1)) if len(values) > 1 else 0.0


@dataclass(frozen=True)
class PairedTest:
    p: float
    test: str  # "Wilcoxon" or "t"
    n: int

    def __str__(self) -> str:
        return MISSING if math.isnan(self.p) else f"{self.p:.3g} ({self.test}, n={self.n})"


def paired_test(values: dict[Any, float], reference: dict[Any, float]) -> PairedTest:
    """Two-sided paired test on the keys both have (here (cohort, seed)): Wilcoxon signed-rank from
    WILCOXON_MIN_PAIRS pairs on, else a paired t-test; p is NaN with fewer than 2 pairs or when the
    test is undefined (e.g. identical values)."""
    from scipy import stats

    keys = sorted(k for k in values.keys() & reference.keys() if not (math.isnan(values[k]) or math.isnan(reference[k])))
    a, b = [values[k] for k in keys], [reference[k] for k in keys]
    if len(keys) < 2:
        return PairedTest(math.nan, "", len(keys))
    wilcoxon = len(keys) >= WILCOXON_MIN_PAIRS
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # degenerate differences: NaN, reported as such
        p = float((stats.wilcoxon(a, b) if wilcoxon else stats.ttest_rel(a, b)).pvalue)
    return PairedTest(p, "Wilcoxon" if wilcoxon else "t", len(keys))


def _seed_averages(by_key: dict[tuple[str, int], float]) -> list[float]:
    """Per seed, the mean over the sites: the 'Avg' of one run."""
    per_seed: dict[int, list[float]] = defaultdict(list)
    for (_, seed), value in by_key.items():
        per_seed[seed].append(value)
    return [nanmean(per_seed[s]) for s in sorted(per_seed)]


def _cohort_values(by_key: dict[tuple[str, int], float], cohort: str) -> list[float]:
    return [v for (c, _), v in sorted(by_key.items()) if c == cohort]
