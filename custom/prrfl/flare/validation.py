"""Server-side checks of a site's upload before it may influence anyone else's model.

A malformed or poisoned upload (wrong keys or shapes, NaN/Inf, bad counts or prototypes) is
rejected for the round with a reason; the others are aggregated as usual. So is an upload whose
update (its difference to what the site was sent) is far larger than the round's others
(`norm_outliers`): finite but huge weights would otherwise dominate every site's average.
"""

from __future__ import annotations

import math
import statistics
from typing import TYPE_CHECKING, Any

import torch

from prrfl.messages import Upload

if TYPE_CHECKING:
    from prrfl.tasks.base import Task


def upload_problem(upload: Upload, reference: dict[str, torch.Tensor], task: Task) -> str | None:
    """None when the upload is usable, else a one-line reason."""
    keys, expected = set(upload.params), set(reference)
    if keys != expected:
        missing, extra = sorted(expected - keys), sorted(keys - expected)
        return f"parameter keys differ from the model's (missing {missing[:5]}, unexpected {extra[:5]})"
    for key, ref in reference.items():
        value = upload.params[key]
        if not isinstance(value, torch.Tensor):
            return f"parameter {key} is a {type(value).__name__}, expected a tensor"
        if tuple(value.shape) != tuple(ref.shape):
            return f"parameter {key} has shape {tuple(value.shape)}, expected {tuple(ref.shape)}"
        if value.is_floating_point() and not torch.isfinite(value).all():
            return f"parameter {key} holds NaN or Inf"
    problem = task.stats_problem(upload.num_train, upload.class_counts)  # the task knows what its counts count
    return problem or _prototype_problem(upload.meta, task.num_classes)


def _prototype_problem(meta: dict[str, Any], num_classes: int) -> str | None:
    if "prototypes" not in meta:
        return None
    protos = meta["prototypes"]
    present = meta.get("prototype_present")
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


NORM_RULE_MIN_UPLOADS = 3  # with one or two uploads there is no majority to compare a site with


def update_norm(difference: dict[str, torch.Tensor]) -> float:
    """The L2 norm of an upload's difference to what the site was sent, over its floating-point
    entries (weights and BatchNorm statistics; counters left out)."""
    return math.sqrt(sum(float(v.double().square().sum()) for v in difference.values() if v.is_floating_point()))


def norm_outliers(norms: dict[str, float], ratio: float | None) -> dict[str, str]:
    """The sites whose update norm exceeds `ratio` times the round's median, each with a reason; none
    when the rule is off (`ratio` None), with fewer than NORM_RULE_MIN_UPLOADS uploads, or when the
    median is 0 (uploads without weights, e.g. prototypes only). The median is the lower one, so
    with 4 sites two huge uploads are still measured against an honest one."""
    if ratio is None or len(norms) < NORM_RULE_MIN_UPLOADS:
        return {}
    median = statistics.median_low(norms.values())
    if median <= 0:
        return {}
    return {
        site: f"its update norm {norm:.3g} is {norm / median:.3g} x the round's median {median:.3g} (limit: update_norm_ratio={ratio:g})"
        for site, norm in norms.items()
        if norm > ratio * median
    }
