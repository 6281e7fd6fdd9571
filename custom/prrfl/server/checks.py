"""Server-side checks of a site's upload before it may influence anyone else's model, for prrfl's jobs and
the FLARE components alike (no FLARE import).

A malformed or poisoned upload (wrong keys or shapes, NaN/Inf, bad counts or prototypes) is
rejected for the round with a reason; the others are aggregated as usual. So is an upload whose
update (its difference to what the site was sent) is far larger than the round's others
(`norm_outliers`): finite but huge weights would otherwise dominate every site's average.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import torch

from prrfl.keys import PROTOTYPE_PRESENT, PROTOTYPES
from prrfl.messages import Upload

if TYPE_CHECKING:
    from prrfl.tasks.base import Task


def params_problem(params: Mapping[str, Any], reference: Mapping[str, torch.Tensor], subset: bool = False) -> str | None:
    """None when `params` are tensors of the `reference`'s keys and shapes, all finite; else a one-line reason.
    subset: the params may carry only some of the reference's keys (a FLARE client that keeps some at home)."""
    keys, expected = set(params), set(reference)
    missing, extra = sorted(expected - keys), sorted(keys - expected)
    if extra or (missing and not subset):
        return f"parameter keys differ from the model's (missing {missing[:5]}, unexpected {extra[:5]})"
    for key in sorted(keys, key=list(reference).index):
        value, ref = params[key], reference[key]
        if not isinstance(value, torch.Tensor):
            return f"parameter {key} is a {type(value).__name__}, expected a tensor"
        if tuple(value.shape) != tuple(ref.shape):
            return f"parameter {key} has shape {tuple(value.shape)}, expected {tuple(ref.shape)}"
        if value.is_floating_point() and not torch.isfinite(value).all():
            return f"parameter {key} holds NaN or Inf"
    return None


def upload_problem(upload: Upload, reference: dict[str, torch.Tensor], task: Task) -> str | None:
    """None when the upload is usable, else a one-line reason."""
    problem = params_problem(upload.params, reference)
    problem = problem or task.stats_problem(upload.num_train, upload.class_counts)  # the task knows what its counts count
    return problem or prototype_problem(upload.meta, task.num_classes)


def prototype_problem(meta: Mapping[str, Any], num_classes: int | None = None) -> str | None:
    """None when the meta carries no prototypes or well-formed ones (one finite row per class, rows of one
    length, a presence flag per class; `num_classes` None: as many as the rows), else a one-line reason."""
    if PROTOTYPES not in meta:
        return None
    protos = meta[PROTOTYPES]
    present = meta.get(PROTOTYPE_PRESENT)
    if num_classes is None and isinstance(protos, list):
        num_classes = len(protos)
    if not isinstance(protos, list) or len(protos) != num_classes:
        return f"prototypes must have one row per class ({num_classes})"
    if present is None or len(present) != num_classes:
        return f"prototype_present must have {num_classes} entries"
    width = {len(row) for row in protos}
    if len(width) != 1:
        return "prototype rows have different lengths"
    if any(not math.isfinite(v) for row in protos for v in row):
        return "prototypes hold NaN or Inf"
    return None


NORM_HISTORY = 5  # a site's own rule compares with the median of its last this many accepted update norms


def update_norm(difference: dict[str, torch.Tensor]) -> float:
    """The L2 norm of an upload's difference to what the site was sent, over its floating-point
    entries (weights and BatchNorm statistics; counters left out)."""
    return math.sqrt(sum(float(v.double().square().sum()) for v in difference.values() if v.is_floating_point()))


def norm_outliers(
    norms: dict[str, float],
    ratio: float | None,
    history: dict[str, list[float]] | None = None,
    max_norm: float | None = None,
) -> dict[str, str]:
    """The sites whose update norm is implausibly large, each with the reason; an upload is rejected when

    * its norm exceeds `max_norm` (update_norm_max, an absolute bound; None: off), or, with `ratio`
      (update_norm_ratio; None: both relative rules off),
    * the round's rule: with 2 uploads or more, its norm exceeds `ratio` x the round's lower median. The
      lower median of 2 is the smaller one, so with 2 sites the larger is rejected when it is more than
      `ratio` x the other: the larger update is the one that would dominate the average (a scaled-down
      upload harms nobody), so that is the one to refuse; with 4 sites, two huge uploads are still
      measured against an honest one;
    * the site's own rule, any number of uploads: its norm exceeds `ratio` x the median of its own last
      NORM_HISTORY accepted norms (`history`), so a site that turns hostile after honest rounds is caught
      even when it is the only upload or one of two.
    A median of 0 (uploads without weights, e.g. prototypes only) gives no relative rule."""
    problems: dict[str, str] = {}
    for site, norm in norms.items():
        if max_norm is not None and norm > max_norm:
            problems[site] = f"its update norm {norm:.3g} exceeds update_norm_max={max_norm:g}"
    if ratio is None:
        return problems
    if len(norms) >= 2:
        median = statistics.median_low(norms.values())
        for site, norm in norms.items():
            if median > 0 and norm > ratio * median and site not in problems:
                problems[site] = (
                    f"its update norm {norm:.3g} is {norm / median:.3g} x the round's median {median:.3g} (limit: update_norm_ratio={ratio:g})"
                )
    for site, norm in norms.items():
        own = (history or {}).get(site, [])[-NORM_HISTORY:]
        median = statistics.median_low(own) if own else 0.0
        if median > 0 and norm > ratio * median and site not in problems:
            problems[site] = (
                f"its update norm {norm:.3g} is {norm / median:.3g} x the median {median:.3g} of its own last {len(own)} "
                f"accepted update(s) (limit: update_norm_ratio={ratio:g})"
            )
    return problems
