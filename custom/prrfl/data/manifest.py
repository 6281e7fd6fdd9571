"""manifest.json of a prepared folder: written last (its presence means complete), read back checked.

A data set's manifest class derives from `PreparedManifest`, naming its format string and the
data set in `FORMAT` and `KIND`, and adds its own accessors and summary table.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, TypeVar

from prrfl.storage import atomic_write_bytes

MANIFEST_NAME = "manifest.json"

M = TypeVar("M", bound="PreparedManifest")


@dataclass(frozen=True)
class PreparedManifest:
    """The content of <root>/manifest.json, with accessors."""

    FORMAT: ClassVar[str] = ""  # the 'format' field a manifest of this kind must hold
    KIND: ClassVar[str] = ""  # names the data set in errors ("not a prepared <KIND> folder")

    root: Path
    data: dict[str, Any]

    @classmethod
    def load(cls: type[M], root: str | Path) -> M:
        path = Path(root) / MANIFEST_NAME
        if not path.is_file():
            raise FileNotFoundError(f"no {MANIFEST_NAME} in {root}: not a prepared {cls.KIND} folder (or preparation did not finish)")
        try:
            data = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as e:
            raise ValueError(f"cannot read {path}: {e}") from e
        if data.get("format") != cls.FORMAT:
            raise ValueError(f"{path}: field 'format' is {data.get('format')!r}, expected {cls.FORMAT!r}")
        return cls(Path(root), data)

    @property
    def config_hash(self) -> str:
        return self.data["config_hash"]

    @property
    def size(self) -> int:
        return int(self.data["config"]["size"])

    @property
    def sites(self) -> list[str]:
        return list(self.data["sites"])

    def table(self) -> str:
        """The per-site summary that `prepare` prints (each data set has its own)."""
        raise NotImplementedError


def config_hash(config: dict[str, Any]) -> str:
    """Short hash of a preparation's config (key order does not matter)."""
    return hashlib.sha256(json.dumps(config, sort_keys=True).encode()).hexdigest()[:16]


def fingerprint(root: str | Path) -> tuple[str, bool]:
    """(sha256 of <root>/manifest.json's bytes, whether the prepared data is synthetic), for a model card.

    The digest identifies one preparation as written: its config (image size, split seed and
    fractions, sites, the generator's parameters for synthetic data), the source folders it names,
    the per-site split counts and warnings. It does not hash the pixels: raw images replaced by others
    in the same folder, in the same numbers, prepared again, give the same digest. The data is
    synthetic when its manifest says it was prepared from a generated raw layout (`config.synthetic`,
    copied from the generator's marker file; null for real data).
    """
    data = (Path(root) / MANIFEST_NAME).read_bytes()
    return hashlib.sha256(data).hexdigest(), json.loads(data).get("config", {}).get("synthetic") is not None


def write_manifest(out_root: Path, manifest: dict[str, Any]) -> Path:
    """Write <out_root>/manifest.json atomically (indented JSON, one trailing newline)."""
    return atomic_write_bytes(out_root / MANIFEST_NAME, (json.dumps(manifest, indent=2) + "\n").encode())
