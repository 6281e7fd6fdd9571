"""One name for a site in every output prrfl writes or prints: `site-1_A`, the FLARE client name (what the FLARE
console, the site's workspace folder and its log lines call it) and the cohort its data is (A-D for dermoscopy,
RUNMC, BMC, ... for prostate), joined by '_'. The results table of `prrfl results` and of the server's log, the
TensorBoard and MLflow runs, the cross-site matrices and the reports all name a site by it.

The label is one token of the characters [A-Za-z0-9._-]: a TensorBoard run (a folder name), an MLflow run name, a
Markdown or CSV column header and a shell word alike, with nothing to quote. A cohort with other characters has
them replaced by '-'; a site whose client name is its cohort (a deployment naming its clients RUNMC, BMC, ...) is
named once, and a site whose cohort is not known (yet) by its client name alone.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Iterable

SEPARATOR = "_"


def site_label(site: str, cohort: str | None) -> str:
    """`site-2_B` for the FLARE client site-2 holding cohort B; the client name when the cohort is unknown or is the
    client name itself."""
    if not cohort:
        return site
    safe = re.sub(r"[^A-Za-z0-9._-]+", "-", str(cohort)).strip("-") or "cohort"
    return site if safe == site else f"{site}{SEPARATOR}{safe}"


def cohort_labels(sites: Iterable[tuple[str, str]]) -> dict[str, str]:
    """cohort -> its label, from the (client name, cohort) pairs of any number of runs: the label of the client that
    held the cohort in every run, or the cohort alone where runs gave it to clients of different names (a table
    over them groups by cohort, which no one client name fits)."""
    labels: dict[str, set[str]] = defaultdict(set)
    for site, cohort in sites:
        labels[cohort].add(site_label(site, cohort))
    return {cohort: next(iter(names)) if len(names) == 1 else cohort for cohort, names in labels.items()}
