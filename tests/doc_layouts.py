"""The real-data layouts as the docs write them, for the tests that build a tree from them.

A task's data page holds its raw layout as a fenced block right after the marker `<!-- data-layout: <task> -->`:
one entry a line, two spaces of indent per level, folders ending in `/`, a top-level entry a root folder
(`<raw>/`), `<name>` a placeholder (one file per image or case), and after `# ` what the entry is. A CSV file's
note says `CSV: col, col, ...` (its columns, in order, up to a `(` or `;`); a placeholder folder's or a file's other
spelling is `(or <other spelling>)`. The tests build their tiny trees from these entries, so a doc that names a
file, a folder or a column the readers do not read fails them.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

DOCS = Path(__file__).resolve().parents[1] / "docs"
MARKER = re.compile(r"<!-- data-layout: ([\w-]+) -->\n```[^\n]*\n(.*?)```", re.S)
PLACEHOLDER = re.compile(r"<([^<>]+)>")


@dataclass(frozen=True)
class Entry:
    """One line of a layout block: its path from the root (the root's own name first) and its note."""

    parts: tuple[str, ...]
    is_dir: bool
    note: str

    @property
    def name(self) -> str:
        return self.parts[-1]

    @property
    def depth(self) -> int:
        return len(self.parts) - 1

    @property
    def columns(self) -> tuple[str, ...] | None:
        """A CSV file's documented columns, in order; None for any other entry."""
        found = re.search(r"CSV:\s*([^(;]*)", self.note)
        return tuple(c.strip() for c in found.group(1).split(",") if c.strip()) if found else None

    @property
    def alternative(self) -> str | None:
        """The other spelling the note gives, `(or <case>_Segmentation.nii.gz)` -> `<case>_Segmentation.nii.gz`."""
        found = re.search(r"\(or ([^)\s]+)\)", self.note)
        return found.group(1) if found else None

    def path(self, roots: Mapping[str, Path], name: str | None = None, **values: str) -> Path:
        """This entry under the test's root folders (root name -> folder), its placeholders filled with `values`
        (`image_id="ISIC_0000001"`); `name` replaces the entry's own name (e.g. its alternative spelling)."""
        root, *rest = self.parts
        if name is not None:
            rest[-1] = name
        path = Path(roots[root])
        for part in rest:
            path /= PLACEHOLDER.sub(lambda m: values[m.group(1)], part)
        return path


@dataclass(frozen=True)
class DocLayout:
    doc: Path
    task: str
    entries: tuple[Entry, ...]

    @classmethod
    def read(cls, page: str, task: str) -> DocLayout:
        doc = DOCS / page
        blocks = [block for name, block in MARKER.findall(doc.read_text()) if name == task]
        assert len(blocks) == 1, f"{doc}: {len(blocks)} blocks marked '<!-- data-layout: {task} -->', expected 1"
        return cls(doc, task, parse(blocks[0], doc))

    @property
    def roots(self) -> tuple[Entry, ...]:
        return tuple(e for e in self.entries if e.depth == 0)

    def one(self, match: Callable[[Entry], bool], what: str) -> Entry:
        """The one entry that `match` accepts; the test fails naming the doc and `what` otherwise."""
        found = [e for e in self.entries if match(e)]
        assert len(found) == 1, f"{self.doc}: the {self.task} layout shows {len(found)} entries for {what}, expected 1: {found}"
        return found[0]

    def csv(self, column: str) -> Entry:
        """The CSV file whose documented columns include `column`."""
        return self.one(lambda e: column in (e.columns or ()), f"a CSV file with the column {column!r}")


def parse(block: str, doc: Path | str = "<doc>") -> tuple[Entry, ...]:
    """The entries of a layout block (see the module's docstring)."""
    entries: list[Entry] = []
    stack: list[str] = []
    for number, line in enumerate(block.splitlines(), start=1):
        if not line.strip():
            continue
        text, _, note = line.partition(" # ")
        indent = len(text) - len(text.lstrip(" "))
        name = text.strip()
        if indent % 2 or indent // 2 > len(stack):
            raise ValueError(f"{doc}: layout line {number} {line!r}: indent by 2 spaces per level")
        if indent and not stack[indent // 2 - 1].endswith("/"):
            raise ValueError(f"{doc}: layout line {number} {line!r}: its parent {stack[indent // 2 - 1]!r} is not a folder")
        stack[indent // 2 :] = [name]
        entries.append(Entry(tuple(part.rstrip("/") for part in stack), name.endswith("/"), note.strip()))
    return tuple(entries)


def layout_markers() -> dict[str, list[Path]]:
    """Every data-layout block of docs/: task -> the pages that hold one."""
    found: dict[str, list[Path]] = {}
    for page in sorted(DOCS.glob("*.md")):
        for task, _ in MARKER.findall(page.read_text()):
            found.setdefault(task, []).append(page)
    return found
