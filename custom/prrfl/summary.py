"""A run's per-site summary as the server writes it at the end of a run and `prrfl results` prints it: each site's
participation (from the server's round history) and the markdown results table."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from prrfl.metrics import label, nanmean
from prrfl.naming import site_label


def participation(history: list[dict[str, Any]], sites: list[str]) -> dict[str, dict[str, Any]]:
    """Per site, from the server's round history: the rounds its upload was aggregated in, the rounds it
    missed, and whether its numbers are stale (it missed the last round, so they are of an earlier one)."""
    rounds = [h["round"] for h in history]
    out = {}
    for site in sites:
        aggregated = [h["round"] for h in history if site in h["sites"]]
        missed = sorted(set(rounds) - set(aggregated))
        out[site] = {
            "rounds": len(rounds),
            "aggregated": aggregated,
            "missed": missed,
            "stale": bool(rounds) and rounds[-1] in missed,
        }
    return out


def results_table(summaries: dict[str, dict[str, Any]], metrics: Sequence[str], note: str = "") -> str:
    """Markdown table: one row per site, named by its site label (`site-1_A`, prrfl.naming), with its test metrics at
    its best validation round, and the mean. With the server's `participation` in the summaries, a column of rounds
    taken part in, and a mark plus a note for every site whose numbers are stale or that missed rounds; then `note`
    (the task's `table_note`: how its metrics count)."""
    with_rounds = any("participation" in s for s in summaries.values())
    header = "| site | best round | " + ("rounds | " if with_rounds else "") + " | ".join(f"test {label(m)}" for m in metrics) + " |"
    lines = [header, "|" + "---|" * (2 + with_rounds + len(metrics))]
    notes = []
    columns: dict[str, list[float]] = {m: [] for m in metrics}
    for site in sorted(summaries):
        best = summaries[site].get("best") or {}
        test = best.get("test", {})
        values = []
        for m in metrics:
            v = test.get(m, math.nan)
            columns[m].append(v)
            values.append("-" if math.isnan(v) else f"{v:.2f}")
        site_name = site_label(site, summaries[site].get("cohort"))
        name, rounds = site_name, ""
        part = summaries[site].get("participation")
        if with_rounds:
            rounds = f"{len(part['aggregated'])}/{part['rounds']} | " if part else "- | "
        if part and part["missed"]:
            last = part["aggregated"][-1] if part["aggregated"] else None
            name = f"{site_name} (stale)" if part["stale"] else f"{site_name} (missed rounds)"
            if last is None:
                stale = "; no upload of it was ever aggregated, so it has no numbers"
            elif part["stale"]:
                stale = f"; its numbers are those of round {last}, its last aggregated upload"
            else:
                stale = ""
            notes.append(f"* {site_name}: missed round(s) {part['missed']}{stale}")
        lines.append(f"| {name} | {best.get('round', '-')} | {rounds}" + " | ".join(values) + " |")
    means = [nanmean(columns[m]) for m in metrics]
    lines.append("| **mean** | | " + ("| " if with_rounds else "") + " | ".join(f"**{v:.2f}**" for v in means) + " |")
    return "\n".join(lines + ([""] + notes if notes else []) + (["", note] if note else []))
