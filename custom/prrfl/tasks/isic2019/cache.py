"""The embedded default: the synthetic Fed-ISIC2019, generated and prepared once per parameter set into the cache
(prrfl.data.publish.cached_federation), shared by every site of the machine."""

from __future__ import annotations

import logging
from pathlib import Path

from prrfl.data.publish import cached_federation, federation_key

from .layout import MANIFEST_NAME, SYNTHETIC_MARKER
from .prepare import FORMAT, prepare_isic2019
from .synthetic import GENERATOR_VERSION, generate_synthetic_isic2019


def ensure_synthetic_isic2019(
    cache_root: str | Path, *, scale: float, seed: int, shift: float, size: int, split_seed: int, valid_fraction: float, workers: int = 1
) -> Path:
    """The prepared root of the synthetic federation with these parameters, built on first use (cheap when present).
    `workers` stays 1 inside FLARE site processes; the CLI (`python -m prrfl.tasks.isic2019 synth --workers N`)
    builds a full-size copy faster."""
    params = {
        "scale": float(scale),
        "seed": int(seed),
        "shift": float(shift),
        "size": int(size),
        "split_seed": int(split_seed),
        "valid_fraction": float(valid_fraction),
    }
    key = federation_key(params, generator=GENERATOR_VERSION, prepared_format=FORMAT)
    return cached_federation(
        cache_root,
        f"isic2019-synth-{key}",
        params,
        generate=lambda raw: generate_synthetic_isic2019(raw, scale=scale, seed=seed, shift=shift, workers=workers, overwrite=True),
        prepare=lambda raw, out: prepare_isic2019(raw, out, size=int(size), seed=int(split_seed), valid_fraction=float(valid_fraction)),
        marker=SYNTHETIC_MARKER,
        manifest=MANIFEST_NAME,
        log=logging.getLogger(__name__),
        what="synthetic Fed-ISIC2019",
    )
