"""Server-side checks of a site's upload before it may influence anyone else's model, for prrfl's jobs and
the FLARE components alike (no FLARE import).

A malformed or poisoned upload (wrong keys, shapes or dtypes, NaN/Inf, bad counts or prototypes, values
that are not numbers at all, and what its method checks of its own meta: `Method.upload_meta_problem`) is
rejected for the round with a reason; the others are aggregated as usual.
So is an upload that disagrees with the round's others on what every upload must share (its keys, the
width of its prototypes, the unit its weight is counted in: `round_value`), and one whose update (its
difference to what the site was sent) is far larger than the round's others (`norm_outliers`): finite but
huge weights would otherwise dominate every site's average. Every check returns its reason; none raises on
what a site sent.
"""

from __future__ import annotations

import json
import math
import statistics
import sys
from collections import Counter
from collections.abc import Callable, Hashable, Mapping
from typing import TYPE_CHECKING, Any, TypeVar

import torch

from prrfl.keys import CLASS_COUNTS, PROTOTYPE_PRESENT, PROTOTYPES
from prrfl.messages import Upload
from prrfl.tasks.contract import is_count

if TYPE_CHECKING:
    from prrfl.tasks.contract import Task

INTEGER_DTYPES = {torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.uint16, torch.uint32, torch.uint64}
V = TypeVar("V", bound=Hashable)


def value_kind(tensor: torch.Tensor) -> str:
    """What a tensor's values are: "floating-point", "integer", "bool", "complex" (or its dtype for another
    kind). An upload's entry must be of its model entry's kind: float weights cannot be stood for by
    integers, booleans or complex numbers (whose NaN the finite check would not see)."""
    dtype = tensor.dtype
    if dtype.is_complex:
        return "complex"
    if dtype.is_floating_point:
        return "floating-point"
    if dtype == torch.bool:
        return "bool"
    return "integer" if dtype in INTEGER_DTYPES else str(dtype)


def accepted_kinds(reference: torch.Tensor) -> tuple[str, ...]:
    """The kinds of values (`value_kind`) an upload's entry may have for this model entry: its own kind, and for
    an integer entry (a counter such as num_batches_tracked) floats too, as a privacy filter (FLARE's
    PercentilePrivacy) returns every difference as floats; the sum is cast back to the entry's dtype."""
    kind = value_kind(reference)
    return (kind, "floating-point") if kind == "integer" else (kind,)


def type_of(value: Any) -> str:
    """How a reason names what was sent: "a str", "an int"."""
    name = type(value).__name__
    return f"{'an' if name[0] in 'aeiou' else 'a'} {name}"


def is_number(value: Any) -> bool:
    """A real number as it travels in a meta (int or float, not a bool) that a float can hold."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    return isinstance(value, float) or abs(value) <= sys.float_info.max


def params_problem(params: Any, reference: Mapping[str, torch.Tensor], subset: bool = False) -> str | None:
    """None when `params` are dense tensors of the `reference`'s keys, shapes and kinds of values (`value_kind`),
    all finite; else a one-line reason. subset: the params may carry only some of the reference's keys (a FLARE
    client that keeps some at home)."""
    if not isinstance(params, Mapping):
        return f"its params are {type_of(params)}, expected a dict of tensors"
    keys, expected = set(params), set(reference)
    missing, extra = sorted(expected - keys, key=str), sorted(keys - expected, key=str)
    if extra or (missing and not subset):
        return f"parameter keys differ from the model's (missing {missing[:5]}, unexpected {extra[:5]})"
    for key in sorted(keys, key=list(reference).index):
        value, ref = params[key], reference[key]
        if not isinstance(value, torch.Tensor):
            return f"parameter {key} is {type_of(value)}, expected a tensor"
        if value.layout != torch.strided or value.is_meta:
            return f"parameter {key} is a {value.layout} tensor on {value.device.type}, expected a dense tensor holding its values"
        if tuple(value.shape) != tuple(ref.shape):
            return f"parameter {key} has shape {tuple(value.shape)}, expected {tuple(ref.shape)}"
        if value_kind(value) not in accepted_kinds(ref):
            return f"parameter {key} is {value.dtype}, expected {' or '.join(accepted_kinds(ref))} values as the model's {ref.dtype}"
        if value.is_floating_point() and not torch.isfinite(value).all():
            return f"parameter {key} holds NaN or Inf"
    return None


def upload_problem(upload: Upload, reference: dict[str, torch.Tensor], task: Task) -> str | None:
    """None when the upload is usable, else a one-line reason."""
    problem = params_problem(upload.params, reference)
    problem = problem or task.stats_problem(upload.num_train, upload.class_counts)  # the task knows what its counts count
    return problem or prototype_problem(upload.meta, task.num_classes)


def prototype_problem(meta: Any, num_classes: int | None = None) -> str | None:
    """None when the meta carries no prototypes or well-formed ones (one row of finite numbers per class, rows
    of one length, a presence flag (bool) per class; `num_classes` None: as many as the rows), else a one-line
    reason."""
    return class_rows_problem(meta, PROTOTYPES, PROTOTYPE_PRESENT, num_classes)


def class_rows_problem(meta: Any, rows_key: str, present_key: str, num_classes: int | None = None, width: int | None = None) -> str | None:
    """None when the meta carries nothing under `rows_key`, or one row of finite numbers per class (rows of one
    length; `width`: that length; each row's norm within float32's range) with a presence flag (bool) per class under
    `present_key`; `num_classes` None: as many as the rows. Else a one-line reason naming the key (class prototypes,
    CReFF's class gradients)."""
    if not isinstance(meta, Mapping):
        return f"its meta is {type_of(meta)}, expected a dict"
    if rows_key not in meta:
        return None
    rows = meta[rows_key]
    present = meta.get(present_key)
    row_name = present_key.removesuffix("_present")
    if not isinstance(rows, list):
        return f"{rows_key} must be a list of rows, one per class, got {type_of(rows)}"
    odd_row = next((row for row in rows if not isinstance(row, list)), None)
    if odd_row is not None:
        return f"{row_name} rows must be lists of numbers, got {type_of(odd_row)}"
    if num_classes is None:
        num_classes = len(rows)
    if len(rows) != num_classes:
        return f"{rows_key} must have one row per class ({num_classes})"
    if not isinstance(present, list) or len(present) != num_classes or not all(isinstance(p, bool) for p in present):
        return f"{present_key} must be a list of {num_classes} booleans"
    if len({len(row) for row in rows}) != 1 or not rows[0]:
        return f"{row_name} rows have different lengths (or none)"
    if width is not None and len(rows[0]) != width:
        return f"{row_name} rows must hold {width} numbers, got {len(rows[0])}"
    return row_values_problem(rows, rows_key)


def row_values_problem(rows: list[list[Any]], rows_key: str) -> str | None:
    """None when every value of the rows is a finite number and every row's norm is within float32's range (the
    server's distances and means over them would be Inf otherwise), else a one-line reason naming `rows_key`."""
    odd = next((v for row in rows for v in row if not is_number(v)), None)
    if odd is not None:
        return f"{rows_key} must be numbers, got {type_of(odd)} ({odd!r:.40})"
    if any(not math.isfinite(v) for row in rows for v in row):
        return f"{rows_key} hold NaN or Inf"
    largest = max(math.hypot(*row) for row in rows)  # hypot: no overflow of its own
    if largest > torch.finfo(torch.float32).max:
        return f"{rows_key} hold a row whose norm overflows float32 (largest {largest:.3g})"
    return None


def class_counts_problem(meta: Mapping[str, Any]) -> str | None:
    """None when the meta carries no class counts or a list of non-negative integers, else a one-line reason."""
    if CLASS_COUNTS not in meta:
        return None
    counts = meta[CLASS_COUNTS]
    if not isinstance(counts, list) or not counts or not all(is_count(c) for c in counts):
        return f"class_counts must be a list of non-negative integers, got {counts!r:.60}"
    return None


def round_value(values: Mapping[str, V], rank: Callable[[V], Any] = lambda value: 0) -> V | None:
    """What the round's uploads must agree on (their keys, their prototypes' width, the unit of their weight),
    as the most common of `values` (site -> its value); a tie goes to the highest `rank`, then to the value of
    the first site. The sites whose value differs are refused: with 3 sites or more one odd site cannot
    impose its value on the others; with 2 that disagree the tie's rule decides. None when `values` is empty."""
    counts = Counter(values.values())
    return max(counts, key=lambda value: (counts[value], rank(value)), default=None)


def summary_problem(summary: Any) -> str | None:
    """None when a site's round summary is what the server logs, tracks and saves: a dict of plain data (as
    JSON holds it) whose `best`, `last` and `trained` records, when set, are dicts with numbers as their valid and
    test metrics and an integer `epochs_done`, and whose `download_drop` is a number or None; else a one-line reason."""
    if not isinstance(summary, Mapping):
        return f"its round summary is {type_of(summary)}, expected a dict"
    try:
        json.dumps(summary, sort_keys=True, allow_nan=True)
    except (TypeError, ValueError, RecursionError) as e:
        return f"its round summary is not plain data ({str(e)[:80]})"
    for name in ("best", "last", "trained"):
        record = summary.get(name)
        if record is None:
            continue
        if not isinstance(record, Mapping):
            return f"summary[{name!r}] is {type_of(record)}, expected a dict"
        for split in ("valid", "test"):
            scores = record.get(split, {})
            if not isinstance(scores, Mapping) or not all(is_number(v) for v in scores.values()):
                return f"summary[{name!r}][{split!r}] must map metric names to numbers"
        if "epochs_done" in record and not is_count(record["epochs_done"]):
            return f"summary[{name!r}]['epochs_done'] must be a non-negative integer, got {record['epochs_done']!r:.40}"
    drop = summary.get("download_drop")
    if drop is not None and not is_number(drop):
        return f"summary['download_drop'] must be a number or null, got {drop!r:.40}"
    return None


def settings_problem(settings: Any) -> str | None:
    """None when a site's report of the settings it read (its answer to prepare, prrfl.flare.site_config.SettingsReport)
    is a dict whose `per_site_files` and `notes`, when set, are lists of strings, else a one-line reason."""
    if not isinstance(settings, Mapping):
        return f"its settings report is {type_of(settings)}, expected a dict"
    for name in ("per_site_files", "notes"):
        values = settings.get(name, [])
        if not isinstance(values, list) or not all(isinstance(v, str) for v in values):
            return f"its settings report's {name} must be a list of strings, got {values!r:.60}"
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
