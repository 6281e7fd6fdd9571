"""The embedded default data: a synthetic federation generated and prepared once per machine, then reused.

Several site processes start at once and all ask for the same data set, so generation runs under
an exclusive fcntl lock on a per-key lock file: the first caller builds, the others wait and then
find the finished folder. Folders are published by rename, so an existing `prepared/` is complete.
POSIX only (fcntl), like the FLARE simulator itself.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import shutil
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Literal

from prrfl.storage import publish_dir, temp_dir_beside
from .layout import MANIFEST_NAME, SYNTHETIC_MARKER
from .plan import GENERATOR_VERSION
from .prepare import FORMAT, prepare_dermoscopy
from .synthetic import generate_synthetic

log = logging.getLogger(__name__)


@contextmanager
def file_lock(path: Path) -> Iterator[None]:
    """Exclusive inter-process lock held while the block runs (released by the OS if the process dies)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as f:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)


def federation_key(**params: object) -> str:
    """Short hash naming a cached federation; includes the generator and prepared-format versions."""
    blob = json.dumps({**params, "generator": GENERATOR_VERSION, "format": FORMAT}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def ensure_synthetic_federation(
    cache_root: str | Path,
    *,
    scale: float,
    seed: int,
    raw_size: Sequence[int] = (300, 225),
    size: int = 64,
    split_seed: int = 0,
    group_by: Literal["image", "lesion"] = "image",
    split: Sequence[float] = (0.7, 0.1, 0.2),
    workers: int = 1,
) -> Path:
    """The prepared root of the synthetic federation with these parameters, built on first use.

    Cheap when present (one stat of the manifest). `workers` stays 1 by default: this runs inside
    host programs (FLARE site processes), where spawned workers would re-import the host's main
    script and forked ones would inherit its threads; the quick default builds in seconds serially.
    For full-size data, run the CLI (`python -m prrfl.data.derm synth/prepare --workers N`) instead.
    """
    params = {
        "scale": float(scale),
        "seed": int(seed),
        "raw_size": [int(v) for v in raw_size],
        "size": int(size),
        "split_seed": int(split_seed),
        "group_by": group_by,
        "split": [float(f) for f in split],
    }
    root = Path(cache_root) / f"derm-synth-{federation_key(**params)}"
    prepared = root / "prepared"
    if (prepared / MANIFEST_NAME).is_file():
        return prepared
    with file_lock(Path(cache_root) / f"derm-synth-{federation_key(**params)}.lock"):
        if (prepared / MANIFEST_NAME).is_file():
            log.info("synthetic federation built by another process: %s", prepared)
            return prepared
        root.mkdir(parents=True, exist_ok=True)
        for stale in root.glob(".*.tmp-*"):  # left by a killed builder
            shutil.rmtree(stale, ignore_errors=True)
        raw = root / "raw"
        if not (raw / SYNTHETIC_MARKER).is_file():
            generate_synthetic(
                raw, scale=scale, seed=seed, image_size=tuple(params["raw_size"]), workers=workers, overwrite=True
            )
        tmp = temp_dir_beside(prepared)
        try:
            prepare_dermoscopy(
                raw, tmp, size=int(size), seed=int(split_seed), split=split, group_by=group_by, workers=workers
            )
            publish_dir(tmp, prepared, overwrite=True)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        (root / "params.json").write_text(json.dumps(params, indent=2) + "\n")
        log.info("synthetic federation ready: %s", prepared)
    return prepared
