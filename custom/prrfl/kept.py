"""A kept run: everything the reports read of one finished run, in one file (`<run>.kept.json.gz`), the form
docs/results keeps benchmark runs in (benchmarks/keep_results.py writes it).

A run of the FLARE simulator leaves a workspace of many files: each site's results.json, the server's results.json
and the crosseval.json of FLARE's cross-site evaluation beside it, the run's own crosseval.json (prrfl.crosseval),
and, beside the workspace, the `<run>.done.json` marker of a finished sweep run. A kept run holds each of these
files under its path in the workspace ("site-1/prrfl/derm_prr_s0/results.json"; the marker as "done.json"), less
what no report reads (prrfl.report.keep says what that is), every number kept as it is in the file. A site's
history is stored column-wise (`columns`): the records of one shape (the same keys) as one table of columns, and
the order the records came in. The whole is one JSON object, gzip-compressed with mtime 0: the same run gives the
same bytes.

prrfl.storage reads a kept run as the workspace it was: `<folder>/<run>.kept.json.gz/site-1/prrfl/<run>/results.json`
is that site's results file (load_json, existing_json, find_json), so `prrfl report` and `prrfl results` read kept
runs as they read workspaces. This module is the format alone: no file is read or written here.
"""

from __future__ import annotations

import copy
import gzip
import json
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

KEPT_SUFFIX = ".kept.json.gz"
DONE_MEMBER = "done.json"  # the run's <run>.done.json marker
FORMAT = "prrfl kept run"
VERSION = 1


def is_kept(path: str | Path) -> bool:
    """Whether `path` is a kept run file."""
    path = Path(path)
    return path.name.endswith(KEPT_SUFFIX) and path.is_file()


def run_name(path: str | Path) -> str:
    """The run a kept file holds ("prr_s0" for prr_s0.kept.json.gz): the name its workspace folder had."""
    return Path(path).name.removesuffix(KEPT_SUFFIX)


def done_marker(run: str | Path) -> Path:
    """Where a run's done marker is: in a kept run its DONE_MEMBER, beside a run folder its <run>.done.json."""
    run = Path(run)
    return run / DONE_MEMBER if run.name.endswith(KEPT_SUFFIX) else run.with_name(run.name + ".done.json")


# ----- column-wise histories -------------------------------------------------------------------
def _leaves(value: Any, path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], Any]]:
    """(key path, value) of every value in nested dicts that is not itself a dict with keys."""
    if isinstance(value, dict) and value:
        for key, inner in value.items():
            yield from _leaves(inner, (*path, key))
    else:
        yield path, value


def columns(records: list[Any]) -> dict[str, Any]:
    """A list of dicts as tables: `keys[t]` the key paths of table t's columns, `values[t]` its columns (one value per
    record of that shape), `order` the table of each record in turn."""
    shapes: dict[tuple[tuple[str, ...], ...], int] = {}
    keys: list[list[list[str]]] = []
    values: list[list[list[Any]]] = []
    order = []
    for record in records:
        leaves = sorted(_leaves(record), key=lambda leaf: leaf[0])
        shape = tuple(path for path, _ in leaves)
        if shape not in shapes:
            shapes[shape] = len(keys)
            keys.append([list(path) for path in shape])
            values.append([[] for _ in shape])
        table = shapes[shape]
        order.append(table)
        for column, (_, value) in zip(values[table], leaves, strict=True):
            column.append(value)
    return {"keys": keys, "values": values, "order": order}


def records(tables: dict[str, Any]) -> list[Any]:
    """The list of dicts `columns` was given, in its order."""
    rows = [iter(zip(*table, strict=True)) for table in tables["values"]]
    out = []
    for t in tables["order"]:
        record: Any = {}
        for path, value in zip(tables["keys"][t], next(rows[t]), strict=True):
            if not path:  # a record that is not a dict with keys: its one column is the record
                record = value
                continue
            inner = record
            for key in path[:-1]:
                inner = inner.setdefault(key, {})
            inner[path[-1]] = value
        out.append(record)
    return out


# ----- the file --------------------------------------------------------------------------------
def encode(members: dict[str, Any]) -> bytes:
    """The kept run of `members` (each file of the run by its path in the workspace, the done marker as DONE_MEMBER;
    as they are to be kept): sites' histories column-wise, as gzip-compressed JSON (sorted keys, mtime 0)."""
    stored = {name: {**data, "history": columns(data["history"])} if is_site_results(data) else data for name, data in members.items()}
    text = json.dumps({"format": FORMAT, "version": VERSION, "members": stored}, sort_keys=True, separators=(",", ":"), allow_nan=True)
    return gzip.compress(text.encode(), compresslevel=9, mtime=0)


def is_site_results(data: Any) -> bool:
    """Whether `data` has the shape of a site's results.json (its history a list of records)."""
    return isinstance(data, dict) and isinstance(data.get("site"), str) and isinstance(data.get("history"), list)


def decode(blob: bytes, where: str | Path) -> dict[str, Any]:
    """The members of a kept run file's bytes, as stored (histories column-wise: `member` expands them); a file
    that is not one raises ValueError naming `where` and what was expected."""
    try:
        data = json.loads(gzip.decompress(blob))
    except (OSError, EOFError, zlib.error, UnicodeDecodeError, ValueError) as e:
        raise ValueError(f"{where}: not a kept run (expected gzip-compressed JSON; truncated or corrupt? {e})") from e
    if not isinstance(data, dict) or data.get("format") != FORMAT or not isinstance(data.get("members"), dict):
        raise ValueError(f"{where}: not a kept run (expected a JSON object with format '{FORMAT}' and its 'members')")
    if data.get("version") != VERSION:
        raise ValueError(f"{where}: kept run version {data.get('version')!r}; this prrfl reads version {VERSION}")
    return data["members"]


def member(members: dict[str, Any], name: str, where: str | Path) -> Any:
    """The file `name` of a decoded kept run, as it was read from the workspace less what was left out: a copy,
    its history as a list of records again."""
    if name not in members:
        raise FileNotFoundError(f"{where}: the kept run has no {name} (it holds {', '.join(sorted(members)) or 'nothing'})")
    data = copy.deepcopy(members[name])
    if isinstance(data, dict) and isinstance(data.get("history"), dict):
        try:
            data["history"] = records(data["history"])
        except (KeyError, TypeError, ValueError, IndexError, AttributeError, StopIteration) as e:
            raise ValueError(f"{where}: {name}: history is not a column-wise table (keys, values, order): {e!r}") from e
    return data
