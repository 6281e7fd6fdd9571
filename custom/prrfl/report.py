"""Result tables from the per-site summaries that runs write."""

from __future__ import annotations

import math
from typing import Any


def results_table(summaries: dict[str, dict[str, Any]], metrics: tuple[str, ...] = ("f1", "auc")) -> str:
    """Markdown table: one row per site (test metrics at its best validation round) and the mean."""
    header = "| site | best round | " + " | ".join(f"test {m.upper()}" for m in metrics) + " |"
    lines = [header, "|" + "---|" * (2 + len(metrics))]
    columns: dict[str, list[float]] = {m: [] for m in metrics}
    for site in sorted(summaries):
        best = summaries[site].get("best") or {}
        test = best.get("test", {})
        values = []
        for m in metrics:
            v = test.get(m, math.nan)
            columns[m].append(v)
            values.append(f"{v:.2f}")
        lines.append(f"| {site} | {best.get('round', '-')} | " + " | ".join(values) + " |")
    means = [_nanmean(columns[m]) for m in metrics]
    lines.append("| **mean** | | " + " | ".join(f"**{v:.2f}**" for v in means) + " |")
    return "\n".join(lines)


def _nanmean(values: list[float]) -> float:
    finite = [v for v in values if not math.isnan(v)]
    return sum(finite) / len(finite) if finite else math.nan
