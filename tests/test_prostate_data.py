"""Prostate data layer: raw reader and its refusals, patient-level split, preparation, prepared splits,
synthetic generator (determinism, geometry, Table I, site shifts, anatomy), cache, command line."""

from __future__ import annotations

import dataclasses
import gzip
import json
import shutil
from pathlib import Path

import nibabel as nib
import numpy as np
import pytest
import torch
from doc_layouts import DocLayout

from prrfl.tasks.prostate import __main__ as cli
from prrfl.tasks.prostate import cache as cache_mod
from prrfl.tasks.prostate.anatomy import Grid, gland_occupancy, sample_anatomy
from prrfl.tasks.prostate.cache import ensure_synthetic_prostate
from prrfl.tasks.prostate.layout import SITE_NAMES, SITES, SPLITS, TABLE_SITES
from prrfl.tasks.prostate.prepare import ProstateManifest, prepare_prostate
from prrfl.tasks.prostate.reader import (
    CaseFiles,
    ProstateDataError,
    from_display,
    list_cases,
    list_sites,
    load_case,
    to_display,
)
from prrfl.tasks.prostate.scanner import SCANNER_PROFILES, acquire, b1_shading, receive_field
from prrfl.tasks.prostate.splitting import patient_split
from prrfl.tasks.prostate.store import load_split, split_path
from prrfl.tasks.prostate.synthetic import (
    case_counts,
    generate_synthetic_prostate,
    plan_case,
    stored_layout,
    synthesize_case,
)

SHAPE = (32, 32, 6)  # X, Y, Z of the hand-written volumes
SPACING = (0.6, 0.6, 3.5)


# ---------------------------------------------------------------------------------------------- helpers


def _affine(spacing=SPACING, flip_xy=False) -> np.ndarray:
    """RAS affine with this spacing; flip_xy: the LPS voxel order (axes 0 and 1 reversed)."""
    sx, sy, sz = spacing
    if flip_xy:  # voxel 0 is the RAS volume's last voxel along x and y: same world positions
        x0, y0 = -10.0 + (SHAPE[0] - 1) * sx, -12.0 + (SHAPE[1] - 1) * sy
        return np.array([[-sx, 0, 0, x0], [0, -sy, 0, y0], [0, 0, sz, -8.0], [0, 0, 0, 1]])
    return np.array([[sx, 0, 0, -10.0], [0, sy, 0, -12.0], [0, 0, sz, -8.0], [0, 0, 0, 1]])


def _volume(seed: int, shape=SHAPE) -> tuple[np.ndarray, np.ndarray]:
    """(int16 image, uint8 mask): a bright ellipsoid 'gland' on a noisy background, mask = the ellipsoid."""
    rng = np.random.default_rng(seed)
    x, y, z = np.meshgrid(*(np.arange(n) for n in shape), indexing="ij")
    cx, cy = shape[0] / 2 + rng.uniform(-3, 3), shape[1] / 2 + rng.uniform(-3, 3)
    inside = ((x - cx) / 7) ** 2 + ((y - cy) / 5) ** 2 + ((z - shape[2] / 2 + 0.5) / 2.2) ** 2 < 1
    image = rng.normal(200, 20, shape) + 3 * x + np.where(inside, 400, 0) + 50 * seed
    return np.clip(image, 0, None).astype(np.int16), inside.astype(np.uint8)


def _save(path: Path, array: np.ndarray, affine: np.ndarray | None = None) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    nib.save(nib.Nifti1Image(array, _affine() if affine is None else affine), str(path))
    return path


def _write_case_files(image_path: Path, mask_path: Path, seed: int, flip_xy: bool = False) -> None:
    image, mask = _volume(seed)
    affine = _affine(flip_xy=flip_xy)
    if flip_xy:  # the same anatomy stored in LPS voxel order
        image, mask = image[::-1, ::-1], mask[::-1, ::-1]
    _save(image_path, np.ascontiguousarray(image), affine)
    _save(mask_path, np.ascontiguousarray(mask), affine)


def _write_case(folder: Path, case_id: str, seed: int, tag: str = "_segmentation", flip_xy: bool = False) -> None:
    _write_case_files(folder / f"{case_id}.nii.gz", folder / f"{case_id}{tag}.nii.gz", seed, flip_xy)


# The raw layout as docs/prostate_data.md writes it: the hand-written layouts are built from its block.
DOC = DocLayout.read("prostate_data.md", "prostate")
DOC_SITE = DOC.one(lambda e: e.is_dir and e.depth == 1, "the site folder")
DOC_IMAGE = DOC.one(lambda e: not e.is_dir and "T2 volume" in e.note, "the case's volume")
DOC_MASK = DOC.one(lambda e: not e.is_dir and "mask" in e.note, "the case's mask")


def _tiny_layout(root: Path, sites=TABLE_SITES, cases: int = 3) -> Path:
    """docs/prostate_data.md's raw layout, built from its block: `cases` cases per site, RUNMC's masks in the
    block's other spelling (the capitalised tag), BMC's voxels in LPS order."""
    assert DOC_MASK.alternative, f"{DOC.doc}: the mask's other spelling, '(or ...)', is not in the layout block"
    roots = {DOC.roots[0].parts[0]: root}
    for k, s in enumerate(sites):
        assert s in DOC_SITE.note, f"{DOC.doc}: the layout block does not name the site folder {s}"
        for i in range(cases):
            names = {"site": s, "case": f"Case{i:02d}"}
            mask = DOC_MASK.path(roots, name=DOC_MASK.alternative if s == "RUNMC" else None, **names)
            _write_case_files(DOC_IMAGE.path(roots, **names), mask, seed=10 * k + i, flip_xy=(s == "BMC"))
    return root


@pytest.fixture(scope="module")
def layout(tmp_path_factory) -> Path:
    return _tiny_layout(tmp_path_factory.mktemp("prostate") / "raw")


@pytest.fixture(scope="module")
def prepared(layout, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("prostate") / "prepared"
    prepare_prostate(layout, out, size=32, seed=0)
    return out


@pytest.fixture(scope="module")
def synth(tmp_path_factory) -> tuple[Path, dict]:
    out = tmp_path_factory.mktemp("synth") / "raw"
    info = generate_synthetic_prostate(out, scale=0.1, seed=3, max_matrix=32)
    return out, info


# ---------------------------------------------------------------------------------------------- reader


def test_reader_pairs_both_mask_spellings_in_natural_order(tmp_path):
    site = tmp_path / "RUNMC"
    _write_case(site, "Case10", 1, tag="_Segmentation")
    _write_case(site, "Case2", 2, tag="_segmentation")
    (site / "notes.txt").write_text("not a volume")
    (site / ".DS_Store").write_bytes(b"\0")
    cases = list_cases(tmp_path, "RUNMC")
    assert [c.case_id for c in cases] == ["Case2", "Case10"]
    assert cases[0].mask.name == "Case2_segmentation.nii.gz"
    assert cases[1].mask.name == "Case10_Segmentation.nii.gz"
    case = load_case(cases[1])
    image, mask = _volume(1)
    assert case.image.dtype == np.float32 and case.mask.dtype == np.uint8
    np.testing.assert_array_equal(case.image, image.astype(np.float32))
    np.testing.assert_array_equal(case.mask, mask)
    assert case.spacing == pytest.approx(SPACING)
    assert case.prostate_share == pytest.approx(mask.mean())


def test_reader_reorients_every_voxel_order_to_ras(tmp_path):
    _write_case(tmp_path / "RUNMC", "Case00", 5)
    _write_case(tmp_path / "BMC", "Case00", 5, flip_xy=True)  # same anatomy, LPS order
    ras = load_case(list_cases(tmp_path, "RUNMC")[0])
    lps = load_case(list_cases(tmp_path, "BMC")[0])
    np.testing.assert_array_equal(ras.image, lps.image)
    np.testing.assert_array_equal(ras.mask, lps.mask)
    assert np.all(np.diag(lps.affine)[:3] > 0) and lps.spacing == pytest.approx(SPACING)
    np.testing.assert_allclose(lps.affine, ras.affine, atol=1e-6)
    stack = to_display(ras.image)
    assert stack.shape == (SHAPE[2], SHAPE[1], SHAPE[0])  # slices, rows (A->P), columns (R->L)
    assert stack[0, 0, 0] == ras.image[-1, -1, 0]  # top left of slice 0: most anterior, patient's right
    np.testing.assert_array_equal(from_display(stack), ras.image)


def test_sites_default_to_table_i_plus_i2cvb_when_present(layout, tmp_path):
    assert list(list_sites(layout)) == list(TABLE_SITES)
    root = _tiny_layout(tmp_path / "raw", sites=(*TABLE_SITES, "I2CVB"), cases=1)
    assert list(list_sites(root)) == [*TABLE_SITES, "I2CVB"]
    assert list(list_sites(root, ["HK", "I2CVB"])) == ["HK", "I2CVB"]
    with pytest.raises(ValueError, match="unknown prostate site 'XYZ'"):
        list_sites(root, ["XYZ"])


def _bad(tmp_path: Path, kind: str) -> tuple[Path, Path | None, str]:
    """Build one broken site folder; returns (raw root, file to load or None to list only, expected words)."""
    site = tmp_path / "HK"
    site.mkdir(parents=True)
    image, mask = _volume(0)
    img, seg = site / "Case00.nii.gz", site / "Case00_segmentation.nii.gz"
    # an image and a mask that read but break a rule: (image, mask, the file to load, expected words)
    volumes = {
        "shape": (image, mask[:, :, :5], seg, "same voxel grid"),
        "labels": (image, (mask * 2).astype(np.uint8), seg, "labels 0 and 1"),
        "empty_mask": (image, np.zeros_like(mask), seg, "no prostate voxel"),
        "4d": (np.stack([image, image], axis=-1), mask, img, "3-D"),
        "2d": (image[:, :, 0], mask, img, "3-D"),
        "nan": (np.where(mask > 0, np.nan, image).astype(np.float32), mask, img, "non-finite"),
    }
    if kind in volumes:
        volume, labels, target, words = volumes[kind]
        _save(img, volume)
        _save(seg, labels)
        return tmp_path, target, words
    if kind == "corrupt":
        img.write_bytes(b"this is not a NIfTI file at all")
        _save(seg, mask)
        return tmp_path, img, "cannot read image"
    if kind == "truncated":
        _save(img, image)
        data = gzip.decompress(img.read_bytes())
        img.write_bytes(gzip.compress(data[: len(data) // 3]))
        _save(seg, mask)
        return tmp_path, img, "cannot read the voxels of image"
    if kind == "orientation":
        _save(img, image)
        _save(seg, mask, _affine(flip_xy=True))
        return tmp_path, seg, "oriented"
    # names that do not pair: (files written, expected words), listing only
    names = {
        "no_mask": ({"Case01.nii.gz": image}, "Case01.nii.gz: image without mask"),
        "no_image": ({"Case01_Segmentation.nii.gz": mask}, "Case01_Segmentation.nii.gz: mask without image"),
        "tag": ({"Case00.nii.gz": image, "Case00_SEGMENTATION.nii.gz": mask}, "Case00_SEGMENTATION.nii.gz: mask file name not recognised"),
        "two_masks": ({"Case00.nii.gz": image, "Case00_segmentation.nii.gz": mask, "Case00_Segmentation.nii.gz": mask}, "two mask files"),
    }
    if kind == "empty_site":
        (site / "readme.txt").write_text("nothing here")
        return tmp_path, None, f"{site} holds no case"
    if kind == "missing_site":
        shutil.rmtree(site)
        return tmp_path, None, f"{site} is missing"
    files, words = names[kind]  # KeyError: a kind this helper does not build
    for name, volume in files.items():
        _save(site / name, volume)
    return tmp_path, None, words


LOAD_ERRORS = ["corrupt", "truncated", "shape", "labels", "empty_mask", "4d", "2d", "nan", "orientation"]
LIST_ERRORS = ["no_mask", "no_image", "tag", "two_masks", "empty_site", "missing_site"]


@pytest.mark.parametrize("kind", LOAD_ERRORS)
def test_bad_volumes_are_refused_naming_the_file(tmp_path, kind):
    root, path, words = _bad(tmp_path, kind)
    files = list_cases(root, "HK")
    assert len(files) == 1
    with pytest.raises(ProstateDataError) as e:
        load_case(files[0])
    assert str(path) in str(e.value) and words in str(e.value)
    assert isinstance(e.value, ValueError)


@pytest.mark.parametrize("kind", LIST_ERRORS)
def test_bad_layouts_are_refused_naming_the_file(tmp_path, kind):
    root, _, words = _bad(tmp_path, kind)
    with pytest.raises(ProstateDataError) as e:
        list_cases(root, "HK")
    assert words in str(e.value)


def test_a_bad_case_stops_preparation_before_anything_is_published(layout, tmp_path):
    raw = tmp_path / "raw"
    shutil.copytree(layout, raw)
    mask = raw / "UCL" / "Case01_segmentation.nii.gz"
    _save(mask, np.full(SHAPE, 3, np.uint8))
    with pytest.raises(ProstateDataError, match=str(mask)):
        prepare_prostate(raw, tmp_path / "out", size=16)
    assert not (tmp_path / "out" / "manifest.json").exists()


# ---------------------------------------------------------------------------------------------- split


def test_patient_split_partitions_cases_deterministically():
    ids = [f"Case{i:02d}" for i in range(30)]
    a = patient_split(ids, (0.7, 0.1, 0.2), seed=0, site_name="RUNMC")
    assert [len(a[s]) for s in SPLITS] == [21, 3, 6]
    assert sorted(sum(a.values(), [])) == ids  # a partition: every case once
    assert a == patient_split(list(reversed(ids)), (0.7, 0.1, 0.2), seed=0, site_name="RUNMC")
    assert a != patient_split(ids, (0.7, 0.1, 0.2), seed=1, site_name="RUNMC")
    assert a != patient_split(ids, (0.7, 0.1, 0.2), seed=0, site_name="BMC")  # per-site stream
    # valid gets 2 cases wherever train keeps 3 (12, 13: Table I's BIDMC/HK and UCL; 6, 8); not at 4 or 5
    for n, expected in ((12, [8, 2, 2]), (13, [8, 2, 3]), (8, [4, 2, 2]), (6, [3, 2, 1]), (5, [3, 1, 1]), (3, [1, 1, 1]), (4, [2, 1, 1])):
        got = patient_split([f"C{i}" for i in range(n)], (0.7, 0.1, 0.2), 5, "HK")
        assert [len(got[s]) for s in SPLITS] == expected
    for n, expected in ((12, [9, 1, 2]), (13, [9, 1, 3])):  # min_valid=1: the plain rounding
        got = patient_split([f"C{i}" for i in range(n)], (0.7, 0.1, 0.2), 5, "HK", min_valid=1)
        assert [len(got[s]) for s in SPLITS] == expected
    assert patient_split(ids, (0.7, 0.1, 0.2), 0, "RUNMC", min_valid=1) == a  # 30 cases: 3 >= 2 already
    with pytest.raises(ValueError, match="min_valid"):
        patient_split(ids, (0.7, 0.1, 0.2), 0, "HK", min_valid=0)
    no_valid = patient_split(["a", "b"], (0.5, 0.0, 0.5), 0, "UCL")
    assert [len(no_valid[s]) for s in SPLITS] == [1, 0, 1]
    with pytest.raises(ValueError, match="site BIDMC has 2 case"):
        patient_split(["a", "b"], (0.7, 0.1, 0.2), 0, "BIDMC")
    with pytest.raises(ValueError, match="split fractions"):
        patient_split(ids, (0.7, 0.2, 0.2), 0, "HK")


# ---------------------------------------------------------------------------------------------- prepare


def test_prepared_files_shapes_dtypes_ranges_and_manifest(layout, prepared):
    m = ProstateManifest.load(prepared)
    assert m.sites == list(TABLE_SITES) and m.size == 32
    assert m.data["config"]["split"] == [0.7, 0.1, 0.2] and m.data["config"]["seed"] == 0
    for s in TABLE_SITES:
        seen: set[str] = set()
        info = m.data["sites"][s]
        assert info["table_prostate_share"] == SITES[s].prostate_share
        for sp in SPLITS:
            data = load_split(prepared, s, sp)
            assert data.images.dtype == torch.uint8 and data.images.shape[1:] == (1, 32, 32)
            assert data.masks.dtype == torch.uint8 and data.masks.shape == (len(data), 32, 32)
            assert set(torch.unique(data.masks).tolist()) == {0, 1}
            assert int(data.images.max()) == 255 and int(data.images.min()) == 0
            assert len(data) == SHAPE[2] * len(m.cases(s, sp)) == m.slices(s, sp)  # every slice kept
            assert set(data.cases) == set(m.cases(s, sp)) and not seen & set(data.cases)
            seen |= set(data.cases)
            split_info = info["splits"][sp]
            assert split_info["foreground_pixels"] == int(data.masks.sum())
            assert split_info["foreground_pixels"] + split_info["background_pixels"] == len(data) * 32 * 32
        assert len(seen) == 3
    assert "RUNMC" in m.table() and "2." in m.table()


def test_slices_regroup_into_the_original_volumes(layout, prepared):
    m = ProstateManifest.load(prepared)
    for s in ("RUNMC", "BMC"):  # BMC is stored in LPS order: same display after reorientation
        k = TABLE_SITES.index(s)
        data = load_split(prepared, s, "train")
        rows = data.volume_rows()
        for case_id in m.cases(s, "train"):
            images, masks = data.volume(case_id)
            assert data.slice_index[rows[case_id]].tolist() == list(range(SHAPE[2]))
            image, mask = _volume(10 * k + int(case_id[4:]))
            np.testing.assert_array_equal(masks.numpy(), to_display(mask))  # size 32 = raw: exact
            lo, hi = np.percentile(image, [0.5, 99.5])
            expected = np.rint(np.clip((to_display(image.astype(np.float32)) - lo) / (hi - lo), 0, 1) * 255)
            assert np.abs(images[:, 0].numpy().astype(float) - expected).max() <= 1


def test_resize_size_is_configurable(layout, tmp_path):
    for size in (16, 48):
        prepare_prostate(layout, tmp_path / str(size), size=size, sites=["HK"], split=(0.34, 0.33, 0.33))
        data = load_split(tmp_path / str(size), "HK", "test")
        assert data.images.shape[1:] == (1, size, size) and data.masks.shape[1:] == (size, size)
        share = float(data.masks.float().mean())
        assert share == pytest.approx(float(np.mean([_volume(40 + i)[1].mean() for i in range(3)])), rel=0.5)
    with pytest.raises(ValueError, match="size must be an integer >= 8"):
        prepare_prostate(layout, tmp_path / "bad", size=4)


def test_load_split_refuses_bad_files_naming_them(prepared, tmp_path):
    root = tmp_path / "p"
    shutil.copytree(prepared, root)
    path = split_path(root, "HK", "train")
    with pytest.raises(FileNotFoundError, match="prepare"):
        load_split(root, "UCL_missing", "train")
    with np.load(path) as z:
        good = {k: z[k] for k in z.files}
    cases = [
        ({**good, "masks": good["masks"] * 2}, "0 and 1 only"),
        ({k: v for k, v in good.items() if k != "slice_index"}, "missing array"),
        ({**good, "slice_index": np.zeros_like(good["slice_index"])}, "numbered 0.."),
        ({**good, "images": good["images"][:, 0]}, "uint8 \\[N,1,S,S\\]"),
    ]
    for arrays, words in cases:
        np.savez(path, **arrays)
        with pytest.raises(ValueError, match=words) as e:
            load_split(root, "HK", "train")
        assert str(path) in str(e.value)
    path.write_bytes(b"garbage")
    with pytest.raises(ValueError, match=f"cannot read prepared split {path}"):
        load_split(root, "HK", "train")


# ---------------------------------------------------------------------------------------------- synthetic


def test_case_counts_follow_the_scale():
    assert (
        case_counts(1.0)
        == {s: SITES[s].cases for s in TABLE_SITES}
        == {
            "RUNMC": 30,
            "BMC": 30,
            "UCL": 13,
            "BIDMC": 12,
            "HK": 12,
        }
    )
    assert case_counts(0.5) == {"RUNMC": 15, "BMC": 15, "UCL": 7, "BIDMC": 6, "HK": 6}
    assert case_counts(0.01) == {s: 3 for s in TABLE_SITES}
    assert case_counts(1.0, ["I2CVB"]) == {"I2CVB": 19}
    with pytest.raises(ValueError, match="scale"):
        case_counts(0)


def test_synthetic_layout_is_read_by_the_real_reader(synth):
    raw, info = synth
    assert info["counts"] == case_counts(0.1) == {s: 3 for s in TABLE_SITES}
    assert not [p for p in raw.parent.iterdir() if p.name.startswith(".")]  # no temp folder left
    listing = list_sites(raw)
    assert {s: len(v) for s, v in listing.items()} == info["counts"]
    for s, files in listing.items():
        tag = SCANNER_PROFILES[s].mask_tag
        assert all(f.mask.name == f"{f.case_id}{tag}.nii.gz" for f in files)
    assert {SCANNER_PROFILES[s].mask_tag for s in TABLE_SITES} == {"_segmentation", "_Segmentation"}
    for s in TABLE_SITES:
        row = info["cases"][s][0]
        img = nib.load(str(raw / s / "Case00.nii.gz"))
        assert img.get_data_dtype() == np.int16 and img.header.get_xyzt_units()[0] == "mm"
        assert img.header.get_zooms() == pytest.approx(row["spacing"], abs=1e-4)
        prof = SCANNER_PROFILES[s]
        assert prof.thickness[0] <= row["thickness"] <= prof.thickness[1]
        assert nib.aff2axcodes(img.affine) == (("L", "P", "S") if prof.orientation == "LPS" else ("R", "A", "S"))
        case = load_case(listing[s][0])
        assert case.shape == (row["matrix"], row["matrix"], row["slices"])
        assert case.spacing == pytest.approx(row["spacing"], abs=1e-4)
        np.testing.assert_array_equal(to_display(case.mask), synthesize_case(plan_case(s, 0, 3, max_matrix=32)).mask)


# MS-Net (Liu et al., IEEE TMI 2020), Table I: field strengths (T), endorectal coil, in-plane pixel and slice thickness (mm)
TABLE_I_PROTOCOLS = {
    "RUNMC": ({3.0}, False, (0.6, 0.625), (3.6, 4.0), "Siemens"),
    "BMC": ({1.5}, True, (0.4, 0.4), (3.0, 3.0), "Philips"),
    "UCL": ({1.5, 3.0}, False, (0.325, 0.625), (3.0, 3.6), "Siemens"),
    "BIDMC": ({3.0}, True, (0.25, 0.25), (2.2, 3.0), "GE"),
    "HK": ({1.5}, True, (0.625, 0.625), (3.6, 3.6), "Siemens"),
    "I2CVB": ({3.0}, False, (0.67, 0.79), (1.25, 1.25), "Siemens"),
}


def test_full_size_geometry_follows_the_table_i_protocols():
    for s, (fields, erc, pixel, thick, vendor) in TABLE_I_PROTOCOLS.items():
        prof = SCANNER_PROFILES[s]
        assert prof.endorectal is erc and set(prof.field_t) == fields and prof.vendor == vendor == SITES[s].vendor
        assert pixel[0] <= prof.pixel[0] <= prof.pixel[1] <= pixel[1] and thick[0] <= prof.thickness[0] <= prof.thickness[1] <= thick[1]
        seen = set()
        for i in range(12):
            plan = plan_case(s, i, 0)
            assert plan.matrix == plan.native_matrix and plan.matrix in prof.matrices and 256 <= plan.matrix <= 512
            assert pixel[0] - 1e-9 <= plan.spacing[0] == plan.native_pixel <= pixel[1] + 1e-9, (s, plan.spacing)
            assert thick[0] <= plan.thickness <= thick[1] and plan.fov == pytest.approx(plan.matrix * plan.spacing[0])
            assert 120 <= plan.fov <= 210  # a small field of view centred on the prostate
            assert plan.endorectal is erc and 15 <= plan.slices <= 70
            seen.add(plan.field_t)
        assert seen == fields  # UCL: both field strengths occur
        assert plan_case(s, 0, 0, matrix_scale=0.5).matrix == round(plan_case(s, 0, 0).matrix * 0.5)
        small = plan_case(s, 0, 0, max_matrix=100)
        assert small.fov == plan_case(s, 0, 0).fov and small.native_pixel == plan_case(s, 0, 0).native_pixel  # the field of view stays
    assert {s for s, p in SCANNER_PROFILES.items() if p.endorectal} == {"BMC", "BIDMC", "HK"}


def test_synthetic_json_records_the_protocol_of_every_case(synth):
    _, info = synth
    for s, rows in info["cases"].items():
        fields, erc, pixel, thick, vendor = TABLE_I_PROTOCOLS[s]
        for row in rows:
            assert pixel[0] - 1e-4 <= row["native_pixel"] <= pixel[1] + 1e-4 and thick[0] <= row["thickness"] <= thick[1]
            assert row["field_t"] in fields and row["endorectal"] is erc and row["vendor"] == vendor
            assert row["spacing"][0] == pytest.approx(row["fov"] / row["matrix"], abs=1e-4)  # small matrix: larger pixels
            assert row["rectal_content"] == "balloon" if erc else row["rectal_content"] != "balloon"
            assert 0 <= row["bladder_filling"] <= 1
    assert info["protocols"]["BIDMC"]["endorectal"] and info["protocols"]["UCL"]["field_t"] == [1.5, 3.0]


def test_synthetic_generation_is_deterministic(synth, tmp_path):
    """Same seed, same bytes (also when cases render in worker processes); another seed, other data."""
    raw, _ = synth
    again = tmp_path / "again"
    generate_synthetic_prostate(again, scale=0.1, seed=3, max_matrix=32, sites=["RUNMC", "BIDMC"], workers=2)
    for s in ("RUNMC", "BIDMC"):
        for f in sorted((raw / s).iterdir()):
            assert (again / s / f.name).read_bytes() == f.read_bytes(), f
    a, b = (synthesize_case(plan_case("RUNMC", 0, 3, max_matrix=32)) for _ in range(2))
    np.testing.assert_array_equal(a.image, b.image)
    np.testing.assert_array_equal(a.mask, b.mask)
    for other in (plan_case("RUNMC", 0, 4, max_matrix=32), plan_case("RUNMC", 1, 3, max_matrix=32)):
        c = synthesize_case(other)
        assert c.image.shape != a.image.shape or not np.array_equal(c.image, a.image)
    differs = tmp_path / "seed4"
    generate_synthetic_prostate(differs, scale=0.1, seed=4, max_matrix=32, sites=["RUNMC"])
    assert (differs / "RUNMC" / "Case00.nii.gz").read_bytes() != (raw / "RUNMC" / "Case00.nii.gz").read_bytes()
    with pytest.raises(FileExistsError):
        generate_synthetic_prostate(again, scale=0.1, seed=3, max_matrix=32, sites=["RUNMC"])


def _cases(site: str, n: int = 6, matrix: int = 40):
    return [synthesize_case(plan_case(site, i, 0, max_matrix=matrix)) for i in range(n)]


@pytest.fixture(scope="module")
def site_cases() -> dict:
    return {s: _cases(s) for s in TABLE_SITES}


def test_prostate_voxel_share_follows_table_i(site_cases):
    for s, cases in site_cases.items():
        share = float(np.mean([c.mask.mean() for c in cases]))
        target = SITES[s].prostate_share
        assert target / 1.3 < share < target * 1.3, (s, share, target)
    ordered = sorted(TABLE_SITES, key=lambda s: np.mean([c.mask.mean() for c in site_cases[s]]))
    assert ordered[-1] == "RUNMC" and ordered[0] in ("HK", "UCL")  # largest and smallest V_P as in Table I


def test_scanner_shift_between_sites_is_real(site_cases):
    p99 = {s: float(np.mean([np.percentile(c.image, 99) for c in cs])) for s, cs in site_cases.items()}
    assert p99["BMC"] > 1.6 * p99["RUNMC"] and p99["RUNMC"] > 2.5 * p99["HK"]  # stored ranges differ by site
    assert p99["RUNMC"] > 1.4 * p99["UCL"]

    def posterior_over_anterior(c) -> float:  # mean intensity of the posterior over the anterior gland half
        z, y, x = np.nonzero(c.mask)
        cut = np.median(y)
        back, front = y > cut, y < cut
        return float(c.image[z[back], y[back], x[back]].mean() / c.image[z[front], y[front], x[front]].mean())

    ratio = {s: np.mean([posterior_over_anterior(c) for c in cs]) for s, cs in site_cases.items()}
    erc = [s for s in TABLE_SITES if SCANNER_PROFILES[s].endorectal]
    assert erc == ["BMC", "BIDMC", "HK"]
    assert min(ratio[s] for s in erc) > 1.25 * max(v for s, v in ratio.items() if s not in erc)  # endorectal coil flare

    def noise_floor(site: str) -> float:  # Rician floor in air relative to a uniform tissue signal
        plan = plan_case(site, 0, 0, max_matrix=24)
        grid, anat = synthesize_case(plan).grid, sample_anatomy(np.random.default_rng(0), 40.0)
        air = acquire(np.zeros(grid.shape, np.float32), grid, anat, SCANNER_PROFILES[site], np.random.default_rng(1))
        uniform = np.full(grid.shape, 0.5, np.float32)
        tissue = acquire(uniform, grid, anat, SCANNER_PROFILES[site], np.random.default_rng(1))
        return float(air.mean() / np.median(tissue))

    assert noise_floor("HK") > 1.5 * noise_floor("RUNMC")  # a noisier site
    hist = {
        s: np.histogram(
            np.concatenate([(c.image / np.percentile(c.image, 99.5)).ravel() for c in cs]), bins=20, range=(0, 1.2), density=True
        )[0]
        for s, cs in site_cases.items()
    }
    assert np.abs(hist["BMC"] - hist["HK"]).sum() > 1.0  # normalised histograms still differ (gamma, contrast)


def test_synthetic_anatomy_is_laid_out_like_a_pelvis(site_cases):
    for s, cases in site_cases.items():
        for c in cases:
            area = c.mask.sum(axis=(1, 2))
            present = np.flatnonzero(area)
            lo, hi = present[0], present[-1]
            assert 0 < lo and hi < len(area) - 1  # the whole gland is covered, with slices below and above
            assert area.argmax() not in (lo, hi) and area[lo] < area.max() / 2 and area[hi] < area.max() / 2
            assert np.all(area[lo : hi + 1] > 0)  # one gland, no gap
            img = c.image.astype(float)
            above = img[hi + 1 :]
            # bladder (urine) above the gland; with an endorectal coil its flare is the brightest
            assert above.max() > np.percentile(img[: lo + 1], 99.5) or SCANNER_PROFILES[s].endorectal
            mid = (lo + hi) // 2
            body = img[mid] > 0.05 * np.percentile(img, 99)  # above the air's noise (p99: the coil flare at ERC sites)
            assert body.mean() > 0.4  # the body fills much of the field of view


def test_stored_layout_round_trips_through_the_reader(tmp_path):
    case = synthesize_case(plan_case("UCL", 1, 0, max_matrix=24))
    for orientation in ("RAS", "LPS"):
        array, affine = stored_layout(case.image, case.grid, orientation)
        _save(tmp_path / orientation / "UCL" / "Case00.nii.gz", array, affine)
        mask, _ = stored_layout(case.mask, case.grid, orientation)
        _save(tmp_path / orientation / "UCL" / "Case00_segmentation.nii.gz", mask, affine)
        loaded = load_case(
            CaseFiles("UCL", "Case00", *(tmp_path / orientation / "UCL" / n for n in ("Case00.nii.gz", "Case00_segmentation.nii.gz")))
        )
        np.testing.assert_array_equal(to_display(loaded.image), case.image.astype(np.float32))
        np.testing.assert_array_equal(to_display(loaded.mask), case.mask)


# ---------------------------------------------------------------------------------------------- cache, CLI


def test_cache_builds_once_and_reuses(tmp_path, monkeypatch):
    kwargs = dict(scale=0.1, seed=1, size=16, max_matrix=24, sites=["UCL", "HK"])
    first = ensure_synthetic_prostate(tmp_path, **kwargs)
    manifest = ProstateManifest.load(first)
    assert manifest.sites == ["UCL", "HK"] and manifest.size == 16
    assert manifest.data["config"]["synthetic"]["seed"] == 1
    stamp = (first / "manifest.json").stat().st_mtime_ns

    def refuse(*a, **k):
        raise AssertionError("regenerated although cached")

    monkeypatch.setattr(cache_mod, "generate_synthetic_prostate", refuse)
    monkeypatch.setattr(cache_mod, "prepare_prostate", refuse)
    assert ensure_synthetic_prostate(tmp_path, **kwargs) == first
    assert (first / "manifest.json").stat().st_mtime_ns == stamp
    params = json.loads((first.parent / "params.json").read_text())
    assert params["scale"] == 0.1 and params["max_matrix"] == 24
    with pytest.raises(AssertionError, match="regenerated"):
        ensure_synthetic_prostate(tmp_path, **{**kwargs, "seed": 2})  # other parameters: another key


def test_command_line_synth_prepare_preview(tmp_path, capsys):
    raw, out, png = tmp_path / "raw", tmp_path / "out", tmp_path / "png"
    assert cli.main(["synth", "--out", str(raw), "--scale", "0.05", "--matrix", "24", "--sites", "RUNMC", "BIDMC"]) == 0
    assert "RUNMC" in capsys.readouterr().out
    assert cli.main(["prepare", "--raw", str(raw), "--out", str(out), "--size", "16", "--sites", "RUNMC", "BIDMC"]) == 0
    assert "BIDMC" in capsys.readouterr().out and (out / "BIDMC" / "test.npz").is_file()
    pytest.importorskip("matplotlib")
    assert cli.main(["preview", "--raw", str(raw), "--out", str(png), "--cases", "1", "--columns", "3"]) == 0
    pngs = sorted(p.name for p in png.iterdir())
    assert pngs == ["BIDMC.png", "RUNMC.png"]
    assert (png / "RUNMC.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert cli.main(["prepare", "--raw", str(tmp_path / "nowhere"), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("prrfl: error:") and str(tmp_path / "nowhere") in err


# ---------------------------------------------------------------------------------------------- protocols, noise, artefacts


def _scan(site: str, signal=0.0, *, matrix: int = 48, slices: int = 4, seed: int = 1, field_t=None, **changes) -> np.ndarray:
    """Stored voxels of a uniform `signal` (0: air, noise only) through a site's scanner, with the
    intensity scale fixed at 1000 and any profile field replaced by `changes`."""
    prof = dataclasses.replace(SCANNER_PROFILES[site], intensity=(1000.0, 1000.0), **changes)
    plan = plan_case(site, 0, 0, max_matrix=matrix)
    grid = Grid.centred(plan.matrix, plan.fov, slices, plan.thickness, plan.centre)
    anat = sample_anatomy(np.random.default_rng(0), 40.0, endorectal=prof.endorectal)
    values = np.full(grid.shape, signal, np.float32) if np.isscalar(signal) else signal(grid)
    return acquire(values, grid, anat, prof, np.random.default_rng(seed), field_t=field_t).astype(float)


def _neighbour_correlation(image: np.ndarray) -> float:
    """Correlation of each voxel with its in-plane neighbours (rows and columns)."""
    x = image - image.mean()
    return float(((x[:, :, 1:] * x[:, :, :-1]).mean() + (x[:, 1:, :] * x[:, :-1, :]).mean()) / 2 / x.var())


def test_noise_is_spatially_correlated_like_a_reconstructed_image():
    white = _neighbour_correlation(_scan("RUNMC", artefact="none", acquired=1.0, apodisation=0.0))
    assert abs(white) < 0.05  # the full k-space, unfiltered: white noise
    corr = {s: _neighbour_correlation(_scan(s, artefact="none")) for s in SITE_NAMES}
    assert all(v > 0.15 for v in corr.values()), corr  # a partly measured, apodised k-space correlates neighbours
    assert corr["BIDMC"] > corr["RUNMC"] + 0.1  # 512 interpolated from about 300 measured lines


def test_lower_field_is_noisier_and_higher_field_shades_more():
    def air(site, **kw):  # mean Rician (Rayleigh) floor in the air: proportional to the noise sigma
        return float(_scan(site, artefact="none", coil_gain=0.0, **kw).mean())

    assert air("UCL", field_t=1.5) > 1.5 * air("UCL", field_t=3.0)  # one site, both scanners
    same = {s: air(s, noise=0.02, endorectal=False) for s in TABLE_SITES if s != "UCL"}  # equal settings
    assert min(same["BMC"], same["HK"]) > 1.5 * max(same["RUNMC"], same["BIDMC"])  # 1.5 T sites vs 3 T sites
    ucl = [plan_case("UCL", i, 0).field_t for i in range(13)]
    assert set(ucl) == {1.5, 3.0}
    grid = Grid.centred(64, 200.0, 2, 3.0, (0.0, 6.0, 0.0))
    anat = sample_anatomy(np.random.default_rng(0), 40.0)
    shade = {b: b1_shading(grid, anat, b, np.random.default_rng(2)) for b in (1.5, 3.0)}
    assert shade[3.0].std() > 3 * shade[1.5].std() and shade[3.0].min() < 0.9  # dielectric shading at 3 T


def test_endorectal_coil_flare_falls_off_from_the_coil():
    def flare(site):
        prof = SCANNER_PROFILES[site]
        plan = plan_case(site, 0, 0, max_matrix=64)
        grid = Grid.centred(plan.matrix, plan.fov, 3, plan.thickness, (0.0, plan.centre[1], 0.0))
        anat = sample_anatomy(np.random.default_rng(0), 40.0, endorectal=prof.endorectal)
        field = receive_field(grid, anat, prof, np.random.default_rng(0))[1]
        rx, ry, rr, _ = anat.rectum
        col = int(np.argmin(np.abs(grid.xs - rx)))
        at = lambda y: float(field[int(np.argmin(np.abs(grid.ys - y))), col])  # noqa: E731
        return at(ry - rr - 3) / at(ry - rr - 40)  # the rectal wall / 4 cm anterior to it (anterior gland)

    ratios = {s: flare(s) for s in TABLE_SITES}
    assert all(ratios[s] > 2.0 for s in ("BMC", "BIDMC", "HK")), ratios
    assert all(ratios[s] < 1.3 for s in ("RUNMC", "UCL")), ratios


def test_site_artefacts():
    assert {s: p.artefact for s, p in SCANNER_PROFILES.items()} == {
        "RUNMC": "wrap",
        "BMC": "gibbs",
        "UCL": "gfactor",
        "BIDMC": "flare",
        "HK": "ghost",
        "I2CVB": "crosstalk",
    }
    # I2CVB: interleaved thin slices, every other one darker
    cross = _scan("I2CVB", 0.5, slices=6, noise=0.0).mean(axis=(1, 2))
    assert abs(cross[0::2].mean() / cross[1::2].mean() - 1) > 0.03
    # BMC: hard k-space truncation rings at a sharp edge; the apodised default barely does
    step = lambda g: np.broadcast_to(np.where(g.xs < g.xs.mean(), 0.8, 0.1).astype(np.float32), g.shape).copy()  # noqa: E731
    ring = {a: _scan("BMC", step, matrix=96, noise=0.0, coil_gain=0.0, array_bias=0.0, apodisation=a)[1, 48] for a in (0.2, 0.8)}
    overshoot = {a: r.max() / np.median(r[r > r.mean()]) for a, r in ring.items()}
    assert overshoot[0.2] > 1.05 and overshoot[0.2] > overshoot[0.8] + 0.03

    # HK: respiratory ghosts of the anterior abdominal wall along the phase-encode direction (rows)
    def wall(g):
        return np.broadcast_to(np.where(g.ys < g.ys[0] + 25, 0.8, 0.0).astype(np.float32)[:, None], g.shape).copy()

    still = _scan("HK", wall, matrix=64, noise=0.0, coil_gain=0.0, artefact="none")
    moving = _scan("HK", wall, matrix=64, noise=0.0, coil_gain=0.0)
    below = slice(30, 56)  # rows posterior to the moving wall (clear of the periodic edge)
    assert moving[:, below].mean() > 0.02 * moving.max() and still[:, below].mean() < 0.005 * still.max()


def test_bladder_filling_and_rectal_content_vary_per_case():
    anats = [sample_anatomy(np.random.default_rng(i), 40.0) for i in range(60)]
    fill = np.array([a.bladder_filling for a in anats])
    assert fill.min() < 0.2 and fill.max() > 0.8
    dome = np.array([a.bladder[2] + a.bladder[5] - a.semi[2] for a in anats])  # how far above the base it reaches
    front = np.array([-(a.bladder[1] - a.bladder[4]) for a in anats])  # how far anteriorly
    assert np.corrcoef(fill, dome)[0, 1] > 0.8 and np.corrcoef(fill, front)[0, 1] > 0.8
    wall = np.array([a.bladder_wall for a in anats])
    assert wall[fill < 0.3].mean() > wall[fill > 0.7].mean() + 1.0  # an empty bladder's wall is thicker
    contents = [a.rectal_content for a in anats]
    assert set(contents) == {"collapsed", "air", "mixed", "fluid", "stool"}
    radius = {k: np.mean([a.rectum[2] for a in anats if a.rectal_content == k]) for k in set(contents)}
    assert radius["collapsed"] < min(radius["air"], radius["stool"])
    coil = [sample_anatomy(np.random.default_rng(i), 40.0, endorectal=True) for i in range(5)]
    assert {a.rectal_content for a in coil} == {"balloon"} and min(a.rectum[2] for a in coil) > max(radius.values())


def test_gland_edge_softens_towards_apex_and_base_and_with_thick_slices():
    anats = [sample_anatomy(np.random.default_rng(i), 40.0) for i in range(20)]
    assert np.ptp([a.capsule for a in anats]) > 0.5 and np.ptp([a.capsule_mm for a in anats]) > 0.4  # per-case conspicuity

    def partial(an, thickness):  # voxels partly inside the gland over voxels inside, per slice
        c = an.semi[2]
        zs = np.arange(-c, c + 1e-6, thickness)
        xs = np.arange(-40.0, 40.0, 0.5)
        occ, mask = gland_occupancy(an, Grid(xs, xs, zs))
        soft = ((occ > 0) & (occ < 1)).sum(axis=(1, 2)) / np.maximum(mask.sum(axis=(1, 2)), 1)
        t = np.abs(zs) / c
        return soft[(t < 0.3)].mean(), soft[(t > 0.6) & (mask.sum(axis=(1, 2)) > 0)].mean()

    an = anats[0]
    mid, ends = partial(an, 3.6)
    assert ends > 3 * mid and ends > 0.2  # apex and base: a wide partial-volume band
    assert partial(an, 1.25)[1] < 0.6 * ends  # thin slices: less


def test_level_montage_shows_every_site(synth, tmp_path):
    pytest.importorskip("matplotlib")
    from prrfl.tasks.prostate.preview import write_level_montage

    raw, _ = synth
    path = write_level_montage(raw, tmp_path / "mid.png", sites=["BMC", "HK"], cases=2, level="mid-gland", outline=True)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with pytest.raises(ValueError, match="level"):
        write_level_montage(raw, tmp_path / "x.png", level="prostate")


def test_the_site_table_and_the_scanner_profiles_agree_on_the_endorectal_coil():
    from prrfl.tasks.prostate.layout import SITES
    from prrfl.tasks.prostate.scanner import SCANNER_PROFILES

    assert (
        {n for n, s in SITES.items() if s.endorectal_coil}
        == {n for n, p in SCANNER_PROFILES.items() if p.endorectal}
        == {"BMC", "BIDMC", "HK"}
    )


def test_a_site_shift_scales_each_scanners_departure_from_the_average_one():
    from prrfl.tasks.prostate.scanner import SCANNER_PROFILES, shifted

    bmc, runmc = SCANNER_PROFILES["BMC"], SCANNER_PROFILES["RUNMC"]
    assert shifted(bmc, 1.0) is bmc
    # gamma: geometric mean of RUNMC 1.0, BMC 1.25, UCL 0.9, BIDMC 1.1, HK 0.85
    ref = (1.0 * 1.25 * 0.9 * 1.1 * 0.85) ** 0.2
    assert shifted(bmc, 2.0).gamma == pytest.approx(ref * (1.25 / ref) ** 2)
    assert shifted(bmc, 0.0).gamma == pytest.approx(ref) == shifted(runmc, 0.0).gamma
    # the measured k-space fraction is additive: mean of 0.85, 0.58, 0.75, 0.6, 0.8 = 0.716; BMC at 2: 0.716 - 2 * 0.136
    assert shifted(bmc, 2.0).acquired == pytest.approx(0.444)
    # the flare's gain among the coil sites only (BMC 2.6, BIDMC 3.5, HK 3.0); a site without a coil keeps none
    coil_ref = (2.6 * 3.5 * 3.0) ** (1 / 3)
    assert shifted(bmc, 0.0).coil_gain == pytest.approx(coil_ref)
    assert shifted(runmc, 3.0).coil_gain == 0.0
    # the protocol is not scaled
    for field in ("field_t", "endorectal", "protocols", "thickness", "slices", "artefact", "prostate_share"):
        assert getattr(shifted(bmc, 3.0), field) == getattr(bmc, field)
    with pytest.raises(ValueError, match="shift"):
        shifted(bmc, -1.0)


def test_shift_1_renders_the_same_voxels_and_another_shift_other_ones():
    plan = plan_case("BMC", 0, 3, max_matrix=32)
    default = synthesize_case(plan)
    np.testing.assert_array_equal(synthesize_case(plan, 1.0).image, default.image)
    other = synthesize_case(plan, 2.0)
    np.testing.assert_array_equal(other.mask, default.mask)  # the anatomy is the same
    assert not np.array_equal(other.image, default.image)
