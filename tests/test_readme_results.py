"""README's held-out tables say what the reports in git say: every "mean ± std" of a table that follows a link to a
held-out report (`report: [heldout/<task>](docs/results/heldout/<task>/report/report.md)`) is in that report."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LINK = re.compile(r"report: \[heldout/\w+\]\((docs/results/heldout/\w+/report/report\.md)\)")
FIGURE = re.compile(r"\d+\.\d+ ± \d+\.\d+")


def tables_after_links(text: str) -> list[tuple[str, list[str]]]:
    """(report path, the rows of the first Markdown table after its link) for each link to a held-out report."""
    found = []
    for link in LINK.finditer(text):
        rest = text[link.end() :]
        start = rest.find("\n|")
        rows = []
        for line in rest[start + 1 :].splitlines():
            if not line.startswith("|"):
                break
            rows.append(line)
        found.append((link.group(1), rows))
    return found


def test_every_figure_of_readmes_held_out_tables_is_in_its_report():
    tables = tables_after_links((ROOT / "README.md").read_text())
    assert {path.split("/")[3] for path, _ in tables} >= {"prostate", "derm"}, "README links no held-out report"
    for path, rows in tables:
        report = (ROOT / path).read_text()
        figures = [f for row in rows for f in FIGURE.findall(row)]
        assert figures, f"README's table after {path} has no 'mean ± std' figure"
        missing = [f for f in figures if f not in report]
        assert not missing, f"README's table after {path} has figures its report does not: {missing}"


def test_a_figure_the_report_does_not_hold_is_named():
    text = "report: [heldout/derm](docs/results/heldout/derm/report/report.md)\n\n| m | ours |\n|---|---|\n| x | 1.23 ± 0.45 |\n\nafter"
    [(path, rows)] = tables_after_links(text)
    assert path.endswith("heldout/derm/report/report.md") and rows[-1] == "| x | 1.23 ± 0.45 |"
    assert FIGURE.findall(rows[-1]) == ["1.23 ± 0.45"]
