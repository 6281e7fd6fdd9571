"""Copy what a sweep's report is built from, and nothing heavier, into another folder with the same
layout: every results.json (sites and server) and crosseval.json, gzip-compressed (<name>.json.gz, which
`prrfl report` and `prrfl results` read as they read the plain files) and each run's <name>.done.json. Only
finished runs are copied: a run folder's histories only when its <name>.done.json marker lies beside it, so a
failed or stopped run leaves nothing a report could read as if it were whole. Models,
TensorBoard events, examples arrays, simulator workspaces and the sweep's own report stay behind
(benchmarks/bench_sweep.sh rebuilds the reports from every run kept).

    python benchmarks/keep_results.py <sweep folder> <destination>
    python benchmarks/keep_results.py --slim <kept folder>      # compress in place, drop arrays

`prrfl report <destination>/*_s* --out ...` rebuilds every table and curve of the report from the copy (the
overlay figure needs the examples arrays: a report folder keeps the overlays.jpg built while they were there); copying it back (the same command,
folders swapped) into a sweep folder lets `prrfl sweep` on that folder skip the runs it holds, so a long sweep
can continue on another machine or day. `--slim` turns a folder kept before compression into this form.
"""

from __future__ import annotations

import gzip
import shutil
import sys
from pathlib import Path

COMPRESSED = ("results.json", "crosseval.json")  # kept as <name>.gz
DROPPED = ("examples.npz",)  # arrays: never in docs/results


def compress(data: bytes) -> bytes:
    return gzip.compress(data, compresslevel=9, mtime=0)  # mtime 0: the same file gives the same bytes


def kept_name(path: Path) -> str | None:
    """The name `path` is kept under, or None when it is not kept."""
    if path.name in COMPRESSED:
        return path.name + ".gz"
    if path.name.endswith(".gz") and path.name[:-3] in COMPRESSED:
        return path.name
    return path.name if path.name.endswith(".done.json") else None


def finished(src: Path, rel: Path) -> bool:
    """Whether `rel` (a file under `src`) is a done marker or lies in a run folder that has one beside it."""
    if rel.name.endswith(".done.json"):
        return True
    return any((src / folder).with_name(folder.name + ".done.json").is_file() for folder in rel.parents if folder.parts)


def keep(src: Path, dst: Path) -> int:
    copied = 0
    for path in sorted(src.rglob("*")):
        rel = path.relative_to(src)
        name = kept_name(path) if path.is_file() else None
        skipped = rel.parts[0] in ("jobs", "report") or rel.parts[0].endswith(".state")  # state folders: models, copies
        if name and not skipped and finished(src, rel):
            target = dst / rel.parent / name
            target.parent.mkdir(parents=True, exist_ok=True)
            if name == path.name:
                shutil.copy2(path, target)
            else:
                target.write_bytes(compress(path.read_bytes()))
            copied += 1
    return copied


def slim(folder: Path) -> tuple[int, int]:
    """Compress every results.json / crosseval.json under `folder` in place and delete the arrays: (compressed,
    deleted)."""
    compressed = deleted = 0
    for path in sorted(folder.rglob("*")):
        if path.is_file() and path.name in COMPRESSED:
            path.with_name(path.name + ".gz").write_bytes(compress(path.read_bytes()))
            path.unlink()
            compressed += 1
        elif path.is_file() and path.name in DROPPED:
            path.unlink()
            deleted += 1
    return compressed, deleted


def main(argv: list[str]) -> int:
    if len(argv) == 2 and argv[0] == "--slim" and Path(argv[1]).is_dir():
        compressed, deleted = slim(Path(argv[1]))
        print(f"{argv[1]}: {compressed} files compressed, {deleted} arrays deleted")
        return 0
    if len(argv) != 2 or argv[0].startswith("--"):
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
