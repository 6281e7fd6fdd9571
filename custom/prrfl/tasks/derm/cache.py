"""The embedded default data: a synthetic federation generated and prepared once per machine, then reused.

Several site processes start at once and all ask for the same data set, so generation runs under
an exclusive fcntl lock on a per-key lock file: the first caller builds, the others wait and then
find the finished folder. Folders are published by rename, so an existing `prepared/` is complete
(prrfl.data.publish.cached_federation). POSIX only (fcntl), like the FLARE simulator itself.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Literal

from prrfl.data.publish import cached_federation, federation_key

from .layout import MANIFEST_NAME, SYNTHETIC_MARKER
from .plan import GENERATOR_VERSION
from .prepare import FORMAT, prepare_dermoscopy
from .splitting import HELDOUT_MIN_PER_CLASS
from .synthetic import generate_synthetic

log = logging.getLogger(__name__)


def ensure_synthetic_federation(
    cache_root: str | Path,
    *,
    scale: float,
    seed: int,
    raw_size: Sequence[int] = (300, 225),
    shift: float = 1.0,
    size: int = 64,
    split_seed: int = 0,
    group_by: Literal["image", "lesion"] = "image",
    split: Sequence[float] = (0.7, 0.1, 0.2),
    heldout_min_per_class: int = HELDOUT_MIN_PER_CLASS,
    workers: int = 1,
) -> Path:
    """The prepared root of the synthetic federation with these parameters, built on first use.

    Cheap when present (one stat of the manifest). `workers` stays 1 by default: this runs inside
    host programs (FLARE site processes), where spawned workers would re-import the host's main
    script and forked ones would inherit its threads; the quick default builds in seconds serially.
    For full-size data, run the CLI (`python -m prrfl.tasks.derm synth/prepare --workers N`) instead.
    Every class of every site gets at least `heldout_min_per_class` images in valid and in test
    (and in train): the plan's per-class floor, enforced by the split (splitting.py).
    """
    params = {
        "scale": float(scale),
        "seed": int(seed),
        "raw_size": [int(v) for v in raw_size],
        "size": int(size),
        "split_seed": int(split_seed),
        "group_by": group_by,
        "split": [float(f) for f in split],
        "heldout_min_per_class": int(heldout_min_per_class),
        **({} if shift == 1 else {"shift": float(shift)}),  # the key of a federation built before shifts existed stays
    }
    key = federation_key(params, generator=GENERATOR_VERSION, prepared_format=FORMAT)
    return cached_federation(
        cache_root,
        f"derm-synth-{key}",
        params,
        generate=lambda raw: generate_synthetic(
            raw,
            scale=scale,
            seed=seed,
            image_size=tuple(params["raw_size"]),
            heldout_min_per_class=heldout_min_per_class,
            workers=workers,
            overwrite=True,
            shift=float(shift),
        ),
        prepare=lambda raw, out: prepare_dermoscopy(
            raw,
            out,
            size=int(size),
            seed=int(split_seed),
            split=split,
            group_by=group_by,
            heldout_min_per_class=heldout_min_per_class,
            enforce_heldout_min=True,
            workers=workers,
        ),
        marker=SYNTHETIC_MARKER,
        manifest=MANIFEST_NAME,
        log=log,
        what="synthetic federation",
    )
