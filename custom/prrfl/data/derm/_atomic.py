"""Atomic writes (temp file or folder beside the target, then os.replace / rename).

A killed process leaves either the old content or the new one, never a half-written file that
looks complete. Torch-free so that image worker processes stay light.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO


def atomic_write(path: Path, write: Callable[[BinaryIO], object]) -> Path:
    """Write `path` through `write(fileobj)` into a temp file in the same folder, then replace."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)  # mkstemp creates 0600; prepared data is meant to be shared
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def atomic_write_bytes(path: Path, data: bytes) -> Path:
    return atomic_write(path, lambda f: f.write(data))


def temp_dir_beside(target: Path) -> Path:
    """A fresh hidden folder next to `target` (same file system, so a rename is atomic)."""
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.parent / f".{target.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    return tmp


def publish_dir(tmp: Path, target: Path, *, overwrite: bool) -> Path:
    """Move the finished folder `tmp` to `target`; an existing target is replaced only if `overwrite`."""
    target = Path(target)
    if target.exists():
        if not overwrite:
            shutil.rmtree(tmp, ignore_errors=True)
            raise FileExistsError(f"{target} already exists (pass overwrite=True to replace it)")
        trash = target.parent / f".{target.name}.old-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        os.rename(target, trash)
        os.rename(tmp, target)
        shutil.rmtree(trash, ignore_errors=True)
    else:
        os.rename(tmp, target)
    return target
