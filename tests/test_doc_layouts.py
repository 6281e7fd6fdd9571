"""Every task's real-data layout is written in the docs, as a block the tests build their trees from
(tests/doc_layouts.py): a doc that names a folder, a file or a column the readers do not read fails them."""

from __future__ import annotations

from pathlib import Path

import pytest
from doc_layouts import DocLayout, layout_markers, parse

from prrfl.registry import task_names

TESTS = Path(__file__).resolve().parent


def test_every_tasks_raw_layout_is_in_the_docs_once_and_a_test_builds_it_from_there():
    markers = layout_markers()
    assert sorted(markers) == task_names(), f"tasks with a '<!-- data-layout: <task> -->' block in docs/: {sorted(markers)}"
    sources = "".join(p.read_text() for p in TESTS.glob("test_*.py") if p.name != Path(__file__).name)
    for task, pages in markers.items():
        assert len(pages) == 1, f"the {task} layout is written on {len(pages)} pages: {[p.name for p in pages]}"
        assert f'DocLayout.read("{pages[0].name}", "{task}")' in sources, f"no test builds the {task} layout of docs/{pages[0].name}"


def test_a_layout_block_reads_as_a_tree_of_roots_folders_files_and_columns(tmp_path):
    entries = parse(
        "<raw>/                # --raw\n"
        "  table.csv           # CSV: image_id, dx (the labels); more\n"
        "  images/\n"
        "    <image_id>.jpg    # one per row (or <image_id>.png)\n"
        "<other root>/         # --other\n"
    )
    assert [(e.parts, e.is_dir) for e in entries] == [
        (("<raw>",), True),
        (("<raw>", "table.csv"), False),
        (("<raw>", "images"), True),
        (("<raw>", "images", "<image_id>.jpg"), False),
        (("<other root>",), True),
    ]
    table, _, image = entries[1:4]
    assert table.columns == ("image_id", "dx") and image.columns is None and image.alternative == "<image_id>.png"
    roots = {"<raw>": tmp_path}
    assert image.path(roots, image_id="ISIC_1") == tmp_path / "images" / "ISIC_1.jpg"
    assert image.path(roots, name=image.alternative, image_id="ISIC_1") == tmp_path / "images" / "ISIC_1.png"
    layout = DocLayout(Path("page.md"), "t", entries)
    assert layout.csv("dx") is table and [r.name for r in layout.roots] == ["<raw>", "<other root>"]
    with pytest.raises(AssertionError, match="page.md: the t layout shows 0 entries for a CSV file with the column 'age'"):
        layout.csv("age")


@pytest.mark.parametrize(
    "block, message",
    [
        ("<raw>/\n   odd.csv\n", "layout line 2 '   odd.csv': indent by 2 spaces per level"),
        ("<raw>/\n    deep.csv\n", "layout line 2 '    deep.csv': indent by 2 spaces per level"),
        ("<raw>/\n  file.csv\n    inner.jpg\n", "layout line 3 '    inner.jpg': its parent 'file.csv' is not a folder"),
    ],
)
def test_a_malformed_layout_block_is_refused_naming_the_line(block, message):
    with pytest.raises(ValueError, match=message):
        parse(block, "page.md")
