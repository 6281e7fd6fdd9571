"""Atomic writes: a crash mid-write never leaves a truncated checkpoint, results file or data set.

Files go to a temp file beside the target, then os.replace; folders are built in a hidden folder
beside the target, then renamed. torch is imported only by the functions that need it, so image
worker processes stay light. A write that fails because the disk is full says so (`DiskFullError`, naming
the file and the space left), whatever library was writing (torch reports it as an internal assertion).

The JSON readers (load_json, existing_json, find_json) also read a kept run (prrfl.kept: `<run>.kept.json.gz`, one
finished run in one file) as the workspace it was: `<run>.kept.json.gz/site-1/prrfl/<run_name>/results.json` is that
site's results file.
"""

from __future__ import annotations

import errno
import functools
import gzip
import json
import os
import re
import shutil
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO

from prrfl import kept


class DiskFullError(OSError):
    """No space left on the device (or the quota) where a file was being written."""

    def __str__(self) -> str:
        return str(self.strerror)


NO_SPACE = (errno.ENOSPC, errno.EDQUOT)


def _disk_full(error: BaseException) -> bool:
    """Whether `error`, or an error it was raised from or during, is the disk being full."""
    seen = set()
    while error is not None and id(error) not in seen:
        if isinstance(error, OSError) and error.errno in NO_SPACE:
            return True
        seen.add(id(error))
        error = error.__cause__ or error.__context__
    return False


def disk_full_error(path: Path) -> DiskFullError:
    try:
        free = f"{shutil.disk_usage(path.parent).free / 2**20:.0f} MiB free there"
    except OSError:
        free = "free space unknown"
    return DiskFullError(errno.ENOSPC, f"no space left on device: cannot write {path} ({free}); free some space or move the folder")


def atomic_write(path: str | Path, write: Callable[[BinaryIO], object]) -> Path:
    """Write `path` through `write(fileobj)` into a temp file in the same folder, then replace."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)  # mkstemp creates 0600; results and prepared data are meant to be read
        os.replace(tmp, path)
    except BaseException as e:
        Path(tmp).unlink(missing_ok=True)
        if _disk_full(e) and not isinstance(e, DiskFullError):
            raise disk_full_error(path) from e
        raise
    return path


def atomic_write_bytes(path: str | Path, data: bytes) -> Path:
    return atomic_write(path, lambda f: f.write(data))


def temp_dir_beside(target: str | Path) -> Path:
    """A fresh hidden folder next to `target` (same file system, so a rename is atomic)."""
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.parent / f".{target.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    return tmp


def publish_dir(tmp: Path, target: str | Path, *, overwrite: bool) -> Path:
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


def set_aside(path: str | Path, why: str) -> Path:
    """Rename `path` to `<name>.<why>-<time>` beside it (an unreadable or superseded state file is kept
    for inspection, never deleted); returns the new path."""
    path = Path(path)
    kept = path.with_name(f"{path.name}.{why}-{time.strftime('%Y%m%d-%H%M%S')}")
    path.replace(kept)
    return kept


def save_torch(obj: Any, path: str | Path) -> Path:
    import torch

    return atomic_write(path, lambda f: torch.save(obj, f))


def save_torch_keeping_previous(obj: Any, path: str | Path, previous: str | Path) -> Path:
    """save_torch, after making the file there `previous` (a hard link, renamed into place; a copy where the
    file system has no hard links): the last two states are kept, the older one the fallback when the newer
    cannot be read, and `path` is never missing, not even for a moment (a reader or a crash in between
    finds the older state under its own name)."""
    path, previous = Path(path), Path(previous)
    if path.exists():
        link = previous.with_name(f".{previous.name}.{os.getpid()}-{uuid.uuid4().hex[:8]}.tmp")
        try:
            os.link(path, link)
        except OSError as e:
            if _disk_full(e):
                raise disk_full_error(previous) from e
            shutil.copy2(path, link)
        os.replace(link, previous)
    return save_torch(obj, path)


def load_torch(path: str | Path, map_location: Any = "cpu") -> Any:
    import torch

    try:
        return torch.load(path, map_location=map_location, weights_only=False)
    except Exception as e:  # a corrupt file must name itself, in one line
        reason = str(e).split(". ")[0].splitlines()[0] if str(e) else type(e).__name__
        raise RuntimeError(f"cannot read checkpoint {path}: {reason} (truncated or corrupt?)") from e


def save_json(obj: Any, path: str | Path) -> Path:
    return atomic_write_bytes(path, json.dumps(obj, indent=2, sort_keys=True, allow_nan=True).encode())


def save_text(text: str, path: str | Path) -> Path:
    return atomic_write_bytes(path, text.encode())


def load_json(path: str | Path) -> Any:
    """A JSON file, its gzip-compressed copy (name ending in .gz), or a file of a kept run (`kept_member`)."""
    path = Path(path)
    inside = None if path.exists() else kept_member(path)
    if inside is not None:
        run, name = inside
        return kept.member(kept_members(run), name, run)
    with gzip.open(path, "rt") if path.suffix == ".gz" else open(path) as f:
        return json.load(f)


def kept_member(path: str | Path) -> tuple[Path, str] | None:
    """(kept run file, the file's path in the run) when `path` lies inside a kept run file, else None."""
    path = Path(path)
    for run in path.parents:
        if run.name.endswith(kept.KEPT_SUFFIX):
            return (run, path.relative_to(run).as_posix()) if run.is_file() else None
    return None


def kept_members(run: str | Path) -> dict[str, Any]:
    """The files of a kept run, as stored (read once while the file is unchanged, and shared: `kept.member` gives a
    copy of one to use)."""
    stat = Path(run).stat()
    return _decoded(str(run), stat.st_mtime_ns, stat.st_size)


@functools.lru_cache(maxsize=32)
def _decoded(path: str, mtime_ns: int, size: int) -> dict[str, Any]:
    return kept.decode(Path(path).read_bytes(), path)


def holder(path: str | Path) -> Path:
    """The file on disk that holds `path`: the kept run file it lies in, else itself."""
    inside = kept_member(path)
    return Path(path) if inside is None else inside[0]


def existing_json(path: str | Path) -> Path | None:
    """`path` if it exists (a file, or a file of a kept run), else its compressed copy `<path>.gz` if that exists,
    else None."""
    path = Path(path)
    return next((p for p in (path, path.with_name(path.name + ".gz")) if _is_json_file(p)), None)


def _is_json_file(path: Path) -> bool:
    if path.is_file():
        return True
    inside = kept_member(path)
    return inside is not None and inside[1] in kept_members(inside[0])


def find_json(folder: str | Path, pattern: str, recursive: bool = False) -> list[Path]:
    """Files under `folder` matching `pattern` (a glob of a .json name; `recursive`: at any depth), each also
    found as its compressed copy `<name>.gz`; a file present both ways counts once (the plain one). The files of
    kept runs under `folder` (or of `folder` itself, a kept run) count as the files of the workspaces they were."""
    folder = Path(folder)
    search = folder.rglob if recursive else folder.glob
    plain = set(search(pattern))
    compressed = {p for p in search(pattern + ".gz") if p.with_suffix("") not in plain}
    return sorted(plain | compressed | set(_kept_matches(folder, ("**/" if recursive else "") + pattern)))


def _kept_matches(folder: Path, pattern: str) -> list[Path]:
    """The files of the kept runs under `folder` (or of `folder`, a kept run) whose path below `folder` matches."""
    runs = [folder] if kept.is_kept(folder) else [p for p in folder.rglob("*" + kept.KEPT_SUFFIX) if p.is_file()]
    wanted = _glob_regex(pattern)
    found = (run / name for run in runs for name in kept_members(run))
    return [p for p in found if wanted.fullmatch(p.relative_to(folder).as_posix())]


def _glob_regex(pattern: str) -> re.Pattern[str]:
    """A relative glob (`*` and `?` within a name, `**` for any number of folders) as a regular expression on
    '/'-separated paths."""
    parts = []
    for part in pattern.split("/"):
        parts.append("(?:[^/]+/)*" if part == "**" else re.escape(part).replace(r"\*", "[^/]*").replace(r"\?", "[^/]") + "/")
    return re.compile("".join(parts).removesuffix("/"))
