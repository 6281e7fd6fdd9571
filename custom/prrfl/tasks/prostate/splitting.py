"""Patient-level train/valid/test assignment of one site's cases.

Rule: the site's case ids, sorted, are shuffled with a generator seeded by (seed, CRC-32 of the
site name), so a site's split does not depend on which other sites are prepared; `test` takes
round(f_test * n) cases, `valid` round(f_valid * n), each at least 1 when its fraction is not 0,
and `train` the rest. `valid` takes at least `min_valid` cases (default 2) wherever the site can
spare them, i.e. wherever `train` keeps at least `min_train` cases (default 3): a site's best round
and DET's phase are then never decided by one patient's volume. A site of 12 or 13 cases (BIDMC, HK,
UCL in Table I) gets 8/2/2 or 8/2/3 instead of 9/1/2 or 9/1/3; one of 30 keeps 21/3/6; one of 4 or 5
cannot spare a second validation case and keeps one. All slices of a case go with it, so no patient
is ever in two splits. A site needs at least one case per non-empty split (3 for 7:1:2); fewer is an
error naming the site.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Sequence

import numpy as np

from prrfl.tasks.derm.splitting import check_fractions

from .layout import SPLITS


def _round(x: float) -> int:
    return int(math.floor(x + 0.5))


def site_seed(seed: int, site_name: str) -> int:
    """The split seed of one site: independent of the other sites prepared alongside it."""
    return int(np.random.SeedSequence([int(seed) & 0xFFFFFFFF, zlib.crc32(site_name.encode())]).generate_state(1)[0])


MIN_VALID_CASES = 2
MIN_TRAIN_CASES = 3


def patient_split(
    case_ids: Sequence[str],
    fractions: Sequence[float],
    seed: int,
    site_name: str,
    min_valid: int = MIN_VALID_CASES,
    min_train: int = MIN_TRAIN_CASES,
) -> dict[str, list[str]]:
    """Case ids per split (each list sorted), a partition of `case_ids` (see the module rule)."""
    if min_valid < 1 or min_train < 1:
        raise ValueError(f"min_valid and min_train must be >= 1, got {min_valid} and {min_train}")
    fr = dict(zip(SPLITS, check_fractions(fractions), strict=True))
    ids = sorted(case_ids)
    if len(set(ids)) != len(ids):
        raise ValueError(f"site {site_name}: case ids are not unique")
    n = len(ids)
    needed = sum(1 for s in SPLITS if fr[s] > 0)
    if n < needed:
        nonempty = [s for s in SPLITS if fr[s] > 0]
        raise ValueError(f"site {site_name} has {n} case(s); a patient-level split into {'/'.join(nonempty)} needs at least {needed}")
    counts = {s: (max(1, _round(fr[s] * n)) if fr[s] > 0 else 0) for s in ("test", "valid")}
    if 0 < counts["valid"] < min_valid and n - counts["test"] - min_valid >= min_train:
        counts["valid"] = min_valid
    while n - counts["test"] - counts["valid"] < 1:  # train keeps at least one case
        bigger = max(("test", "valid"), key=lambda s: counts[s])
        counts[bigger] -= 1
    order = np.random.default_rng(site_seed(seed, site_name)).permutation(n)
    shuffled = [ids[i] for i in order]
    out = {"test": shuffled[: counts["test"]], "valid": shuffled[counts["test"] : counts["test"] + counts["valid"]]}
    out["train"] = shuffled[counts["test"] + counts["valid"] :]
    return {s: sorted(out[s]) for s in SPLITS}
