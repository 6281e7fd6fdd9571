"""Building a data folder whole or not at all, and a cached synthetic federation built once per machine.

`build_dir` writes a folder into a hidden temporary folder beside its target and publishes it by
rename, so that an existing folder is complete. `cached_federation` is the embedded default data
of a task: several site processes start at once and all ask for the same data set, so generation
runs under an exclusive fcntl lock on a per-key lock file: the first caller builds, the others
wait and then find the finished folder (`prepared/` holds its manifest only when complete). POSIX
only (fcntl), like the FLARE simulator itself.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import multiprocessing as mp
import os
import shutil
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

from threadpoolctl import threadpool_limits

from prrfl.storage import publish_dir, temp_dir_beside

T = TypeVar("T")


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


def _single_thread_blas() -> None:
    """The renderers' small matrix products are slower with BLAS threads waking up (2x measured)."""
    threadpool_limits(1, user_api="blas")


def map_in_workers(fn: Callable[[T], object], items: Sequence[T], workers: int, min_per_worker: int = 100) -> None:
    """fn on every item (a synthetic generator writing its files): here, BLAS on one thread, or in `workers` spawned
    processes once there are `min_per_worker` items per worker (below that, starting the pool costs more than it
    saves). Spawned, not forked: safe when the caller has threads (FLARE site processes); `fn` must be importable
    from a module that does not import torch."""
    if workers <= 1 or len(items) < min_per_worker * workers:
        with threadpool_limits(1, user_api="blas"):
            for item in items:
                fn(item)
        return
    with mp.get_context("spawn").Pool(workers, initializer=_single_thread_blas) as pool:
        for _ in pool.imap_unordered(fn, items, chunksize=max(1, min(32, len(items) // (8 * workers)))):
            pass


def default_cache_dir() -> Path:
    """Where the embedded synthetic federations are built and kept: $PRRFL_CACHE, else ~/.cache/prrfl."""
    return Path(os.environ.get("PRRFL_CACHE", Path.home() / ".cache" / "prrfl"))


def build_dir(target: str | Path, write: Callable[[Path], T], *, overwrite: bool) -> T:
    """Run `write(tmp)` on a fresh temporary folder beside `target`, then rename it to `target`.

    Returns what `write` returned. On any error (or interruption) the temporary folder is removed
    and `target` is left as it was; an existing `target` is replaced only if `overwrite`.
    """
    tmp = temp_dir_beside(target)
    try:
        result = write(tmp)
        publish_dir(tmp, target, overwrite=overwrite)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return result


def federation_key(params: dict[str, Any], *, generator: str, prepared_format: str) -> str:
    """Short hash naming a cached federation; includes the generator and prepared-format versions."""
    blob = json.dumps({**params, "generator": generator, "format": prepared_format}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def cached_federation(
    cache_root: str | Path,
    name: str,
    params: dict[str, Any],
    *,
    generate: Callable[[Path], object],
    prepare: Callable[[Path, Path], object],
    marker: str,
    manifest: str,
    log: logging.Logger,
    what: str,
) -> Path:
    """The prepared root <cache_root>/<name>/prepared, built on first use; cheap when present.

    `name` is unique to the parameters (see federation_key). Layout: <cache_root>/<name>/{raw,
    prepared, params.json}, with the lock file <cache_root>/<name>.lock. `generate(raw)` writes
    the raw layout (replacing an unfinished one), unless `raw/<marker>` says it is complete;
    `prepare(raw, out)` writes the prepared folder into `out`, published as `prepared/` by rename.
    `what` names the data set in the `log` messages.
    """
    root = Path(cache_root) / name
    prepared = root / "prepared"
    if (prepared / manifest).is_file():
        return prepared
    with file_lock(Path(cache_root) / f"{name}.lock"):
        if (prepared / manifest).is_file():
            log.info("%s built by another process: %s", what, prepared)
            return prepared
        root.mkdir(parents=True, exist_ok=True)
        for stale in root.glob(".*.tmp-*"):  # left by a killed builder
            shutil.rmtree(stale, ignore_errors=True)
        raw = root / "raw"
        if not (raw / marker).is_file():
            generate(raw)
        build_dir(prepared, lambda tmp: prepare(raw, tmp), overwrite=True)
        (root / "params.json").write_text(json.dumps(params, indent=2) + "\n")
        log.info("%s ready: %s", what, prepared)
    return prepared
