"""Atomic file writes: a crash mid-write never leaves a truncated checkpoint or results file."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

import torch


def _atomic_write(path: Path, write) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def save_torch(obj: Any, path: str | Path) -> Path:
    return _atomic_write(Path(path), lambda f: torch.save(obj, f))


def load_torch(path: str | Path, map_location: str | torch.device = "cpu") -> Any:
    try:
        return torch.load(path, map_location=map_location, weights_only=False)
    except Exception as e:  # a corrupt file must name itself
        raise RuntimeError(f"cannot read checkpoint {path}: {e}") from e


def save_json(obj: Any, path: str | Path) -> Path:
    data = json.dumps(obj, indent=2, sort_keys=True, allow_nan=True).encode()
    return _atomic_write(Path(path), lambda f: f.write(data))


def save_text(text: str, path: str | Path) -> Path:
    return _atomic_write(Path(path), lambda f: f.write(text.encode()))


def load_json(path: str | Path) -> Any:
    with open(path) as f:
        return json.load(f)
