"""Stratified train/valid/test assignment of one site's images, optionally keeping lesions together.

Rule (per class, so every split keeps the site's class mix): the class's images are grouped into
units (a lesion's images when grouping by lesion, else single images), shuffled with the seed,
and units fill `test` until it holds max(M, round(f_test * n)) images, then `valid` likewise, and
the rest goes to `train`; M = `heldout_min_per_class`, 1 unless asked for (then the fractions alone
decide). A held-out split takes a unit only while the later splits and train can still get one
unit each, so `train` always keeps at least one unit of the class, and when units run short of M,
`test` is filled first. With single-image units and n >= 2M + 1 images, valid and test each hold
exactly max(M, round(f * n)) images of the class. Only splits with a non-zero fraction are filled.
A class with fewer units than such splits (3 for 7:1:2) goes entirely into train, with a warning
(a test set with 1 image of a class measures nothing, a train set without it cannot learn it).
Counts are exact at image level; with lesion grouping a split gets whole lesions until it holds at
least its target. This is scikit-learn's StratifiedShuffleSplit / StratifiedGroupKFold idea,
written out because those need >= 2 members per class and round differently per split.

M: with M images of a class in a held-out split, one image moves that class's recall by at most
1/M, so the macro F1 over the 3 classes by about 1/(3M): HELDOUT_MIN_PER_CLASS = 8 keeps one image
under ~4 points, and is the largest M at which the synthetic federation at full size is still
Table I (site B has 24 = 3 x 8 melanomas; plan.table_counts). The embedded synthetic federation
enforces it; real data keeps the fractions and is only warned about (prepare.py).
"""

from __future__ import annotations

import logging
import math
from collections import defaultdict
from collections.abc import Sequence

import numpy as np

from .layout import CLASS_NAMES, SPLITS

log = logging.getLogger(__name__)

HELDOUT_MIN_PER_CLASS = 8  # M: images of each class in valid and in test (see the module docstring)


def _round(x: float) -> int:
    return int(math.floor(x + 0.5))


def check_fractions(fractions: Sequence[float]) -> tuple[float, float, float]:
    if len(fractions) != 3 or any(f < 0 for f in fractions) or not math.isclose(sum(fractions), 1.0, abs_tol=1e-6) or fractions[0] <= 0:
        raise ValueError(f"split fractions must be 3 non-negative numbers (train > 0) summing to 1, got {tuple(fractions)}")
    return tuple(float(f) for f in fractions)  # type: ignore[return-value]


def check_heldout_min(value: object) -> int:
    """M as given, or a ValueError naming the field heldout_min_per_class (M must be an integer >= 1)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"heldout_min_per_class must be an integer >= 1, got {value!r}")
    return value


def units_by_class(labels: Sequence[int], groups: Sequence[str], context: str) -> dict[int, dict[str, list[int]]]:
    """class -> lesion -> the indices of its images, in order; a lesion with images of two classes is refused."""
    units: dict[int, dict[str, list[int]]] = defaultdict(dict)
    group_label: dict[str, int] = {}
    for i, (y, g) in enumerate(zip(labels, groups, strict=True)):
        if group_label.setdefault(g, y) != y:
            both = f"{CLASS_NAMES[group_label[g]]}, {CLASS_NAMES[y]}"
            raise ValueError(f"{context}: lesion {g} has images of different classes ({both})")
        units[y].setdefault(g, []).append(i)
    return units


def stratified_assignment(
    labels: Sequence[int],
    fractions: Sequence[float],
    seed: int,
    groups: Sequence[str] | None = None,
    context: str = "",
    heldout_min_per_class: int = 1,
) -> tuple[list[str], list[str]]:
    """Split name per image, and the warnings raised (also logged). `groups[i]` = lesion of image i;
    `heldout_min_per_class` = M of the rule (module docstring)."""
    fr = dict(zip(SPLITS, check_fractions(fractions), strict=True))
    floor = check_heldout_min(heldout_min_per_class)
    rng = np.random.default_rng(seed)
    units = units_by_class(labels, [str(i) for i in range(len(labels))] if groups is None else groups, context)
    out = [""] * len(labels)
    warnings: list[str] = []
    held_out = [s for s in ("test", "valid") if fr[s] > 0]
    for y in sorted(units):
        members = list(units[y].values())
        order = rng.permutation(len(members))
        members = [members[i] for i in order]
        n = sum(len(m) for m in members)
        if len(members) < len(held_out) + 1:
            msg = f"{context}: class {CLASS_NAMES[y]} has only {n} image(s) in {len(members)} unit(s): all put into train"
            log.warning(msg)
            warnings.append(msg)
            for m in members:
                for i in m:
                    out[i] = "train"
            continue
        pos = 0
        for k, s in enumerate(held_out):
            target = max(floor, _round(fr[s] * n))
            reserve = len(held_out) - k  # units still needed by the later splits and by train
            taken = 0
            while pos < len(members) - reserve and (taken == 0 or taken < target):
                for i in members[pos]:
                    out[i] = s
                taken += len(members[pos])
                pos += 1
        for m in members[pos:]:
            for i in m:
                out[i] = "train"
    return out, warnings
