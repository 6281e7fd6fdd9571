"""The embedded default prostate data: a synthetic federation generated and prepared once per machine.

Same protocol as the dermoscopy cache (prrfl.data.publish.cached_federation): several site
processes may ask at once, the first builds under an exclusive lock on a per-key lock file, the
others wait and find the finished folder; the prepared folder is published by rename, so an
existing `prepared/manifest.json` means complete. The key hashes every parameter with the
generator and prepared-format versions.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

from prrfl.data.publish import cached_federation, federation_key

from .layout import MANIFEST_NAME, SYNTHETIC_MARKER, TABLE_SITES
from .prepare import FORMAT, prepare_prostate
from .splitting import MIN_VALID_CASES
from .synthetic import GENERATOR_VERSION, generate_synthetic_prostate

log = logging.getLogger(__name__)

DEFAULT_MATRIX_SCALE = 1 / 3  # 384-512 px sites -> 128-171 px: a default federation builds in seconds


def ensure_synthetic_prostate(
    cache_root: str | Path,
    *,
    scale: float = 0.25,
    seed: int = 0,
    size: int = 128,
    split_seed: int = 0,
    split: Sequence[float] = (0.7, 0.1, 0.2),
    min_valid_cases: int = MIN_VALID_CASES,
    matrix_scale: float = DEFAULT_MATRIX_SCALE,
    max_matrix: int | None = None,
    sites: Sequence[str] = TABLE_SITES,
    workers: int = 1,
    shift: float = 1.0,
) -> Path:
    """The prepared root of the synthetic prostate federation with these parameters, built on first use.

    Cheap when present (one stat of the manifest). Layout: <cache_root>/prostate-synth-<key>/
    {raw, prepared, params.json}. `workers` (volumes generated in parallel) stays 1 inside host
    programs such as FLARE site processes; the CLI (`prrfl data build <job> --workers N`) may use more.
    """
    params = {
        "scale": float(scale),
        "seed": int(seed),
        "size": int(size),
        "split_seed": int(split_seed),
        "split": [float(f) for f in split],
        "min_valid_cases": int(min_valid_cases),
        "matrix_scale": float(matrix_scale),
        "max_matrix": None if max_matrix is None else int(max_matrix),
        "sites": list(sites),
        **({} if shift == 1 else {"shift": float(shift)}),  # the key of a federation built before shifts existed stays
    }
    key = federation_key(params, generator=GENERATOR_VERSION, prepared_format=FORMAT)
    return cached_federation(
        cache_root,
        f"prostate-synth-{key}",
        params,
        generate=lambda raw: generate_synthetic_prostate(
            raw,
            scale=scale,
            seed=seed,
            sites=params["sites"],
            matrix_scale=matrix_scale,
            max_matrix=max_matrix,
            overwrite=True,
            workers=workers,
            shift=float(shift),
        ),
        prepare=lambda raw, out: prepare_prostate(
            raw, out, size=int(size), seed=int(split_seed), split=split, sites=params["sites"], min_valid_cases=int(min_valid_cases)
        ),
        marker=SYNTHETIC_MARKER,
        manifest=MANIFEST_NAME,
        log=log,
        what="synthetic prostate federation",
    )
