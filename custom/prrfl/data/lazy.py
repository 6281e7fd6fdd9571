"""Lazy exports for the data packages: a name is imported from its submodule on first use.

A package's `__init__` lists {name: submodule} and takes its `__all__`, `__getattr__` and
`__dir__` from `lazy_exports`, so that importing the package imports no submodule (image and
volume worker processes do not import torch, reading a raw layout needs no MONAI).
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable
from typing import Any


def lazy_exports(package: str, exports: dict[str, str]) -> tuple[list[str], Callable[[str], Any], Callable[[], list[str]]]:
    """(`__all__`, `__getattr__`, `__dir__`) for `package`, whose names live in the submodules `exports` gives."""
    names = sorted(exports)

    def __getattr__(name: str) -> Any:
        if name not in exports:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f".{exports[name]}", package), name)
        setattr(sys.modules[package], name, value)  # later look-ups find it without this hook
        return value

    def __dir__() -> list[str]:
        return names

    return names, __getattr__, __dir__
