"""Keep what a sweep's reports are built from, and nothing heavier: each finished run as one file,
`<run>.kept.json.gz` (prrfl.kept: every site's results.json, the server's results.json and crosseval.json, the run's
crosseval.json and its <run>.done.json marker, less what no report reads, prrfl.report.keep; the numbers as they
are), at the path its workspace folder had. `prrfl report` and `prrfl results` read a kept run as they read the
workspace, so a report built from kept runs is the one built from the workspaces. Only finished runs are kept: a run
folder only when its <run>.done.json marker lies beside it, so a failed or stopped run leaves nothing a report could
read as if it were whole. Models, TensorBoard events, examples arrays, the simulators' workspaces and the sweep's own
report stay behind (benchmarks/bench_sweep.sh rebuilds the reports from every run kept).

    python benchmarks/keep_results.py <sweep folder> <destination>     # each finished run as <run>.kept.json.gz
    python benchmarks/keep_results.py --compact <kept folder>          # runs kept as folders: one file each, in place;
                                                                       # kept runs packed again by today's rules
    python benchmarks/keep_results.py --unpack <kept folder> <sweep folder>   # kept runs back as workspaces

`prrfl report <destination>/*_s[0-9].kept.json.gz --out ...` rebuilds every table and curve of the report from the
kept runs (the overlay figure needs the examples arrays: a report folder keeps the overlays.jpg built while they were
there). `--compact` turns a folder of runs kept as workspace folders (plain or gzip-compressed results files, with or
without their markers) into kept run files, the folders and markers removed, and packs every kept run under it again
where prrfl.report.keep now leaves out more than when it was kept (the same tables read from it). `--unpack` writes kept runs back as
workspace folders with their markers (the results files as kept), so that `prrfl sweep` on that folder skips the runs
it holds and its report covers them: a long sweep can continue on another machine or day, and be kept again.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path
from typing import Any

from prrfl import kept
from prrfl.report.keep import pack, slim
from prrfl.storage import atomic_write_bytes, find_json, kept_members, load_json, save_json

KEPT_FILES = ("results.json", "crosseval.json")  # found plain or gzip-compressed, anywhere in a run's folder
DONE = ".done.json"
SERVER_RESULTS = "server/simulate_job/results.json"  # FLARE's simulator: a run folder holds this


def run_folders(folder: Path) -> list[Path]:
    """Every run under `folder`: a folder with its <run>.done.json beside it, or one holding the server's
    results of FLARE's simulator (a run kept before markers were written); none in a sweep's jobs/, report/ or
    <run>.state/ folders (the jobs, the sweep's report, copies of the sites' state)."""
    marked = {p.with_name(p.name.removesuffix(DONE)) for p in folder.rglob("*" + DONE)}
    served = {p.parents[2] for p in find_json(folder, SERVER_RESULTS, recursive=True)}
    return sorted(run for run in marked | served if run != folder and run.is_dir() and not in_sweep_extras(run.relative_to(folder)))


def in_sweep_extras(rel: Path) -> bool:
    return any(part in ("jobs", "report") or part.endswith(".state") for part in rel.parts)


def members(run: Path) -> dict[str, Any]:
    """The files a kept run holds, by their path in the run's folder (the marker as kept.DONE_MEMBER)."""
    files = [p for name in KEPT_FILES for p in find_json(run, name, recursive=True)]
    found = {p.relative_to(run).as_posix().removesuffix(".gz"): load_json(p) for p in files}
    return found | ({kept.DONE_MEMBER: load_json(kept.done_marker(run))} if kept.done_marker(run).is_file() else {})


def write_kept(run: Path, target: Path) -> Path:
    """Write the run folder `run` as the kept run `target` (atomically) and check that it reads back as the run's
    files less what is left out; a run that cannot be kept names itself."""
    try:
        found = members(run)
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ValueError(f"{run}: cannot be kept: {e}") from e
    return write_members(found, target, run)


def write_members(found: dict[str, Any], target: Path, source: Path) -> Path:
    """Write a run's files `found` (read from `source`) as the kept run `target`, atomically, and check that it reads
    back as them less what is left out."""
    try:
        atomic_write_bytes(target, pack(found))
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ValueError(f"{source}: cannot be kept: {e}") from e
    stored = kept_members(target)
    for name, data in found.items():
        if as_text(kept.member(stored, name, target)) != as_text(slim(data)):
            raise ValueError(f"{target}: {name} does not read back as {source}'s file")
    return target


def repack(path: Path) -> bool:
    """Pack the kept run `path` again by today's rules (prrfl.report.keep); rewritten, and True, only where that
    leaves out more than the rules it was kept by."""
    stored = kept_members(path)
    found = {name: kept.member(stored, name, path) for name in stored}
    if pack(found) == path.read_bytes():
        return False
    write_members(found, path, path)
    return True


def as_text(data: Any) -> str:
    return json.dumps(data, sort_keys=True, allow_nan=True)


def kept_path(run: Path, src: Path, dst: Path) -> Path:
    rel = run.relative_to(src)
    return dst / rel.parent / (rel.name + kept.KEPT_SUFFIX)


def keep(src: Path, dst: Path) -> int:
    """Every finished run under `src` (its marker beside it) as a kept run under `dst`; returns how many."""
    finished = [run for run in run_folders(src) if kept.done_marker(run).is_file()]
    for run in finished:
        write_kept(run, kept_path(run, src, dst))
    return len(finished)


def compact(folder: Path) -> int:
    """Every run under `folder` kept as a folder (with or without its marker) turned into a kept run beside it, the
    folder and the marker removed once the kept run reads back (`write_kept`), and every kept run under it packed
    again where today's rules leave out more (`repack`); returns how many files were written."""
    runs = run_folders(folder)
    for run in runs:
        write_kept(run, kept_path(run, folder, folder))
        shutil.rmtree(run)
        kept.done_marker(run).unlink(missing_ok=True)
    packed = [path for path in sorted(folder.rglob("*" + kept.KEPT_SUFFIX)) if kept.is_kept(path) and repack(path)]
    return len(runs) + len(packed)


def unpack(src: Path, dst: Path) -> int:
    """Every kept run under `src` as a run folder under `dst` (its files as kept, plain JSON) with its marker beside
    it; returns how many."""
    runs = sorted(p for p in src.rglob("*" + kept.KEPT_SUFFIX) if kept.is_kept(p))
    for path in runs:
        rel = path.relative_to(src)
        folder = dst / rel.parent / kept.run_name(path)
        for name in kept_members(path):
            save_json(load_json(path / name), kept.done_marker(folder) if name == kept.DONE_MEMBER else folder / name)
    return len(runs)


def main(argv: list[str]) -> int:
    if len(argv) == 2 and argv[0] == "--compact" and Path(argv[1]).is_dir():
        print(f"{argv[1]}: {compact(Path(argv[1]))} runs compacted or packed again")
        return 0
    if len(argv) == 3 and argv[0] == "--unpack" and Path(argv[1]).is_dir():
        print(f"{unpack(Path(argv[1]), Path(argv[2]))} kept runs unpacked from {argv[1]} to {argv[2]}")
        return 0
    if len(argv) != 2 or argv[0].startswith("--"):
        print(__doc__, file=sys.stderr)
        return 2
    src, dst = Path(argv[0]), Path(argv[1])
    if not src.is_dir():
        print(f"{src} is not a folder", file=sys.stderr)
        return 2
    print(f"{keep(src, dst)} runs kept from {src} in {dst}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
