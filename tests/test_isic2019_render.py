"""The synthetic Fed-ISIC2019 renderer: its interface, determinism, the centres' frames, what `shift` does, and
measurable signatures of the eight classes (all on rendered pixels, a few seeds each; the whole file runs in seconds).

Rendering is deterministic, so these tests cannot flake: their tolerances are there to fail when a change to the
renderer removes a class's signature or a centre's difference, and each one is justified beside it."""

from __future__ import annotations

import itertools
from functools import lru_cache

import numpy as np
import pytest
from scipy.ndimage import uniform_filter
from threadpoolctl import threadpool_limits

from prrfl.tasks.isic2019 import render
from prrfl.tasks.isic2019.layout import CENTRES as LAYOUT_CENTRES
from prrfl.tasks.isic2019.layout import CLASS_NAMES, SHORT_SIDE
from prrfl.tasks.isic2019.lesions import sample_isic_lesion
from prrfl.tasks.isic2019.render import CENTRES, CLASSES, JPEG_QUALITY, RAW_SIZES, render_image, render_scene, render_with_lesion

SEEDS = range(8)
MODERN = "HAM_vidir_modern"


@pytest.fixture(autouse=True)
def _one_thread():
    with threadpool_limits(1):  # the renderer's small matrix products; the machine is shared
        yield


@lru_cache(maxsize=80)  # the signature tests share their renders (8 classes x 8 seeds, under 1.1 MB each)
def _pixels(label: int, centre: str, seed: int, shift: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
    """The rendered image (H, W, 3) float and each pixel's distance from the lesion centre in mean lesion radii."""
    image, _, view = render_with_lesion(label, centre, seed, shift)
    im = np.asarray(image, np.float32)
    y, x = np.mgrid[0 : im.shape[0], 0 : im.shape[1]] + 0.5
    return im, (np.hypot(x - view.cx, y - view.cy) / view.radius_px).astype(np.float32)


def _mean_over_seeds(label: int, measure, centre: str = MODERN) -> float:
    return float(np.mean([measure(*_pixels(label, centre, s)) for s in SEEDS]))


def _redness(im: np.ndarray, mask: np.ndarray) -> float:
    """R + B - 2G over `mask`: haemoglobin's red, pink and purple are high on it, melanin's browns and the skin low
    (brown is red and yellow at once: its R - G and G - B cancel)."""
    r, g, b = im[..., 0], im[..., 1], im[..., 2]
    return float((r + b - 2 * g)[mask].mean())


def _inner_redness(im: np.ndarray, d: np.ndarray) -> float:
    return _redness(im, d < 0.5)


def _rim_redness(im: np.ndarray, d: np.ndarray) -> float:
    return _redness(im, (d > 0.6) & (d < 0.85))


def _luminance(im: np.ndarray, mask: np.ndarray) -> float:
    return float(im.mean(-1)[mask].mean())


def _centre_minus_rim(im: np.ndarray, d: np.ndarray) -> float:
    """Luminance of the lesion's middle (d < 0.2) minus its rim (0.6 < d < 0.85)."""
    return _luminance(im, d < 0.2) - _luminance(im, (d > 0.6) & (d < 0.85))


def test_the_interface_matches_flambys_layout():
    assert CLASSES == CLASS_NAMES == ("MEL", "NV", "BCC", "AK", "BKL", "DF", "VASC", "SCC")
    assert CENTRES == LAYOUT_CENTRES
    assert set(RAW_SIZES) == set(JPEG_QUALITY) == set(CENTRES)
    assert all(min(size) == SHORT_SIDE for size in RAW_SIZES.values())
    assert RAW_SIZES["BCN"] == (224, 224)  # square crops of the dermoscope's field
    assert all(50 <= q <= 100 for q in JPEG_QUALITY.values())


def test_every_centre_has_its_own_frame_whatever_the_class():
    for centre, label in itertools.product(CENTRES, range(len(CLASSES))):
        im = render_image(label, centre, 3)
        assert (im.mode, im.size) == ("RGB", RAW_SIZES[centre]), (centre, CLASSES[label])


def test_rendering_is_deterministic_and_the_seed_class_and_shift_matter():
    a = render_image(2, "MSK", 11).tobytes()
    assert render_image(2, "MSK", 11).tobytes() == a
    assert render_image(2, "MSK", 11, 1.0).tobytes() == a  # shift 1 is the default
    assert render_image(2, "MSK", 12).tobytes() != a
    assert render_image(3, "MSK", 11).tobytes() != a
    assert render_image(2, "MSK", 11, 0.5).tobytes() != a
    assert render_image(2, "MSK", 2**63 - 1).size == RAW_SIZES["MSK"]  # the seeds the writer draws


@pytest.mark.parametrize(
    "args",
    [
        (8, "BCN", 0, 1.0),
        (-1, "BCN", 0, 1.0),
        (0, "Barcelona", 0, 1.0),
        (0, "BCN", -1, 1.0),
        (0, "BCN", 0, -0.5),
        (0, "BCN", 0, float("nan")),
    ],
)
def test_bad_arguments_are_refused(args):
    with pytest.raises(ValueError):
        render_image(*args)


def test_shift_zero_gives_every_centre_the_same_acquisition():
    """One seed is the same lesion at every centre; at shift 0 it must look the same (its interior's mean colour), at
    shift 1 it must not. Measured: 0.2-5.4 (of 255, Euclidean RGB) apart at shift 0 (what is left: noise, the centres'
    skin tones seen through translucent lesions), 27-90 at shift 1. The whole images' mean colours per centre
    (which also hold the centres' populations: skin tones, hair, rings on differently shaped frames; 4 seeds) spread 111
    apart at shift 1, 33 at shift 0."""

    def interior(label: int, centre: str, seed: int, shift: float) -> np.ndarray:
        im, d = _pixels(label, centre, seed, shift)
        return im[d < 0.5].mean(0)

    def frame_mean(centre: str, shift: float) -> np.ndarray:
        return np.mean([np.asarray(render_image(s, centre, s, shift), np.float32).reshape(-1, 3).mean(0) for s in range(4)], 0)

    for shift, lo, hi in ((0.0, 0.0, 8.0), (1.0, 20.0, np.inf)):
        gaps = []
        for seed in range(6):
            colours = [interior(seed, c, seed, shift) for c in ("BCN", "HAM_vienna_dias", "MSK")]
            gaps.append(max(np.linalg.norm(a - b) for a, b in itertools.combinations(colours, 2)))
        assert lo <= np.mean(gaps) < hi, (shift, gaps)
    spread = {}
    for shift in (0.0, 1.0):
        means = [frame_mean(c, shift) for c in CENTRES]
        spread[shift] = max(np.linalg.norm(a - b) for a, b in itertools.combinations(means, 2))
    assert spread[1.0] > 50 and spread[0.0] < 0.6 * spread[1.0], spread


def test_red_classes_are_redder_than_nevi():
    """Vascular lesions (lacunae), BCC (pink, vessels) and AK (erythema) against nevi on R + B - 2G inside the lesion,
    SCC (a pink-red nodule around white keratin) on its rim; 8 seeds each at one centre. Measured means: NV 22 (rim
    22), BCC 68, AK 44, VASC 105 (lacunae of every hue: red, purple, dark blue), SCC rim 85. A mean of 8 seeds moves
    by about 4 (AK, BCC), 10 (VASC) from seed to seed: the margins (12 for AK, 25 for BCC, 40 for VASC and SCC) are
    three such moves or more, and fail if a class lost its colour. The pigmented classes stay within 15 of nevi."""
    nv = _mean_over_seeds(CLASSES.index("NV"), _inner_redness)
    for name, margin in {"BCC": 25, "AK": 12, "VASC": 40}.items():
        red = _mean_over_seeds(CLASSES.index(name), _inner_redness)
        assert red > nv + margin, (name, red, nv)
    scc = _mean_over_seeds(CLASSES.index("SCC"), _rim_redness)
    assert scc > _mean_over_seeds(CLASSES.index("NV"), _rim_redness) + 40, scc
    for name in ("MEL", "BKL", "DF"):
        assert abs(_mean_over_seeds(CLASSES.index(name), _inner_redness) - nv) < 15, name


def test_df_has_a_white_centre_and_scc_a_keratin_centre():
    """DF: the scar is far brighter than the brown rim (measured 74 brighter); SCC: the keratin mass is brighter than
    the pink-red rim (61) and far less red (90 on R + B - 2G). Margins of 35, 30 and 40 are about half the measured
    gaps and more than three times the seed-to-seed move of a mean of 8 seeds (about 3); a nevus (-3) has no white
    centre."""
    assert _mean_over_seeds(CLASSES.index("DF"), _centre_minus_rim) > 35
    assert _mean_over_seeds(CLASSES.index("SCC"), _centre_minus_rim) > 30
    assert _mean_over_seeds(CLASSES.index("NV"), _centre_minus_rim) < 10

    def rim_minus_centre_redness(im, d):
        return _rim_redness(im, d) - _redness(im, d < 0.2)

    assert _mean_over_seeds(CLASSES.index("SCC"), rim_minus_centre_redness) > 40


def test_bcc_shows_thin_red_vessels_and_melanoma_more_variegation_than_nevi():
    """Thin red lines stand out of their neighbourhood on R + B - 2G (more than 30 above its 7x7 mean): BCC's
    arborizing vessels make 3-8% of its lesion disc such pixels in every seed measured, while the pigmented classes
    have none (SCC's dotted vessels and VASC's lacuna edges some). Melanoma's colours spread its luminance more than a
    nevus' uniform brown (std 11.3 vs 5.8, means of 8 seeds, despite the quarter of lesions that borrow a
    look-alike's features): 1.3x is below what 8 seeds give and above equal."""

    def thin_red(im, d):
        r, g, b = im[..., 0], im[..., 1], im[..., 2]
        red = r + b - 2 * g
        return float(((red - uniform_filter(red, 7)) > 30)[d < 0.9].mean())

    def variegation(im, d):
        return float(im.mean(-1)[d < 0.5].std())

    assert min(thin_red(*_pixels(CLASSES.index("BCC"), MODERN, s)) for s in SEEDS) > 0.015
    for name in ("MEL", "NV", "BKL", "DF"):
        assert _mean_over_seeds(CLASSES.index(name), thin_red) < 0.002, name
    assert _mean_over_seeds(CLASSES.index("MEL"), variegation) > 1.3 * _mean_over_seeds(CLASSES.index("NV"), variegation)


def test_no_class_is_told_by_its_size():
    """Every class's radius range overlaps every other's: a common band of sizes holds lesions of all eight."""
    ranges = {}
    for kind in CLASSES:
        radii = [sample_isic_lesion(kind, np.random.default_rng([s, 5])).spec.radius for s in range(60)]
        ranges[kind] = (min(radii), max(radii))
    lo, hi = max(r[0] for r in ranges.values()), min(r[1] for r in ranges.values())
    assert hi - lo > 0.04, ranges


def test_rulers_and_ink_depend_on_the_centre_never_on_the_class(monkeypatch):
    """The artefacts' random stream is the class's nobody: the same seeds get a ruler (ink) whatever the label, at
    rates set by the centre."""
    drawn: list[tuple[str, int, int]] = []
    monkeypatch.setattr(render, "draw_isic_lesion", lambda *a: None)  # only the artefacts matter here
    monkeypatch.setattr(render, "draw_skin", lambda rng, w, h, tone: (np.zeros((3, h, w), np.float32), np.zeros((h, w), np.float32)))
    monkeypatch.setattr(render, "draw_ruler", lambda img, rng: drawn.append(("ruler", label, seed)))
    monkeypatch.setattr(render, "draw_ink", lambda img, rng, *a: drawn.append(("ink", label, seed)))
    n = 60
    for label, seed in itertools.product(range(len(CLASSES)), range(n)):
        render_scene(label, "MSK", seed)
    per_label = {lab: {(what, s) for what, la, s in drawn if la == lab} for lab in range(len(CLASSES))}
    assert all(v == per_label[0] for v in per_label.values())
    rulers = sum(1 for what, _ in per_label[0] if what == "ruler") / n
    inks = sum(1 for what, _ in per_label[0] if what == "ink") / n
    assert 0.15 < rulers < 0.45 and 0.05 < inks < 0.35, (rulers, inks)  # MSK: 0.3 and 0.2 (binomial sd 0.06 and 0.05 in 60 seeds)
    drawn.clear()
    for seed in range(n):
        render_scene(1, "HAM_vidir_molemax", seed)
    assert drawn == []  # video dermoscopy of followed-up nevi: no rulers, no ink
