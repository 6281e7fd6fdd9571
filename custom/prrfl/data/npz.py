"""Prepared splits as uncompressed npz files: written atomically, read back without pickle.

npz because it is plain numpy, loads without pickle, memory-maps nothing surprising and needs no
extra dependency. Reading errors name the file on one line: a missing file says which command
prepares it, a corrupt one or a missing array says what is wrong.
"""

from __future__ import annotations

import zipfile
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from prrfl.storage import atomic_write


def save_npz(path: Path, arrays: dict[str, np.ndarray]) -> Path:
    """Write `arrays` to `path` atomically (uncompressed npz)."""
    return atomic_write(path, lambda f: np.savez(f, **arrays))


def load_npz(path: Path, keys: Sequence[str], *, command: str, list_expected: bool = False) -> dict[str, np.ndarray]:
    """The arrays `keys` of the prepared split `path`, all of them or an error naming the file.

    `command` prepares a missing file (named in its error); `list_expected` adds the expected
    names to the error on missing arrays.
    """
    if not path.is_file():
        raise FileNotFoundError(f"prepared split not found: {path} (run `{command}` first)")
    try:
        with np.load(path, allow_pickle=False) as z:
            arrays = {k: z[k] for k in keys if k in z.files}
    except (zipfile.BadZipFile, OSError, EOFError, ValueError) as e:  # np.load says ValueError for non-npz bytes
        raise ValueError(f"cannot read prepared split {path}: {e}") from e
    missing = [k for k in keys if k not in arrays]
    if missing:
        raise ValueError(f"{path}: missing array(s) {missing}" + (f"; expected {list(keys)}" if list_expected else ""))
    return arrays
