"""Dermoscopy data layer: raw readers, the authors' split files, preparation, prepared splits, cache, CLI."""

from __future__ import annotations

import csv
import json
import multiprocessing as mp
import re
import shlex
import shutil
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch
from doc_layouts import DocLayout
from PIL import Image

from prrfl.tasks.derm import __main__ as cli
from prrfl.tasks.derm.author_splits import (
    author_split_counts,
    author_split_path,
    read_author_split_file,
    read_author_splits,
)
from prrfl.tasks.derm.cache import ensure_synthetic_federation
from prrfl.tasks.derm.layout import CLASS_NAMES, SITES, SPLITS
from prrfl.tasks.derm.layout import DEFAULT_LAYOUT as L
from prrfl.tasks.derm.plan import table_counts
from prrfl.tasks.derm.prepare import Manifest, prepare_dermoscopy
from prrfl.tasks.derm.records import read_ham10000, read_isic2017
from prrfl.tasks.derm.splitting import HELDOUT_MIN_PER_CLASS, stratified_assignment
from prrfl.tasks.derm.store import class_counts, load_split
from prrfl.tasks.derm.synthetic import generate_synthetic
from prrfl.tasks.derm.task import DermTask

AUTHORS_COPY = Path(__file__).parent / "data" / "authors_splits"

# docs/authors_code.md §5.2: nv / bkl / mel per client and split.
AUTHOR_COUNTS = {
    "A": {"train": (1282, 333, 476), "valid": (183, 47, 68), "test": (367, 95, 136)},
    "B": {"train": (2604, 87, 17), "valid": (372, 12, 2), "test": (744, 25, 5)},
    "C": {"train": (562, 343, 239), "valid": (80, 49, 34), "test": (161, 98, 69)},
    "D": {"train": (960, 178, 262), "valid": (137, 25, 37), "test": (275, 51, 75)},
}


@pytest.fixture(scope="module")
def raw(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("derm") / "raw"
    generate_synthetic(out, scale=0.02, seed=0, image_size=(80, 60))
    return out


@pytest.fixture(scope="module")
def prepared(raw, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("derm") / "prepared"
    prepare_dermoscopy(raw, out, size=32, seed=0)
    return out


def _copy_raw(raw: Path, tmp_path: Path) -> Path:
    dst = tmp_path / "raw"
    shutil.copytree(raw, dst)
    return dst


# ---------------------------------------------------------------- the authors' split files


def _check_author_counts(directory: Path) -> None:
    splits = read_author_splits(directory)
    assert author_split_counts(splits) == AUTHOR_COUNTS
    train_sum = np.sum([AUTHOR_COUNTS[s]["train"] for s in AUTHOR_COUNTS], axis=0)
    assert tuple(train_sum) == (5408, 941, 994)
    assert sum(len(rows) for by in splits.values() for rows in by.values()) == 10490
    d_train = splits["D"]["train"][0]  # quirk: ISIC flags under lesion_id / dx, read as flags, not as a lesion
    assert d_train.lesion_id is None and d_train.image_id.startswith("ISIC_")
    a_row = splits["A"]["train"][0]
    assert a_row.lesion_id.startswith("HAM_") and a_row.localization


def test_author_splits_repo_copy_has_the_reference_counts():
    _check_author_counts(AUTHORS_COPY)
    assert (AUTHORS_COPY / "LICENSE").read_text().startswith("MIT")


def _edited_copy(tmp_path: Path, site: str, split: str, line: int, edit) -> Path:
    d = tmp_path / "splits"
    shutil.copytree(AUTHORS_COPY, d)
    path = author_split_path(d, site, split)
    lines = path.read_text().splitlines(keepends=True)
    lines[line - 1] = edit(lines[line - 1])
    path.write_text("".join(lines))
    return path


@pytest.mark.parametrize(
    ("site", "split", "edit", "match"),
    [
        ("A", "train", lambda ln: ln.replace(",0,0,", ",7,0,", 1), "field 'label' must be one of"),
        ("A", "train", lambda ln: ln.replace(",nv,", ",mel,", 1), "disagrees with field 'dx'"),
        ("D", "test", lambda ln: ln.split(",")[0] + ",0,0,1,0\n", "disagrees with the ISIC flags"),  # nv row, mel flag
        ("D", "train", lambda ln: ln.replace(",0,0,0,0,", ",0,0,1,1,", 1), "both melanoma and seborrheic_keratosis"),
        ("B", "valid", lambda ln: ln.replace("vidir_molemax", "rosendahl"), "field 'dataset'"),
    ],
)
def test_author_split_errors_name_file_and_line(tmp_path, site, split, edit, match):
    path = _edited_copy(tmp_path, site, split, 2, edit)
    with pytest.raises(ValueError, match=match) as e:
        read_author_split_file(path, site)
    assert str(path) in str(e.value) and "line 2" in str(e.value)


def test_author_split_image_in_two_splits_is_an_error(tmp_path):
    first_test_row = (AUTHORS_COPY / "clientB" / "test_clientB.csv").read_text().splitlines()[1]
    path = _edited_copy(tmp_path, "B", "valid", 2, lambda ln: first_test_row + "\n")
    with pytest.raises(ValueError, match="also in split 'valid'") as e:
        read_author_splits(path.parent.parent, ["B"])
    assert "test_clientB.csv" in str(e.value)


# ---------------------------------------------------------------- raw readers


def test_ham_reader_drops_other_diagnoses_with_a_log(raw, caplog):
    caplog.set_level("INFO")
    recs = read_ham10000(raw, ["vidir_modern"])
    assert list(recs) == ["A"] and len(recs["A"]) == sum(table_counts(0.02)["A"])
    assert "dropped" in caplog.text and "outside nv/bkl/mel" in caplog.text


def test_ham_reader_errors(raw, tmp_path):
    root = _copy_raw(raw, tmp_path)
    csv_path = root / L.ham_csv
    text = csv_path.read_text()
    lines = text.splitlines(keepends=True)
    fields = lines[3].split(",")
    fields[2] = "xyz"  # dx
    lines[3] = ",".join(fields)
    csv_path.write_text("".join(lines))
    with pytest.raises(ValueError, match=r"line 4: unknown dx 'xyz'") as e:
        read_ham10000(root, ["vidir_modern", "vidir_molemax", "rosendahl", "vienna_dias"])
    assert str(csv_path) in str(e.value)
    csv_path.write_text(text.replace("localization,dataset", "localization,cohort", 1))
    with pytest.raises(ValueError, match=r"missing column\(s\) \['dataset'\]") as e:
        read_ham10000(root, ["vidir_modern"])
    assert str(csv_path) in str(e.value)
    csv_path.unlink()
    with pytest.raises(FileNotFoundError, match=str(csv_path)):
        read_ham10000(root, ["vidir_modern"])


def test_isic_reader_flags_and_msk_list(raw, tmp_path, caplog):
    root = _copy_raw(raw, tmp_path)
    base = root / L.isic_dir
    msk = read_isic2017(root)
    assert len(msk) == sum(table_counts(0.02)["D"])
    (base / L.msk_ids).unlink()
    caplog.set_level("INFO")
    everything = read_isic2017(root)
    assert len(everything) > len(msk) and "using every row" in caplog.text
    csv_path = base / L.isic_csv
    lines = csv_path.read_text().splitlines(keepends=True)
    image_id = lines[2].split(",")[0]
    lines[2] = f"{image_id},1.0,1.0\n"
    csv_path.write_text("".join(lines))
    with pytest.raises(ValueError, match="line 3: both melanoma and seborrheic_keratosis are set") as e:
        read_isic2017(root)
    assert str(csv_path) in str(e.value)
    lines[2] = f"{image_id},0.5,0.0\n"
    csv_path.write_text("".join(lines))
    with pytest.raises(ValueError, match="line 3: field 'melanoma' must be 0 or 1"):
        read_isic2017(root)


# ---------------------------------------------------------------- split rule


def test_stratified_assignment_exact_counts_and_small_classes():
    labels = [0] * 1832 + [1] * 475 + [2] * 680  # site A, Table I
    out, warnings = stratified_assignment(labels, (0.7, 0.1, 0.2), seed=0)
    per = Counter(zip(labels, out, strict=True))
    assert [per[(0, s)] for s in SPLITS] == [1283, 183, 366]
    assert [per[(2, s)] for s in SPLITS] == [476, 68, 136] and not warnings
    out, warnings = stratified_assignment([0] * 10 + [1] * 3 + [2] * 2, (0.7, 0.1, 0.2), seed=0, context="site X")
    assert [out[10:13].count(s) for s in SPLITS] == [1, 1, 1]  # 3 images: one per split
    assert out[13:] == ["train", "train"] and "class mel has only 2 image(s)" in warnings[0] and "site X" in warnings[0]


def test_heldout_minimum_exact_counts():
    labels = [0] * 40 + [1] * 12 + [2] * 8
    out, warnings = stratified_assignment(labels, (0.7, 0.1, 0.2), seed=3, heldout_min_per_class=5)
    per = Counter(zip(labels, out, strict=True))
    # test = max(M, round(0.2 n)), valid = max(M, round(0.1 n)), train the rest:
    assert [per[(0, s)] for s in SPLITS] == [27, 5, 8]  # n = 40: test 8, valid max(5, 4) = 5
    assert [per[(1, s)] for s in SPLITS] == [2, 5, 5]  # n = 12: test max(5, 2), valid max(5, 1)
    # n = 8 < 2M + 1: test is filled first, valid takes what leaves train one image
    assert [per[(2, s)] for s in SPLITS] == [1, 2, 5] and not warnings
    out, _ = stratified_assignment(labels, (0.7, 0.1, 0.2), seed=3)  # M = 1: the fractions alone
    per = Counter(zip(labels, out, strict=True))
    assert [[per[(c, s)] for s in SPLITS] for c in range(3)] == [[28, 4, 8], [9, 1, 2], [5, 1, 2]]
    grouped, _ = stratified_assignment(  # whole lesions: at least M images when the units suffice
        [0] * 30, (0.7, 0.1, 0.2), seed=1, groups=[f"L{i // 2}" for i in range(30)], heldout_min_per_class=5
    )
    assert grouped.count("test") == 6 and grouped.count("valid") == 6 and grouped.count("train") == 18


@pytest.mark.parametrize("bad", [0, -2, 2.5, True, "8"])
def test_invalid_heldout_minimum_is_refused_naming_the_field(bad, raw, tmp_path):
    with pytest.raises(ValueError, match=f"heldout_min_per_class must be an integer >= 1, got {bad!r}"):
        stratified_assignment([0] * 10, (0.7, 0.1, 0.2), seed=0, heldout_min_per_class=bad)
    with pytest.raises(ValueError, match="heldout_min_per_class must be an integer >= 1"):
        table_counts(0.08, heldout_min_per_class=bad)
    with pytest.raises(ValueError, match="heldout_min_per_class must be an integer >= 1"):
        prepare_dermoscopy(raw, tmp_path / "p", size=16, sites=("A",), heldout_min_per_class=bad)
    assert not (tmp_path / "p").exists()


def test_lesion_with_two_classes_is_an_error():
    with pytest.raises(ValueError, match="lesion L1 has images of different classes"):
        stratified_assignment([0, 1, 0], (0.7, 0.1, 0.2), 0, groups=["L1", "L1", "L2"], context="site A")


# ---------------------------------------------------------------- preparation


def test_prepared_splits_shapes_proportions_and_no_overlap(prepared, raw):
    m = Manifest.load(prepared)
    target = table_counts(0.02)
    for s in ("A", "B", "C", "D"):
        seen: set[str] = set()
        totals = np.zeros(3, int)
        for split in SPLITS:
            d = load_split(prepared, s, split)
            assert d.images.dtype == torch.uint8 and tuple(d.images.shape[1:]) == (3, 32, 32)
            assert d.labels.dtype == torch.int64 and len(d.image_ids) == len(d) == d.images.shape[0]
            assert class_counts(d) == m.counts(s, split)
            assert not seen & set(d.image_ids)
            seen |= set(d.image_ids)
            totals += class_counts(d)
            assert all(c >= 1 for c in class_counts(d))  # every class in every split (>= 3 per class)
        assert tuple(totals) == target[s]
        n = {split: sum(m.counts(s, split)) for split in SPLITS}
        assert abs(n["test"] / sum(n.values()) - 0.2) < 0.06 and abs(n["valid"] / sum(n.values()) - 0.1) < 0.06
    a = load_split(prepared, "A", "train")
    assert a.images.float().std() > 10  # pictures, not blanks


def test_real_data_keeps_its_split_and_is_warned_about_small_heldout_classes(prepared, raw, tmp_path, caplog):
    # raw at scale 0.02: 24 bkl and 24 mel at B (the synthetic floor 3M); prepared like a user's files,
    # without enforce_heldout_min: 7:1:2 as before, valid round(2.4) = 2, test round(4.8) = 5 of each
    m = Manifest.load(prepared)
    assert m.data["config"]["heldout_min_per_class"] == 8 and m.data["config"]["enforce_heldout_min"] is False
    assert [m.counts("B", s) for s in SPLITS] == [(52, 17, 17), (7, 2, 2), (15, 5, 5)]
    assert "site B: valid holds 2 mel image(s), fewer than heldout_min_per_class=8" in "\n".join(m.data["warnings"])
    flagged = {(w.split(":")[0], w.split()[2], w.split()[5]) for w in m.data["warnings"] if "heldout_min" in w}
    # below 8 in valid and test at this scale: every class of every training site (A nv: 4 and 7) but B's
    # 15 nevi in test; OOD has 8 of each
    every = {(f"site {s}", split, c) for s in "ABCD" for split in ("valid", "test") for c in ("nv", "bkl", "mel")}
    assert flagged == every - {("site B", "test", "nv")}
    enforced = prepare_dermoscopy(raw, tmp_path / "p", size=16, sites=("B", "OOD"), enforce_heldout_min=True)
    # test = max(8, round(0.2 n)), valid = max(8, round(0.1 n)): nv 74 -> 15 / 8, bkl and mel 24 -> 8 / 8
    assert [enforced.counts("B", s) for s in SPLITS] == [(51, 8, 8), (8, 8, 8), (15, 8, 8)]
    assert enforced.data["warnings"] == []
    caplog.set_level("WARNING")
    lenient = prepare_dermoscopy(raw, tmp_path / "q", size=16, sites=("B",), heldout_min_per_class=3)
    assert [lenient.counts("B", s) for s in SPLITS] == [(52, 17, 17), (7, 2, 2), (15, 5, 5)]
    assert lenient.data["warnings"] == [
        f"site B: valid holds 2 {c} image(s), fewer than heldout_min_per_class=3: its macro F1 turns on very few images"
        for c in ("bkl", "mel")
    ]
    assert "site B: valid holds 2 mel image(s)" in caplog.text
    no_valid = prepare_dermoscopy(raw, tmp_path / "r", size=16, sites=("B",), split=(0.8, 0, 0.2), heldout_min_per_class=3)
    assert no_valid.counts("B", "valid") == (0, 0, 0) and no_valid.data["warnings"] == []  # unused: no warning


def test_ood_is_test_only(prepared):
    assert len(load_split(prepared, "OOD", "train")) == 0 and len(load_split(prepared, "OOD", "valid")) == 0
    assert class_counts(load_split(prepared, "OOD", "test")) == table_counts(0.02)["OOD"]
    assert Manifest.load(prepared).data["sites"]["OOD"]["split_rule"] == "test_only"


def test_lesion_grouping_keeps_a_lesion_in_one_split(raw, tmp_path):
    m = prepare_dermoscopy(raw, tmp_path / "p", size=16, seed=1, group_by="lesion", sites=("A", "C"))
    for s in ("A", "C"):
        where: dict[str, set[str]] = {}
        images: Counter[str] = Counter()
        for split in SPLITS:
            for lesion in load_split(tmp_path / "p", s, split).lesion_ids:
                where.setdefault(lesion, set()).add(split)
                images[lesion] += 1
        assert max(images.values()) >= 2  # there are lesions photographed several times
        assert all(len(v) == 1 for v in where.values())
    assert m.data["config"]["group_by"] == "lesion"


def test_preparation_is_deterministic_and_seeded(raw, tmp_path, prepared):
    again = prepare_dermoscopy(raw, tmp_path / "p", size=32, seed=0, sites=("A",))
    assert load_split(tmp_path / "p", "A", "test").image_ids == load_split(prepared, "A", "test").image_ids
    other = prepare_dermoscopy(raw, tmp_path / "q", size=32, seed=9, sites=("A",))
    assert load_split(tmp_path / "q", "A", "test").image_ids != load_split(prepared, "A", "test").image_ids
    assert other.config_hash != again.config_hash


def test_author_split_assignment(tmp_path):
    raw = tmp_path / "raw"
    generate_synthetic(raw, scale=0.01, seed=0, image_size=(48, 36), sites=("A", "D"), metadata_dir=AUTHORS_COPY)
    with pytest.raises(ValueError, match="not in the raw data of site A"):
        prepare_dermoscopy(raw, tmp_path / "p", size=16, sites=("A", "D"), author_splits_dir=AUTHORS_COPY)
    m = prepare_dermoscopy(raw, tmp_path / "p", size=16, sites=("A", "D"), author_splits_dir=AUTHORS_COPY, allow_missing=True)
    truth = read_author_splits(AUTHORS_COPY, ["A", "D"])
    for s in ("A", "D"):
        assert m.data["sites"][s]["split_rule"] == "authors"
        for split in SPLITS:
            listed = {r.image_id for r in truth[s][split]}
            assert set(load_split(tmp_path / "p", s, split).image_ids) <= listed


def test_modes_are_converted(raw, tmp_path, caplog):
    root = _copy_raw(raw, tmp_path)
    recs = read_ham10000(root, ["vidir_modern"])["A"]
    Image.open(recs[0].path).convert("L").save(recs[0].path)
    Image.open(recs[1].path).convert("CMYK").save(recs[1].path)
    caplog.set_level("INFO")
    prepare_dermoscopy(root, tmp_path / "p", size=16, sites=("A",))
    assert "converting mode L to RGB" in caplog.text and "converting mode CMYK to RGB" in caplog.text


def test_missing_and_corrupt_images_are_named(raw, tmp_path):
    root = _copy_raw(raw, tmp_path)
    recs = read_ham10000(root, ["rosendahl"])["C"]
    recs[0].path.unlink()
    with pytest.raises(FileNotFoundError, match=r"1 image file\(s\) missing") as e:
        prepare_dermoscopy(root, tmp_path / "p", size=16, sites=("C",))
    assert str(recs[0].path) in str(e.value)
    recs[0].path.write_bytes(b"\xff\xd8\xff\xe0 not a jpeg at all" * 10)
    with pytest.raises(ValueError, match="cannot read image") as e:
        prepare_dermoscopy(root, tmp_path / "p", size=16, sites=("C",))
    assert str(recs[0].path) in str(e.value)
    assert not (tmp_path / "p" / "manifest.json").exists()


def test_load_split_errors_name_the_file(prepared, tmp_path):
    with pytest.raises(FileNotFoundError, match=str(tmp_path / "X" / "train.npz")):
        load_split(tmp_path, "X", "train")
    bad = tmp_path / "A" / "train.npz"
    bad.parent.mkdir()
    bad.write_bytes(b"garbage")
    with pytest.raises(ValueError, match=str(bad)):
        load_split(tmp_path, "A", "train")
    good = np.load(prepared / "A" / "train.npz")
    np.savez(bad, **{**dict(good), "images": good["images"].astype(np.float32)})
    with pytest.raises(ValueError, match=r"'images' must be uint8 \[N,3,S,S\]") as e:
        load_split(tmp_path, "A", "train")
    assert str(bad) in str(e.value)


def test_manifest_records_config_and_counts(prepared, raw):
    data = json.loads((prepared / "manifest.json").read_text())
    assert data["config"]["size"] == 32 and data["config"]["split"] == [0.7, 0.1, 0.2]
    assert data["config"]["synthetic"]["seed"] == 0 and len(data["config_hash"]) == 16
    assert data["sources"]["raw_root"] == str(raw.resolve())
    assert "A" in Manifest.load(prepared).table()


# ---------------------------------------------------------------- cache and CLI


def _ensure(cache: str) -> tuple[str, int]:
    root = ensure_synthetic_federation(cache, scale=0.005, seed=4, raw_size=(48, 36), size=16, workers=1)
    return str(root), (root / "manifest.json").stat().st_ino


def test_concurrent_ensure_builds_once(tmp_path):
    cache = str(tmp_path / "cache")
    with mp.get_context("spawn").Pool(3) as pool:
        results = pool.map(_ensure, [cache] * 3)
    assert len(set(results)) == 1
    assert len(list(Path(cache).glob("derm-synth-*/raw"))) == 1
    assert not list(Path(cache).rglob(".*tmp-*"))
    root = Path(results[0][0])
    assert _ensure(cache) == results[0] and Manifest.load(root).size == 16


# hand-computed: n = round(Table I x 0.08) per class, at least 3M = 24 (plan.table_counts); then
# test = max(M, round(0.2 n)), valid = max(M, round(0.1 n)), train the rest, M = 8
DEFAULT_SPLIT_COUNTS = {
    "A": {"train": (103, 22, 35), "valid": (15, 8, 8), "test": (29, 8, 11)},  # 147, 38, 54
    "B": {"train": (208, 8, 8), "valid": (30, 8, 8), "test": (60, 8, 8)},  # 298, 24, 24
    "C": {"train": (43, 23, 11), "valid": (8, 8, 8), "test": (13, 8, 8)},  # 64, 39, 27
    "D": {"train": (77, 8, 14), "valid": (11, 8, 8), "test": (22, 8, 8)},  # 110, 24, 30
    "OOD": {"train": (0, 0, 0), "valid": (0, 0, 0), "test": (28, 8, 8)},  # 28, 8, 8: test only
}


def test_the_default_jobs_federation_holds_every_class_m_times_in_valid_and_test(tmp_path, monkeypatch):
    monkeypatch.setenv("PRRFL_CACHE", str(tmp_path / "cache"))
    task = DermTask({"image_size": 16, "synthetic_raw_size": [48, 36]})  # default scale, seeds and M; small pixels
    root = task.prepared_root(None)
    m = Manifest.load(root)
    for s, by_split in DEFAULT_SPLIT_COUNTS.items():
        for split, expected in by_split.items():
            assert class_counts(load_split(root, s, split)) == expected == m.counts(s, split), (s, split)
            if split == "test" or (split == "valid" and s != "OOD"):
                assert min(expected) >= HELDOUT_MIN_PER_CLASS
    assert m.data["config"]["enforce_heldout_min"] is True and m.data["warnings"] == []
    train = sum(sum(DEFAULT_SPLIT_COUNTS[s]["train"]) for s in "ABCD")
    assert train == 560  # 586 with the floor of 3 per class alone: 26 training images moved to valid and test


def test_cli_synth_and_prepare(tmp_path, capsys):
    assert cli.main(["synth", "--out", str(tmp_path / "raw"), "--scale", "0.005", "--size", "48x36"]) == 0
    assert (
        cli.main(
            [
                "prepare",
                "--raw",
                str(tmp_path / "raw"),
                "--out",
                str(tmp_path / "p"),
                "--size",
                "16",
                "--group-by",
                "lesion",
                "--enforce-heldout-min",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "vidir_molemax" in out and "train" in out and "= " in out and "fewer than" not in out
    bad_m = ["prepare", "--raw", str(tmp_path / "raw"), "--out", str(tmp_path / "q"), "--heldout-min-per-class", "0"]
    assert cli.main(bad_m) == 2
    assert "heldout_min_per_class must be an integer >= 1, got 0" in capsys.readouterr().err
    assert cli.main(["splits", "--dir", str(AUTHORS_COPY)]) == 0
    assert "1282/333/476 = 2091" in capsys.readouterr().out


# ---------------------------------------------------------------- the raw layout as docs/derm_data.md writes it

DOC = DocLayout.read("derm_data.md", "derm")


def _write_csv(path: Path, columns: tuple[str, ...], rows: list[dict[str, str]]) -> None:
    """`rows` under the documented header: every documented column, in the documented order."""
    unknown = [c for c in columns if c not in rows[0]]
    assert not unknown, f"{DOC.doc} documents column(s) {unknown} of {path.name}, which this test gives no value"
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(columns), extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)


def _tiny_jpeg(path: Path, seed: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    pixels = np.random.default_rng(seed).integers(0, 255, (6, 8, 3), dtype=np.uint8)
    Image.fromarray(pixels).save(path, quality=90)


def build_documented_layout(tmp_path: Path) -> dict[str, Path]:
    """docs/derm_data.md's raw layout with tiny images, built as the page writes it: its roots, file names and CSV
    columns. HAM10000: 3 images per class at A, B and C, 2 at OOD, and a bcc row the reader drops; ISIC 2017: 3 per
    class, and a row msk_image_ids.txt does not list. Root name -> folder."""
    text = DOC.doc.read_text()
    roots = {root.parts[0]: tmp_path / f"root{i}" for i, root in enumerate(DOC.roots)}
    ham_csv, isic_csv = DOC.csv("dataset"), DOC.csv("melanoma")
    ham_images, isic_images = (
        DOC.one(lambda e, table=table: e.parts[0] == table.parts[0] and e.name == "<image_id>.jpg", f"the images beside {table.name}")
        for table in (ham_csv, isic_csv)
    )
    msk = DOC.one(lambda e: "one image_id a line" in e.note, "the MSK id list")

    ham: list[dict[str, str]] = []
    for site_name in ("A", "B", "C", "OOD"):
        cohort = SITES[site_name].cohort
        assert f"`{cohort}`" in text, f"{DOC.doc} does not name the `dataset` value {cohort!r} of cohort {site_name}"
        for dx in (*CLASS_NAMES, "bcc") if site_name == "A" else CLASS_NAMES:
            for _ in range(1 if dx == "bcc" else 2 if site_name == "OOD" else 3):
                n = len(ham)
                ham.append(
                    {
                        **{"lesion_id": f"HAM_{n:07d}", "image_id": f"ISIC_{n:07d}", "dx": dx, "dataset": cohort},
                        **{"dx_type": "histo", "age": "45.0", "sex": "female", "localization": "back"},
                    }
                )
    isic = []
    for dx in (*CLASS_NAMES, "nv"):  # the last one is not listed in msk_image_ids.txt
        for _ in range(1 if len(isic) == 9 else 3):
            flags = {"melanoma": f"{float(dx == 'mel'):.1f}", "seborrheic_keratosis": f"{float(dx == 'bkl'):.1f}"}
            isic.append({"image_id": f"ISIC_{100 + len(isic):07d}", **flags})
    _write_csv(ham_csv.path(roots), ham_csv.columns, ham)
    _write_csv(isic_csv.path(roots), isic_csv.columns, isic)
    for images, rows in ((ham_images, ham), (isic_images, isic)):
        for i, row in enumerate(rows):
            _tiny_jpeg(images.path(roots, image_id=row["image_id"]), i)
    msk.path(roots).write_text("".join(f"{row['image_id']}\n" for row in isic[:9]))
    return roots


def _documented(command: str, roots: dict[str, Path], **more: Path) -> list[str]:
    """A command of the page with its placeholders (the roots, `<prepared>`) replaced by this test's folders."""
    for name, folder in {**roots, **{f"<{k}>": v for k, v in more.items()}}.items():
        command = command.replace(name, str(folder))
    return shlex.split(command)


def test_the_documented_raw_layout_is_read_and_prepared(tmp_path, capsys):
    """docs/derm_data.md's layout, built from the page, prepared by the page's command and by each site's command of
    its table "What each site needs on its machine"."""
    roots = build_documented_layout(tmp_path / "raw")
    text = DOC.doc.read_text()
    whole = re.findall(r"python -m prrfl\.tasks\.derm (prepare --raw .*)", text)
    assert len(whole) == 1, f"{DOC.doc}: expected one full prepare command"
    assert cli.main([*_documented(whole[0], roots, prepared=tmp_path / "all"), "--size", "16"]) == 0, capsys.readouterr().err
    m = Manifest.load(tmp_path / "all")
    assert {s: m.counts(s, split) for s in "ABCD" for split in SPLITS} == {s: (1, 1, 1) for s in "ABCD" for _ in SPLITS}
    assert m.counts("OOD", "test") == (2, 2, 2) and m.counts("OOD", "train") == (0, 0, 0)
    d_ids = {i for split in SPLITS for i in load_split(tmp_path / "all", "D", split).image_ids}
    assert len(d_ids) == 9 and "ISIC_0000109" not in d_ids  # the row msk_image_ids.txt does not list is skipped

    table = re.findall(r"^\| (\w+) \(site-\d\) \|[^\n]*\| `(--raw [^`]*)` \| `<prepared>/\{?([\w,]+)\}?/` \|$", text, re.M)
    assert [row[0] for row in table] == ["A", "B", "C", "D"], f"{DOC.doc}: the table of what each site needs"
    for site_name, arguments, folders in table:
        out = tmp_path / f"site-{site_name}"
        assert cli.main(["prepare", *_documented(arguments, roots), "--out", str(out), "--size", "16"]) == 0, capsys.readouterr().err
        assert sorted(Manifest.load(out).data["sites"]) == sorted(folders.split(",")) == sorted(p.name for p in out.iterdir() if p.is_dir())
