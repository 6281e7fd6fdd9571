"""Patient-level train/valid/test assignment of one site's cases.

Rule: the site's case ids, sorted, are shuffled with a generator seeded by (seed, CRC-32 of the
site name), so a site's split does not depend on which other sites are prepared; `test` takes
round(f_test * n) cases, `valid` round(f_valid * n), each at least 1 when its fraction is not 0,
and `train` the rest. All slices of a case go with it, so no patient is ever in two splits. A
site needs at least one case per non-empty split (3 for 7:1:2); fewer is an error naming the site.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Sequence

import numpy as np

from prrfl.data.derm.splitting import check_fractions

from .layout import SPLITS


def _round(x: float) -> int:
    return int(math.floor(x + 0.5))


def site_seed(seed: int, site_name: str) -> int:
    """The split seed of one site: independent of the other sites prepared alongside it."""
    return int(np.random.SeedSequence([int(seed) & 0xFFFFFFFF, zlib.crc32(site_name.encode())]).generate_state(1)[0])


def patient_split(case_ids: Sequence[str], fractions: Sequence[float], seed: int, site_name: str) -> dict[str, list[str]]:
    """Case ids per split (each list sorted), a partition of `case_ids` (see the module rule)."""
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
    while n - counts["test"] - counts["valid"] < 1:  # train keeps at least one case
        bigger = max(("test", "valid"), key=lambda s: counts[s])
        counts[bigger] -= 1
    order = np.random.default_rng(site_seed(seed, site_name)).permutation(n)
    shuffled = [ids[i] for i in order]
    out = {"test": shuffled[: counts["test"]], "valid": shuffled[counts["test"] : counts["test"] + counts["valid"]]}
    out["train"] = shuffled[counts["test"] + counts["valid"] :]
    return {s: sorted(out[s]) for s in SPLITS}
