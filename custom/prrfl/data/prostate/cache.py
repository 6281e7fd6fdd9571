"""The embedded default prostate data: a synthetic federation generated and prepared once per machine.

Same protocol as the dermoscopy cache (prrfl.data.derm.cache, whose file lock it uses): several
site processes may ask at once, the first builds under an exclusive lock on a per-key lock file,
the others wait and find the finished folder; the prepared folder is published by rename, so an
existing `prepared/manifest.json` means complete. The key hashes every parameter with the
generator and prepared-format versions.
"""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
from collections.abc import Sequence
from pathlib import Path

from prrfl.data.derm.cache import file_lock
from prrfl.storage import publish_dir, temp_dir_beside
from .layout import MANIFEST_NAME, SYNTHETIC_MARKER, TABLE_SITES
from .prepare import FORMAT, prepare_prostate
from .synthetic import GENERATOR_VERSION, generate_synthetic_prostate

log = logging.getLogger(__name__)

DEFAULT_MATRIX_SCALE = 1 / 3  # 384-512 px sites -> 128-171 px: a default federation builds in seconds


def federation_key(**params: object) -> str:
    """Short hash naming a cached federation; includes the generator and prepared-format versions."""
    blob = json.dumps({**params, "generator": GENERATOR_VERSION, "format": FORMAT}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def ensure_synthetic_prostate(
    cache_root: str | Path,
    *,
    scale: float = 0.25,
    seed: int = 0,
    size: int = 128,
    split_seed: int = 0,
    split: Sequence[float] = (0.7, 0.1, 0.2),
    matrix_scale: float = DEFAULT_MATRIX_SCALE,
    max_matrix: int | None = None,
    sites: Sequence[str] = TABLE_SITES,
) -> Path:
    """The prepared root of the synthetic prostate federation with these parameters, built on first use.

    Cheap when present (one stat of the manifest). Layout: <cache_root>/prostate-synth-<key>/
    {raw, prepared, params.json}.
    """
    params = {
        "scale": float(scale),
        "seed": int(seed),
        "size": int(size),
        "split_seed": int(split_seed),
        "split": [float(f) for f in split],
        "matrix_scale": float(matrix_scale),
        "max_matrix": None if max_matrix is None else int(max_matrix),
        "sites": list(sites),
    }
    key = federation_key(**params)
    root = Path(cache_root) / f"prostate-synth-{key}"
    prepared = root / "prepared"
    if (prepared / MANIFEST_NAME).is_file():
        return prepared
    with file_lock(Path(cache_root) / f"prostate-synth-{key}.lock"):
        if (prepared / MANIFEST_NAME).is_file():
            log.info("synthetic prostate federation built by another process: %s", prepared)
            return prepared
        root.mkdir(parents=True, exist_ok=True)
        for stale in root.glob(".*.tmp-*"):  # left by a killed builder
            shutil.rmtree(stale, ignore_errors=True)
        raw = root / "raw"
        if not (raw / SYNTHETIC_MARKER).is_file():
            generate_synthetic_prostate(
                raw,
                scale=scale,
                seed=seed,
                sites=params["sites"],
                matrix_scale=matrix_scale,
                max_matrix=max_matrix,
                overwrite=True,
            )
        tmp = temp_dir_beside(prepared)
        try:
            prepare_prostate(raw, tmp, size=int(size), seed=int(split_seed), split=split, sites=params["sites"])
            publish_dir(tmp, prepared, overwrite=True)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        (root / "params.json").write_text(json.dumps(params, indent=2) + "\n")
        log.info("synthetic prostate federation ready: %s", prepared)
    return prepared
