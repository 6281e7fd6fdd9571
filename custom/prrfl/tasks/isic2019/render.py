"""The pixels of a synthetic Fed-ISIC2019 image: one of eight lesion types photographed at one of six centres.

`render_image(label, centre, seed, shift)` composes, in order: skin (the dermoscopy task's draw_skin, drawn once
on a canvas as wide as the widest centre and cropped to the centre's frame, so that skin texture has one physical
scale everywhere), the centre population's solar lentigines, the lesion's base (the dermoscopy task's
draw_lesion: outline, tint, colour blobs, pigment network, dots), the structures of its class drawn here
(lesions.Lines: vessels; lesions.Discs: lacunae, nests, follicular openings, dotted vessels, blood spots;
lesions.Patch: scar, keratin, crust, scale), fine skin texture, hair, ruler marks and ink, and finally the
centre's acquisition (the dermoscopy task's acquire: lighting, noise, tone curve, blur, field stop).

What each class and centre looks like, and why, is told in lesions.py and acquisition.py. Four independent random
streams are derived from the seed: the lesion (with its class), the scene (skin tone, skin, lesion position), the
artefacts (lentigines, hair, ruler, ink) and the acquisition. The lesion and scene streams do not depend on the
centre, so one seed shows the same lesion, at the same place relative to the image centre, at every centre; the
artefact stream does not depend on the class, so a ruler's presence says nothing about the diagnosis.

Lines and discs are drawn by PIL on a supersampled layer covering only their bounding box, patches evaluated per
pixel in lesion coordinates over their bounding box: an image costs about 10 ms of one CPU core at 224 px.
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
from PIL import Image, ImageDraw, ImageFilter

from prrfl.tasks.derm.acquisition import acquire
from prrfl.tasks.derm.lesions import ANGLE_BINS, LesionSpec
from prrfl.tasks.derm.render import View, _lesion_uv, _spline_matrix, draw_hair, draw_lesion, draw_skin, sample_view, upsample

from .acquisition import CENTRE_PROFILES, centre_profile, draw_ink, draw_ruler, image_site, paint
from .lesions import KINDS, Discs, IsicLesion, Lines, Patch, sample_isic_lesion

CLASSES: tuple[str, ...] = KINDS  # FLamby's target order 0..7
CENTRES: tuple[str, ...] = ("BCN", "HAM_vidir_molemax", "HAM_vidir_modern", "HAM_rosendahl", "MSK", "HAM_vienna_dias")  # FLamby 0..5

# (width, height) as FLamby's resize leaves them (shorter side 224): BCN's square crops of the dermoscope's field,
# HAM10000's 600x450 frames, MSK's 3:2 camera frames
RAW_SIZES: dict[str, tuple[int, int]] = {
    "BCN": (224, 224),
    "HAM_vidir_molemax": (299, 224),
    "HAM_vidir_modern": (299, 224),
    "HAM_rosendahl": (299, 224),
    "MSK": (336, 224),
    "HAM_vienna_dias": (299, 224),
}
JPEG_QUALITY: dict[str, int] = {c: CENTRE_PROFILES[c].site.jpeg_quality for c in CENTRES}

_CANVAS = (max(w for w, _ in RAW_SIZES.values()), max(h for _, h in RAW_SIZES.values()))
_SS = 3  # supersampling of the line and disc layers
_STREAMS = {"lesion": 0, "scene": 1, "artefacts": 2, "acquisition": 3}


def _rng(seed: int, stream: str, label: int = 0) -> np.random.Generator:
    return np.random.default_rng([seed, _STREAMS[stream], label])


def to_pixels(spec: LesionSpec, view: View, u: np.ndarray, v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Lesion coordinates -> image pixel coordinates (the inverse of the dermoscopy renderer's mapping)."""
    c, s = math.cos(view.angle), math.sin(view.angle)
    sa = math.sqrt(spec.aspect)
    a = u * (view.radius_px * sa)
    b = v * (view.radius_px / sa * (-1 if view.flip else 1))
    return view.cx + a * c - b * s, view.cy + a * s + b * c


def _box(x: np.ndarray, y: np.ndarray, pad: float, width: int, height: int) -> tuple[int, int, int, int] | None:
    """Integer bounding box (x0, y0, x1, y1) of points padded by `pad`, clipped to the image; None if empty."""
    x0, y0 = max(0, int(math.floor(x.min() - pad))), max(0, int(math.floor(y.min() - pad)))
    x1, y1 = min(width, int(math.ceil(x.max() + pad))), min(height, int(math.ceil(y.max() + pad)))
    return (x0, y0, x1, y1) if x1 > x0 and y1 > y0 else None


def draw_lines(img: np.ndarray, spec: LesionSpec, view: View, lines: Lines) -> None:
    """Sharp thin segments (vessels) with round joints, antialiased by supersampling, in place."""
    seg = lines.segments
    if len(seg) == 0:
        return
    x0s, y0s = to_pixels(spec, view, seg[:, 0], seg[:, 1])
    x1s, y1s = to_pixels(spec, view, seg[:, 2], seg[:, 3])
    widths = np.maximum(0.8, seg[:, 4] * view.radius_px)
    box = _box(np.concatenate([x0s, x1s]), np.concatenate([y0s, y1s]), float(widths.max()) + 1, *img.shape[:0:-1])
    if box is None:
        return
    bx, by, bx1, by1 = box
    layer = Image.new("L", ((bx1 - bx) * _SS, (by1 - by) * _SS), 0)
    draw = ImageDraw.Draw(layer)
    for xa, ya, xb, yb, w in zip(x0s, y0s, x1s, y1s, widths):
        p = ((xa - bx) * _SS, (ya - by) * _SS, (xb - bx) * _SS, (yb - by) * _SS)
        r = w * _SS / 2
        draw.line(p, fill=255, width=max(1, round(w * _SS)))
        draw.ellipse((p[2] - r, p[3] - r, p[2] + r, p[3] + r), fill=255)
    alpha = np.asarray(layer.reduce(_SS), np.float32) * (lines.opacity / 255)
    paint(img, alpha, lines.colour, bx, by)


def _ellipse_polygons(spec: LesionSpec, view: View, discs: np.ndarray, n: int = 14) -> tuple[np.ndarray, np.ndarray]:
    """Pixel outlines (k, n) x, y of the discs' ellipses."""
    t = np.linspace(0, 2 * math.pi, n, endpoint=False)[None, :]
    u, v, ru, rv, ang = (discs[:, i : i + 1] for i in range(5))
    eu, ev = ru * np.cos(t), rv * np.sin(t)
    ca, sa = np.cos(ang), np.sin(ang)
    return to_pixels(spec, view, u + eu * ca - ev * sa, v + eu * sa + ev * ca)


def draw_discs(img: np.ndarray, spec: LesionSpec, view: View, discs: Discs) -> None:
    """Filled ellipses of their own colours, softened, in place (colours un-premultiplied after the blur)."""
    d = discs.discs
    if len(d) == 0:
        return
    xs, ys = _ellipse_polygons(spec, view, d)
    soft = discs.soft * view.radius_px
    box = _box(xs, ys, 2 * soft + 2, *img.shape[:0:-1])
    if box is None:
        return
    bx, by, bx1, by1 = box
    size = ((bx1 - bx) * _SS, (by1 - by) * _SS)
    colour, mask = Image.new("RGB", size, 0), Image.new("L", size, 0)
    dc, dm = ImageDraw.Draw(colour), ImageDraw.Draw(mask)
    fills = np.rint(np.clip(d[:, 5:8], 0, 1) * 255).astype(np.int64).tolist()
    for x, y, rgb in zip(((xs - bx) * _SS).tolist(), ((ys - by) * _SS).tolist(), fills):
        poly = list(zip(x, y))
        dc.polygon(poly, fill=tuple(rgb))
        dm.polygon(poly, fill=255)
    colour, mask = colour.reduce(_SS), mask.reduce(_SS)
    if soft > 0.3:  # softened at the image's resolution by one box pass of the same variance (cheap)
        blur = ImageFilter.BoxBlur((math.sqrt(12 * soft**2 + 1) - 1) / 2)
        colour, mask = colour.filter(blur), mask.filter(blur)
    m = np.asarray(mask, np.float32) * (1 / 255)
    rgb = np.asarray(colour, np.float32).transpose(2, 0, 1) * (1 / 255)
    rgb /= np.maximum(m, 1e-3)
    sub = img[:, by:by1, bx:bx1]
    sub += (m * discs.opacity) * (rgb - sub)


def draw_patch(img: np.ndarray, spec: LesionSpec, view: View, patch: Patch) -> None:
    """An irregular (optionally flaky or ring-shaped) structureless area, evaluated per pixel, in place."""
    height, width = img.shape[1:]
    reach = patch.radius * float(patch.border.max()) + patch.edge
    cx, cy = to_pixels(spec, view, np.array([patch.u]), np.array([patch.v]))
    box = _box(cx, cy, reach * view.radius_px * math.sqrt(spec.aspect) + 1, width, height)
    if box is None:
        return
    x0, y0, x1, y1 = box
    xs = np.arange(x0, x1, dtype=np.float32) + 0.5 - view.cx
    ys = np.arange(y0, y1, dtype=np.float32) + 0.5 - view.cy
    u, v = _lesion_uv(spec, view, xs, ys)
    du, dv = u - patch.u, v - patch.v
    rho = np.hypot(du, dv)
    idx = ((np.arctan2(dv, du) + math.pi) * (ANGLE_BINS / (2 * math.pi))).astype(np.int32)
    np.minimum(idx, ANGLE_BINS - 1, out=idx)
    rb = patch.radius * patch.border[idx]
    t = np.clip((rb - rho) / patch.edge + 0.5, 0, 1)
    alpha = t * t * (3 - 2 * t)
    if patch.inner > 0:
        t = np.clip((rho - patch.inner * rb) / patch.edge + 0.5, 0, 1)
        alpha *= t * t * (3 - 2 * t)
    if patch.texture > 0:
        k = patch.noise.shape[0]
        n = upsample(patch.noise, _spline_matrix(y1 - y0, k), _spline_matrix(x1 - x0, k))
        flakes = np.clip(0.5 + 2.0 * (n + 1.2 * (patch.coverage - 0.5)), 0, 1)
        alpha *= 1 - patch.texture * (1 - flakes)
    paint(img, alpha * patch.opacity, patch.colour, x0, y0)


_DRAW = {Lines: draw_lines, Discs: draw_discs, Patch: draw_patch}


def draw_isic_lesion(img: np.ndarray, lesion: IsicLesion, view: View) -> None:
    """The lesion's base (the dermoscopy renderer) and its structures on top, in place."""
    draw_lesion(img, lesion.spec, view)
    for s in lesion.structures:
        _DRAW[type(s)](img, lesion.spec, view, s)


def draw_lentigines(img: np.ndarray, rng: np.random.Generator, mean: float) -> None:
    """Solar lentigines (sun damage): faint, soft light-brown macules scattered over the skin, in place (each drawn
    on a small layer around itself)."""
    height, width = img.shape[1:]
    soft = 2.5 * height / 224
    for _ in range(int(rng.poisson(mean))):
        x, y = rng.uniform(0, width), rng.uniform(0, height)
        rx, ry = rng.uniform(3, 12, 2) * height / 224
        fill = int(rng.uniform(35, 80))
        box = _box(np.array([x - rx, x + rx]), np.array([y - ry, y + ry]), 3 * soft, width, height)
        if box is None:
            continue
        x0, y0, x1, y1 = box
        layer = Image.new("L", (x1 - x0, y1 - y0), 0)
        ImageDraw.Draw(layer).ellipse((x - rx - x0, y - ry - y0, x + rx - x0, y + ry - y0), fill=fill)
        alpha = np.asarray(layer.filter(ImageFilter.GaussianBlur(soft)), np.float32) * (1 / 255)
        paint(img, alpha, np.array([0.58, 0.40, 0.27]), x0, y0)


def _view(spec: LesionSpec, rng: np.random.Generator, width: int, height: int, zoom: float) -> View:
    """The dermoscopy renderer's view on a square of the shorter side, centred in the frame: the lesion sits at the
    same offset from the image centre at every centre, whatever the frame's width."""
    side = min(width, height)
    view = sample_view(spec, rng, side, side, zoom)
    return replace(view, cx=view.cx + (width - side) / 2, cy=view.cy + (height - side) / 2)


def _check(label: int, centre: str, seed: int) -> str:
    if not (isinstance(label, int | np.integer) and 0 <= label < len(CLASSES)):
        raise ValueError(f"label must be an integer 0..{len(CLASSES) - 1} ({', '.join(CLASSES)}), got {label!r}")
    if centre not in RAW_SIZES:
        raise ValueError(f"unknown Fed-ISIC2019 centre {centre!r}; expected one of {list(CENTRES)}")
    if not (isinstance(seed, int | np.integer) and seed >= 0):
        raise ValueError(f"seed must be an integer >= 0, got {seed!r}")
    return CLASSES[label]


def render_scene(label: int, centre: str, seed: int, shift: float = 1.0) -> tuple[np.ndarray, IsicLesion, View]:
    """The scene render_image photographs: float RGB planes (3, H, W) in about [0, 1], the lesion and its view."""
    kind = _check(label, centre, seed)
    profile = centre_profile(centre, float(shift))
    width, height = RAW_SIZES[centre]
    lesion = sample_isic_lesion(kind, _rng(seed, "lesion", int(label)))
    scene = _rng(seed, "scene")
    skin, fine = draw_skin(scene, *_CANVAS, scene.uniform(*profile.site.skin))
    x0, y0 = (_CANVAS[0] - width) // 2, (_CANVAS[1] - height) // 2
    img = np.ascontiguousarray(skin[:, y0 : y0 + height, x0 : x0 + width])
    view = _view(lesion.spec, scene, width, height, profile.site.zoom)
    art = _rng(seed, "artefacts")
    draw_lentigines(img, art, profile.lentigines)
    draw_isic_lesion(img, lesion, view)
    img *= 1 + fine[y0 : y0 + height, x0 : x0 + width]
    draw_hair(img, art, int(art.poisson(profile.site.hair * art.gamma(2.0, 0.5))))
    ruler, ink = art.random() < profile.ruler, art.random() < profile.ink  # drawn whatever the class
    if ruler:
        draw_ruler(img, art)
    if ink:
        draw_ink(img, art, view.cx, view.cy, view.radius_px)
    return img, lesion, view


def render_with_lesion(label: int, centre: str, seed: int, shift: float = 1.0) -> tuple[Image.Image, IsicLesion, View]:
    """render_image's picture with the lesion it shows and where (its View: centre and mean radius in pixels)."""
    img, lesion, view = render_scene(label, centre, seed, shift)
    acq = _rng(seed, "acquisition")
    return acquire(img, acq, image_site(centre_profile(centre, float(shift)), acq)), lesion, view


def render_image(label: int, centre: str, seed: int, shift: float = 1.0) -> Image.Image:
    """RGB image of class CLASSES[label] at `centre`, at RAW_SIZES[centre], deterministic in (label, centre, seed,
    shift); `shift` scales how much the centres' acquisitions differ (0: all centres alike, 1: as designed)."""
    return render_with_lesion(label, centre, seed, shift)[0]
