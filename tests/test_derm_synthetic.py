"""The synthetic dermoscopy generator: counts, layout, determinism, class signal, site shifts, atomicity."""

from __future__ import annotations

import csv
import json
from collections import Counter, defaultdict
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from prrfl.tasks.derm import lesions, synthetic
from prrfl.tasks.derm.layout import DEFAULT_LAYOUT as L
from prrfl.tasks.derm.layout import SITES
from prrfl.tasks.derm.plan import class_floor, plan_federation, table_counts
from prrfl.tasks.derm.records import read_sites
from prrfl.tasks.derm.splitting import HELDOUT_MIN_PER_CLASS
from prrfl.tasks.derm.synthetic import generate_synthetic, render_synthetic_image

AUTHORS = Path(__file__).parent / "data" / "authors_splits"


@pytest.fixture(scope="module")
def raw(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("synth") / "raw"
    generate_synthetic(out, scale=0.01, seed=3, image_size=(96, 72))
    return out


def test_table_counts_scale_one_is_table_i():
    counts = table_counts(1.0)
    assert counts == {name: s.table for name, s in SITES.items()}
    assert sum(sum(c) for n, c in counts.items() if n != "OOD") == 10490  # docs/authors_code.md §5.2


def test_table_counts_scaled_keep_proportions_and_minimum():
    assert HELDOUT_MIN_PER_CLASS == 8
    assert [class_floor(s) for s in ("A", "B", "C", "D", "OOD")] == [24, 24, 24, 24, 8]  # M per split the site has
    small = table_counts(0.01)
    assert all(min(c) >= class_floor(name) for name, c in small.items())
    half = table_counts(0.5)
    for name, s in SITES.items():
        for got, full in zip(half[name], s.table, strict=True):
            assert got == max(class_floor(name), int(full * 0.5 + 0.5))
    with pytest.raises(ValueError, match="scale"):
        table_counts(0)


def test_table_counts_of_the_default_job():
    # round-half-up(Table I x 0.08), raised to 3M = 24 per class at a training site, M = 8 at the
    # test-only cohort: B 124 x 0.08 = 9.92 -> 10 -> 24 keratoses, 24 x 0.08 = 1.92 -> 2 -> 24
    # melanomas; D 254 x 0.08 = 20.32 -> 20 -> 24 keratoses; OOD 0.8 -> 1 -> 8, 5.36 -> 5 -> 8
    assert table_counts(0.08) == {
        "A": (147, 38, 54),
        "B": (298, 24, 24),
        "C": (64, 39, 27),
        "D": (110, 24, 30),
        "OOD": (28, 8, 8),
    }
    assert table_counts(0.08, heldout_min_per_class=1)["B"] == (298, 10, 3)  # the floor of 3 per class alone
    assert table_counts(1.0, heldout_min_per_class=9)["B"] == (3720, 124, 27)  # M = 9 would no longer be Table I


def test_plan_counts_ids_and_lesion_groups():
    items = plan_federation(0.05, seed=1)
    target = table_counts(0.05)
    per = Counter((i.site, i.dx) for i in items if i.kind != "other" and i.msk)
    for s, counts in target.items():
        assert tuple(per[(s, c)] for c in ("nv", "bkl", "mel")) == counts
    assert len({i.image_id for i in items}) == len(items)
    lesions = defaultdict(list)
    for i in items:
        if i.lesion_id:
            lesions[(i.site, i.lesion_id)].append(i)
    sizes = {s: Counter(len(v) for (site_, _), v in lesions.items() if site_ == s) for s in ("A", "B", "C")}
    assert set(sizes["A"]) >= {1, 2} and max(sizes["A"]) <= 3
    assert set(sizes["B"]) == {1}  # MoleMax: one image per lesion, as in HAM10000
    for views in lesions.values():  # views of one lesion: same lesion, same class, different framing
        assert len({(v.lesion_seed, v.dx) for v in views}) == 1
        assert len({v.image_seed for v in views}) == len(views)
    assert all(i.lesion_id == "" for i in items if i.site == "D")
    assert any(i.kind == "other" for i in items) and any(not i.msk for i in items)


def test_plan_can_borrow_the_authors_metadata():
    items = plan_federation(0.02, seed=0, sites=("A", "D"), metadata_dir=AUTHORS)
    a = [i for i in items if i.site == "A" and i.kind != "other"]
    assert all(i.image_id.startswith("ISIC_00") and i.lesion_id.startswith("HAM_00") and i.age for i in a)
    d = [i for i in items if i.site == "D" and i.msk]
    assert all(i.image_id.startswith("ISIC_00") and i.lesion_id == "" for i in d)


def test_layout_is_written_and_read_by_the_real_loaders(raw):
    assert (raw / L.ham_csv).is_file() and (raw / L.isic_dir / L.isic_csv).is_file()
    assert (raw / L.isic_dir / L.msk_ids).is_file() and (raw / "synthetic.json").is_file()
    info = json.loads((raw / "synthetic.json").read_text())
    assert info["heldout_min_per_class"] == HELDOUT_MIN_PER_CLASS
    assert info["counts"]["B"] == {"nv": 37, "bkl": 24, "mel": 24}  # 3720 x 0.01 = 37.2; 1.24 and 0.24 -> 3M
    assert not [p for p in raw.parent.iterdir() if p.name.startswith(".")]  # no temp folder left
    records = read_sites(raw, list(SITES))
    for s, recs in records.items():
        assert tuple(Counter(r.label for r in recs)[c] for c in range(3)) == table_counts(0.01)[s]
        assert all(r.path.is_file() for r in recs)
    with Image.open(records["A"][0].path) as im:
        assert (im.format, im.size, im.mode) == ("JPEG", (96, 72), "RGB")
    with open(raw / L.isic_dir / L.isic_csv) as f:
        row = next(csv.DictReader(f))
    assert row["melanoma"] in ("0.0", "1.0")


def _pixels(root: Path) -> dict[str, np.ndarray]:
    return {p.name: np.asarray(Image.open(p)) for p in sorted(root.rglob("*.jpg"))}


def test_same_seed_same_files_other_seed_differs(tmp_path):
    kw = dict(scale=0.005, image_size=(64, 48), sites=("A", "D"))
    generate_synthetic(tmp_path / "a", seed=5, **kw)
    generate_synthetic(tmp_path / "b", seed=5, **kw)
    generate_synthetic(tmp_path / "c", seed=6, **kw)
    for name in (L.ham_csv, f"{L.isic_dir}/{L.isic_csv}", f"{L.isic_dir}/{L.msk_ids}", "synthetic.json"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()
    pa, pb, pc = _pixels(tmp_path / "a"), _pixels(tmp_path / "b"), _pixels(tmp_path / "c")
    assert pa.keys() == pb.keys() and all(np.array_equal(pa[k], pb[k]) for k in pa)
    assert (tmp_path / "a" / L.ham_csv).read_bytes() != (tmp_path / "c" / L.ham_csv).read_bytes()
    common = pa.keys() & pc.keys()
    assert all(not np.array_equal(pa[k], pc[k]) for k in common)
    assert not np.array_equal(np.stack(list(pa.values())).mean(0), np.stack(list(pc.values())).mean(0))


def _lesion_stats(a: np.ndarray) -> tuple[float, float, float] | None:
    """(mean luminance of the central disk, chromatic variegation of dark pixels, dark-area fraction)."""
    a = a.astype(float)
    h, w = a.shape[:2]
    lum = a.mean(2)
    frame = np.concatenate([lum[:8].ravel(), lum[-8:].ravel(), lum[:, :8].ravel(), lum[:, -8:].ravel()])
    skin = np.median(frame[frame > 30])  # ignore the black dermoscope ring
    yy, xx = np.mgrid[:h, :w]
    r2 = (yy - h / 2) ** 2 + (xx - w / 2) ** 2
    dark = (lum < 0.8 * skin) & (r2 < (0.45 * h) ** 2)
    centre = lum[r2 < (0.12 * h) ** 2].mean()
    if dark.sum() < 20:
        return centre, float("nan"), dark.mean()
    px = a[dark]
    chroma = px / px.sum(1, keepdims=True)
    return centre, chroma.std(0).sum() * 100, dark.mean()


def _stats_by_class(site: str, n: int = 20, size=(128, 96)) -> dict[str, np.ndarray]:
    items = plan_federation(0.05, seed=11, sites=(site,), distractors=False)
    out = {}
    for kind in ("nv", "bkl", "mel"):
        chosen = [i for i in items if i.kind == kind][:n]
        out[kind] = np.array([_lesion_stats(np.asarray(render_synthetic_image(i, *size))) for i in chosen])
    return out


@pytest.mark.parametrize("site", ["A", "C"])
def test_class_shows_in_colour_and_brightness(site, monkeypatch):
    monkeypatch.setattr(lesions, "AMBIGUITY", 0.0)  # the typical look of each class
    st = _stats_by_class(site)
    centre = {k: v[:, 0].mean() for k, v in st.items()}
    varieg = {k: np.nanmean(v[:, 1]) for k, v in st.items()}
    area = {k: v[:, 2].mean() for k, v in st.items()}
    assert centre["bkl"] > centre["nv"] + 10  # seborrhoeic keratoses are lighter tan
    assert centre["mel"] < centre["nv"]  # melanomas are darker (black, dark brown, blue-grey)
    assert varieg["mel"] > 1.5 * varieg["nv"]  # and multi-coloured, nevi uniform
    assert area["mel"] > area["nv"]  # and larger


def test_ambiguous_lesions_borrow_look_alike_features_but_keep_their_label():
    pure = [lesions.sample_lesion("nv", np.random.default_rng(i), ambiguity=0.0) for i in range(40)]
    mixed = [lesions.sample_lesion("nv", np.random.default_rng(i), ambiguity=1.0) for i in range(40)]
    assert all(m.kind == "nv" for m in mixed)
    # nevi never carry keratosis fissures nor melanoma's large border harmonics on their own
    assert max(p.fissures for p in pure) == 0.0
    borrowed_fissures = sum(m.fissures > 0 for m in mixed)
    borrowed_outline = sum(float(np.std(m.border)) > max(float(np.std(p.border)) for p in pure) for m in mixed)
    assert borrowed_fissures > 0 and borrowed_outline > 0


def test_sites_are_photographed_differently():
    means = {}
    for s in ("A", "B", "C", "D", "OOD"):
        items = [i for i in plan_federation(0.01, seed=2, sites=(s,), distractors=False) if i.kind == "nv"][:12]
        imgs = np.stack([np.asarray(render_synthetic_image(i, 96, 72)) for i in items]).astype(float)
        means[s] = imgs.mean((0, 1, 2))
    names = list(means)
    for i, a in enumerate(names):
        for b in names[i + 1 :]:
            assert np.abs(means[a] - means[b]).max() > 15, (a, b, means[a], means[b])


def test_views_of_one_lesion_are_different_pictures():
    items = plan_federation(0.05, seed=0, sites=("A",))
    by_lesion = defaultdict(list)
    for i in items:
        by_lesion[i.lesion_id].append(i)
    views = next(v for v in by_lesion.values() if len(v) >= 2)
    a, b = (np.asarray(render_synthetic_image(v, 96, 72)) for v in views[:2])
    assert not np.array_equal(a, b)


def test_generation_is_atomic(tmp_path, monkeypatch):
    out = tmp_path / "raw"
    calls = {"n": 0}
    real = synthetic._write_one

    def flaky(task):
        calls["n"] += 1
        if calls["n"] == 5:
            raise RuntimeError("killed")
        real(task)

    monkeypatch.setattr(synthetic, "_write_one", flaky)
    with pytest.raises(RuntimeError, match="killed"):
        generate_synthetic(out, scale=0.005, image_size=(48, 36), sites=("A",))
    assert not out.exists() and list(tmp_path.iterdir()) == []
    monkeypatch.setattr(synthetic, "_write_one", real)
    generate_synthetic(out, scale=0.005, image_size=(48, 36), sites=("A",))
    with pytest.raises(FileExistsError, match=str(out)):
        generate_synthetic(out, scale=0.005, image_size=(48, 36), sites=("A",))
    generate_synthetic(out, scale=0.005, image_size=(48, 36), sites=("A",), seed=1, overwrite=True)
    assert '"seed": 1' in (out / "synthetic.json").read_text()


def test_a_site_shift_scales_each_cohorts_departure_from_the_average_dermoscope():
    from prrfl.tasks.derm.acquisition import SITE_PROFILES, shifted

    a, b = SITE_PROFILES["A"], SITE_PROFILES["B"]
    assert shifted(a, 1.0) is a
    # gamma: geometric mean of A-D's 1.0, 1.15, 0.95, 1.05 = (1.0 * 1.15 * 0.95 * 1.05) ** 0.25 = 1.03610...
    ref = (1.0 * 1.15 * 0.95 * 1.05) ** 0.25
    assert shifted(b, 2.0).gamma == pytest.approx(ref * (1.15 / ref) ** 2)
    assert shifted(b, 0.0).gamma == pytest.approx(ref) == shifted(a, 0.0).gamma
    # the cast's blue channel: arithmetic mean of -0.01, 0.04, -0.02, 0.02 = 0.0075; B at shift 2: 0.0075 + 2 * 0.0325
    assert shifted(b, 2.0).cast[2] == pytest.approx(0.0725)
    assert shifted(b, 2.0).jpeg_quality == round(86.25 + 2 * (80 - 86.25))
    # what is photographed does not change: skin tones, hair, the field stop
    assert (shifted(b, 3.0).skin, shifted(b, 3.0).hair, shifted(b, 3.0).ring_p) == (b.skin, b.hair, b.ring_p)
    for bad in (-0.5, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="shift"):
            shifted(a, bad)


def test_at_shift_0_the_cohorts_photograph_alike_and_at_2_they_differ_more():
    # mean colour of each cohort's images of the same planned lesions: the spread between cohorts shrinks at 0, grows at 2
    items = [i for i in plan_federation(0.02, 0, sites=("A", "B", "C", "D"), distractors=False)]
    chosen = {s: [i for i in items if i.site == s][:4] for s in ("A", "B", "C", "D")}

    def spread(shift):
        means = [
            np.mean([np.asarray(render_synthetic_image(i, 96, 72, shift), dtype=float).mean((0, 1)) for i in chosen[s]], 0) for s in chosen
        ]
        return float(np.std(means, axis=0).mean())

    s0, s1, s2 = spread(0.0), spread(1.0), spread(2.0)
    assert s0 < s1 < s2
