"""Copy what a sweep's report is built from, and nothing heavier, into another folder with the same
layout: every results.json (sites and server), crosseval.json, each run's <name>.done.json and log
tail, and the report folder. Models, TensorBoard events and simulator workspaces stay behind.

    python benchmarks/keep_results.py <sweep folder> <destination>

`prrfl report <destination>/*_s* --out ...` rebuilds the report from the copy, and copying it back
(the same command, folders swapped) into a sweep folder lets `prrfl sweep` on that folder skip the runs
it holds, so a long sweep can continue on another machine or day.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

KEPT = ("results.json", "crosseval.json", "examples.npz")


def keep(src: Path, dst: Path) -> int:
    copied = 0
    for path in sorted(src.rglob("*")):
        rel = path.relative_to(src)
        wanted = path.is_file() and (path.name in KEPT or path.name.endswith(".done.json") or rel.parts[0] == "report")
        if wanted and rel.parts[0] != "jobs" and not rel.parts[0].endswith(".state"):  # state folders: models, copies
            target = dst / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, target)
            copied += 1
    return copied


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    src, dst = Path(argv[0]), Path(argv[1])
    if not src.is_dir():
        print(f"{src} is not a folder", file=sys.stderr)
        return 2
    print(f"{keep(src, dst)} files copied from {src} to {dst}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
