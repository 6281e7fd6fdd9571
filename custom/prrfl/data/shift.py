"""Scaling how much the synthetic sites differ: one setting of a site moved away from (or towards) the federation's
average of it by a factor `shift` (the task's `data.synthetic_shift`; prrfl.tasks.derm.acquisition.shifted and
prrfl.tasks.prostate.scanner.shifted apply it to every acquisition setting of a site profile)."""

from __future__ import annotations

import math
from collections.abc import Sequence


def check_shift(shift: float) -> None:
    if not (shift >= 0 and math.isfinite(shift)):
        raise ValueError(f"shift must be a finite number >= 0, got {shift}")


def geometric(shift: float, value: float, values: Sequence[float]) -> float:
    """A multiplicative setting on the log scale: ref * (value / ref) ** shift, ref the geometric mean of `values`."""
    ref = math.exp(sum(math.log(v) for v in values) / len(values))
    return ref * (value / ref) ** shift


def arithmetic(shift: float, value: float, values: Sequence[float], lo: float, hi: float) -> float:
    """An additive setting: ref + shift * (value - ref), ref the mean of `values`, clipped to [lo, hi]."""
    ref = sum(values) / len(values)
    return min(hi, max(lo, ref + shift * (value - ref)))
