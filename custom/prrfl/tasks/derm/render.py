"""Drawing a dermoscopy-like scene: skin, one lesion (lesions.LesionSpec) seen through a View, hair.

The lesion's border radius and edge width are lookup tables over angle, so a pixel costs one
arctan2 and one gather. Smooth colour (base tint, central shading, colour blobs) is evaluated on a
4x coarser grid and upsampled by two small matrix products (separable interpolation); sharp
structures (border, pigment network, fissures, dots) are evaluated at full resolution, only inside
the lesion's bounding box. Everything a lesion looks like comes from its own random generator
(LesionSpec), how it is photographed (position, rotation, size, mirror) from the image's (View), so
several images of one lesion are consistent views of the same lesion.

Images are float32 planes (3, H, W) in [0, 1] (about sRGB): channel-first keeps every per-pixel
operation contiguous. Acquisition effects are applied afterwards (acquisition.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
from PIL import Image, ImageDraw, ImageFilter

from .lesions import ANGLE_BINS, COLOURS, DOT_COLOURS, LesionSpec, mix_colours

_LOWRES = 4  # smooth fields are computed on a grid this much coarser


@dataclass(frozen=True)
class View:
    """How one image shows its lesion."""

    cx: float
    cy: float
    radius_px: float
    angle: float
    flip: bool


def sample_view(spec: LesionSpec, rng: np.random.Generator, width: int, height: int, zoom: float) -> View:
    """Where and how large the lesion appears in one image (crops/rotations of a lesion differ here)."""
    side = min(width, height)
    return View(
        cx=width / 2 + rng.normal(0, 0.06) * width,
        cy=height / 2 + rng.normal(0, 0.06) * height,
        radius_px=spec.radius * side * zoom * math.exp(rng.normal(0, 0.08)),
        angle=rng.uniform(0, 2 * math.pi),
        flip=bool(rng.random() < 0.5),
    )


def _lerp_matrix(n_out: int, n_in: int, step: float) -> np.ndarray:
    """(n_out, n_in) linear-interpolation weights; input sample i sits at output coordinate step*i + step/2."""
    pos = np.clip((np.arange(n_out) + 0.5 - step / 2) / step, 0, n_in - 1)
    w = np.maximum(0, 1 - np.abs(pos[:, None] - np.arange(n_in)[None, :]))
    return (w / w.sum(1, keepdims=True)).astype(np.float32)


@lru_cache(maxsize=16)
def _spline_matrix(n_out: int, n_in: int) -> np.ndarray:
    """(n_out, n_in) cubic B-spline weights spreading n_in control values smoothly over n_out pixels."""
    pos = (np.arange(n_out) + 0.5) / n_out * (n_in - 1)
    d = np.abs(pos[:, None] - np.arange(n_in)[None, :])
    w = np.where(d < 1, 2 / 3 - d**2 + d**3 / 2, np.where(d < 2, (2 - d) ** 3 / 6, 0))
    return (w / w.sum(1, keepdims=True)).astype(np.float32)


def upsample(planes: np.ndarray, ry: np.ndarray, rx: np.ndarray) -> np.ndarray:
    """(..., h, w) -> (..., H, W) with separable weights ry (H, h), rx (W, w): two small matrix products."""
    return ry @ planes @ rx.T


N_TEXTURES = 8
_TEX_PAD = 32


@lru_cache(maxsize=N_TEXTURES)
def _skin_texture(height: int, width: int, variant: int) -> np.ndarray:
    """Fine skin texture (pores + two families of furrows), a bit larger than the image.

    Built once per (size, variant) and process; each image takes a random window of a random
    variant, which is far cheaper than drawing furrows per image and looks the same.
    """
    rng = np.random.default_rng([20220102, variant])
    h, w = height + _TEX_PAD, width + _TEX_PAD
    h2, w2 = -(-h // 2), -(-w // 2)
    pores = upsample(rng.standard_normal((h2, w2), dtype=np.float32), _lerp_matrix(h, h2, 2), _lerp_matrix(w, w2, 2))
    tex = 0.018 * pores
    y = np.arange(h, dtype=np.float32)[:, None]
    x = np.arange(w, dtype=np.float32)[None, :]
    beta = rng.uniform(0, math.pi)
    period = rng.uniform(10, 18) * width / 600
    for b in (beta, beta + rng.uniform(0.9, 1.4)):
        s = np.abs(np.sin((x * math.cos(b) + y * math.sin(b)) * (math.pi / period) + rng.uniform(0, 6)))
        tex -= 0.035 * np.clip(1 - s / 0.18, 0, 1)
    return tex


def draw_skin(rng: np.random.Generator, width: int, height: int, tone: float) -> tuple[np.ndarray, np.ndarray]:
    """Skin (3, H, W) with mottling and patchy redness, and the fine texture (H, W) applied later to everything."""
    gh, gw = 6, 8
    base = mix_colours("fair_skin", "tan_skin", tone)
    mottle = rng.normal(0, 0.035, (gh, gw))
    red = np.maximum(rng.normal(0, 1, (gh, gw)), 0) * rng.uniform(0.3, 1.2)
    ctrl = (base[:, None, None] * (1 + mottle)[None] + np.array([0.0, -0.05, -0.04])[:, None, None] * red[None]).astype(np.float32)
    skin = upsample(ctrl, _spline_matrix(height, gh), _spline_matrix(width, gw))
    oy, ox = rng.integers(0, _TEX_PAD, 2)
    fine = _skin_texture(height, width, int(rng.integers(N_TEXTURES)))[oy : oy + height, ox : ox + width]
    return skin, fine


def _lesion_uv(spec: LesionSpec, view: View, xs: np.ndarray, ys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Pixel offsets from the lesion centre -> lesion coordinates (rotated, aspect-stretched, unit radius)."""
    c, s = math.cos(view.angle), math.sin(view.angle)
    sa = math.sqrt(spec.aspect)
    ku, kv = 1 / (view.radius_px * sa), sa / view.radius_px * (-1 if view.flip else 1)
    u = (xs[None, :] * (c * ku)) + (ys[:, None] * (s * ku))
    v = (xs[None, :] * (-s * kv)) + (ys[:, None] * (c * kv))
    return u, v


def _polar(spec: LesionSpec, u: np.ndarray, v: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(rho, border radius at the pixel's angle, edge width at that angle)."""
    rho = np.hypot(u, v)
    idx = ((np.arctan2(v, u) + math.pi) * (ANGLE_BINS / (2 * math.pi))).astype(np.int32)
    np.minimum(idx, ANGLE_BINS - 1, out=idx)
    return rho, spec.border[idx], spec.edge[idx]


def _warp_field(spec: LesionSpec, u: np.ndarray, v: np.ndarray, which: int) -> np.ndarray:
    w = np.zeros_like(u)
    for amp, fu, fv, ph in spec.warp:
        w += amp * np.sin(fu * u + fv * v + ph + which * 1.7)
    return w


def _smooth_fields(spec: LesionSpec, view: View, x0: int, y0: int, w: int, h: int) -> tuple[np.ndarray, np.ndarray]:
    """Colour (3, h, w) and (warp u, warp v, patchiness) (3, h, w), evaluated on a coarse grid and upsampled."""
    k = _LOWRES
    wl, hl = -(-w // k), -(-h // k)
    xs = x0 + k * np.arange(wl, dtype=np.float32) + k / 2 - view.cx
    ys = y0 + k * np.arange(hl, dtype=np.float32) + k / 2 - view.cy
    u, v = _lesion_uv(spec, view, xs, ys)
    rho, rb, _ = _polar(spec, u, v)
    q = np.clip(rho / rb, 0, 1)
    col = spec.base[:, None, None] * (1 - spec.centre_shade * (1 - q * q))[None]
    for bu, bv, sig, st, r, g, b in spec.blobs:
        wgt = st * np.exp(-((u - bu) ** 2 + (v - bv) ** 2) * (0.5 / sig**2))
        col += wgt[None] * (np.array([r, g, b], np.float32)[:, None, None] - col)
    ry, rx = _lerp_matrix(h, hl, k), _lerp_matrix(w, wl, k)
    colour = upsample(col.astype(np.float32), ry, rx)
    if spec.network <= 0 and spec.fissures <= 0:
        return colour, np.zeros((0,))
    amp = max(float(spec.warp[:, 0].sum()), 1e-6)
    fields = np.stack(
        [
            _warp_field(spec, u, v, 0),
            _warp_field(spec, u, v, 1),
            np.clip(0.5 + 2.0 * _warp_field(spec, v, u, 2) / amp, 0, 1),
        ]
    ).astype(np.float32)
    return colour, upsample(fields, ry, rx)


def _dot_layers(spec: LesionSpec, view: View, x0: int, y0: int, w: int, h: int, scale: float) -> dict[int, np.ndarray]:
    """Dots and globules drawn by PIL into one soft alpha layer per dot colour."""
    if len(spec.dots) == 0:
        return {}
    c, s = math.cos(view.angle), math.sin(view.angle)
    sa = math.sqrt(spec.aspect)
    layers: dict[int, ImageDraw.ImageDraw] = {}
    images: dict[int, Image.Image] = {}
    for du, dv, dr, ci in spec.dots:
        a = du * view.radius_px * sa
        b = dv * view.radius_px / sa * (-1 if view.flip else 1)
        px, py = view.cx + a * c - b * s - x0, view.cy + a * s + b * c - y0
        r = max(0.7, dr * view.radius_px)
        ci = int(ci)
        if ci not in layers:
            images[ci] = Image.new("L", (w, h), 0)
            layers[ci] = ImageDraw.Draw(images[ci])
        layers[ci].ellipse((px - r, py - r, px + r, py + r), fill=255)
    blur = ImageFilter.GaussianBlur(max(0.6, 1.2 * scale))
    return {ci: np.asarray(im.filter(blur), np.float32) * (1 / 255) for ci, im in images.items()}


def draw_lesion(img: np.ndarray, spec: LesionSpec, view: View) -> None:
    """Composite the lesion into `img` (3, H, W) in place, touching only its bounding box."""
    height, width = img.shape[1:]
    reach = view.radius_px * float(spec.border.max() + 2 * spec.edge.max()) * math.sqrt(spec.aspect) + 2
    x0, x1 = max(0, int(view.cx - reach)), min(width, int(math.ceil(view.cx + reach)))
    y0, y1 = max(0, int(view.cy - reach)), min(height, int(math.ceil(view.cy + reach)))
    if x1 <= x0 or y1 <= y0:
        return
    w, h = x1 - x0, y1 - y0
    xs = np.arange(x0, x1, dtype=np.float32) + 0.5 - view.cx
    ys = np.arange(y0, y1, dtype=np.float32) + 0.5 - view.cy
    u, v = _lesion_uv(spec, view, xs, ys)
    rho, rb, ew = _polar(spec, u, v)
    t = np.clip((rb - rho) / ew + 0.5, 0, 1)
    alpha = t * t * (3 - 2 * t) * spec.opacity
    colour, fields = _smooth_fields(spec, view, x0, y0, w, h)
    if spec.network > 0:  # reticular lines: zeros of two warped sine families, thick and patchy when atypical
        wu, wv, patch = fields
        f = spec.net_freq * math.pi
        s1 = np.abs(np.sin(f * (u + wu)))
        s2 = np.abs(np.sin(f * (v + wv)))
        thick = spec.net_thick * (1 + spec.broken * (patch - 0.5))
        line = np.clip(1 - np.minimum(s1, s2) / thick, 0, 1)
        strength = spec.network * np.clip((1.05 - rho / rb) * 2.5, 0, 1)  # fades towards the periphery
        if spec.broken > 0:
            strength *= 1 - spec.broken * (1 - patch)
        colour *= 1 - 0.6 * line * strength
    if spec.fissures > 0:  # cerebriform: broad dark furrows between lighter ridges
        wu = fields[0]
        f = spec.net_freq * math.pi
        s = np.abs(np.sin(f * (0.8 * u + 0.6 * v + 0.6 * wu)))
        furrow = np.clip(1 - s / 0.55, 0, 1) ** 2
        colour *= 1 + spec.fissures * (0.12 - furrow)
    for ci, layer in _dot_layers(spec, view, x0, y0, w, h, width / 600).items():
        colour += layer * (COLOURS[DOT_COLOURS[ci]][:, None, None] - colour)
    sub = img[:, y0:y1, x0:x1]
    sub += alpha * (colour - sub)


def draw_hair(img: np.ndarray, rng: np.random.Generator, count: int) -> None:
    """Dark curved strands (quadratic Bezier curves drawn by PIL), composited into `img` (3, H, W) in place."""
    if count <= 0:
        return
    height, width = img.shape[1:]
    layer = Image.new("L", (width, height), 0)
    draw = ImageDraw.Draw(layer)
    t = np.linspace(0, 1, 24)[:, None]
    for _ in range(count):
        p0 = rng.uniform((-0.1 * width, -0.1 * height), (1.1 * width, 1.1 * height))
        ang = rng.uniform(0, 2 * math.pi)
        length = rng.uniform(0.3, 1.0) * width
        p2 = p0 + length * np.array([math.cos(ang), math.sin(ang)])
        p1 = (p0 + p2) / 2 + rng.normal(0, 0.18 * length) * np.array([-math.sin(ang), math.cos(ang)])
        pts = (1 - t) ** 2 * p0 + 2 * (1 - t) * t * p1 + t**2 * p2
        draw.line(
            [tuple(p) for p in pts],
            fill=int(rng.uniform(150, 240)),
            width=max(1, round(rng.uniform(0.8, 2.4) * width / 600)),
            joint="curve",
        )
    box = layer.getbbox()
    if box is None:
        return
    x0, y0, x1, y1 = box
    a = np.asarray(layer.crop(box).filter(ImageFilter.GaussianBlur(0.5)), np.float32) * (1 / 255)
    sub = img[:, y0:y1, x0:x1]
    sub += a * (COLOURS["hair"][:, None, None] - sub)
