"""Per-site acquisition: how each cohort's camera and dermoscope photograph the skin.

A SiteProfile is fixed per cohort (the domain shift a federated method must cope with); each
image jitters it slightly. Order of effects: illumination gradient and vignetting, sensor noise,
quantisation, tone curve (white balance, colour cast, gamma, contrast) through a PIL lookup
table, optical blur, the dermoscope's black circular field stop, and finally JPEG quality when
the file is written.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from functools import lru_cache, partial

import numpy as np
from PIL import Image, ImageFilter

from prrfl.data import shift as shifting


@dataclass(frozen=True)
class SiteProfile:
    gains: tuple[float, float, float]  # white balance, per channel
    cast: tuple[float, float, float]  # additive colour cast (0-1 units)
    gamma: float
    contrast: float
    illumination: float  # strength of a linear illumination gradient across the image
    vignette: float  # darkening at the corners
    ring_p: float  # probability of a visible black circular field stop
    ring_radius: float  # its radius, as a fraction of the half-diagonal
    blur: float  # Gaussian blur radius in pixels at 600 px width
    noise: float  # sensor noise std (0-1 units)
    zoom: float  # lesion size multiplier
    hair: float  # mean number of hairs per image
    jpeg_quality: int
    skin: tuple[float, float]  # skin tone range (0 fair .. 1 tanned)


SITE_PROFILES: dict[str, SiteProfile] = {
    # ViDIR modern: recent polarised dermoscopes, clean and sharp, slightly warm.
    "A": SiteProfile((1.0, 0.97, 0.94), (0.02, 0.0, -0.01), 1.0, 1.08, 0.06, 0.12, 0.0, 1.0, 0.6, 0.012, 1.0, 1.0, 92, (0.0, 0.5)),
    # ViDIR MoleMax: video dermoscopy of nevi under follow-up: cool cast, soft, noisy, ring, small lesions.
    "B": SiteProfile((0.9, 1.0, 1.1), (0.0, 0.02, 0.04), 1.15, 0.9, 0.04, 0.3, 0.85, 0.95, 1.5, 0.03, 0.72, 0.6, 80, (0.0, 0.35)),
    # Rosendahl: older, sun-damaged skin, hairy, strong uneven lighting, warm/red.
    "C": SiteProfile((1.07, 0.95, 0.86), (0.03, -0.01, -0.02), 0.95, 1.0, 0.2, 0.2, 0.0, 1.0, 0.9, 0.02, 1.1, 3.0, 88, (0.3, 0.9)),
    # MSK (ISIC 2017): varied devices, magenta tint, strong vignetting, frequent ring, large lesions.
    "D": SiteProfile((1.03, 0.94, 1.05), (0.01, -0.02, 0.02), 1.05, 1.12, 0.1, 0.45, 0.6, 0.88, 1.0, 0.025, 1.25, 1.5, 85, (0.0, 0.6)),
    # ViDIR legacy (vienna_dias): old scanned dermoscopy slides: yellow, low contrast, blurred, ring.
    "OOD": SiteProfile((1.1, 1.0, 0.8), (0.04, 0.03, -0.03), 1.25, 0.85, 0.2, 0.4, 1.0, 0.8, 2.0, 0.035, 0.9, 1.0, 70, (0.1, 0.5)),
}


FEDERATED_SITES = ("A", "B", "C", "D")


@lru_cache(maxsize=64)  # per (cohort, shift): every image of a cohort asks for it, twice (pixels, JPEG quality)
def shifted(profile: SiteProfile, shift: float) -> SiteProfile:
    """`profile` with its acquisition's departure from the federation's average dermoscope times `shift`.

    The average is taken over the federated cohorts A-D: the geometric mean of the multiplicative settings
    (white balance gains, gamma, contrast, blur, sensor noise, zoom) and the arithmetic mean of the additive
    ones (colour cast, illumination gradient, vignetting, JPEG quality). `shift` 1 is the profile itself,
    0 gives every cohort the same acquisition (only the population differs: skin tones, hair, class mix), 2
    doubles every difference (on the log scale for the multiplicative settings), and so on. The field stop
    (ring) and what is photographed (skin, hair) are not acquisition settings a shift scales."""
    shifting.check_shift(shift)
    if shift == 1:
        return profile
    sites = [SITE_PROFILES[s] for s in FEDERATED_SITES]
    geometric, arithmetic = partial(shifting.geometric, shift), partial(shifting.arithmetic, shift)

    return replace(
        profile,
        gains=tuple(geometric(g, [p.gains[c] for p in sites]) for c, g in enumerate(profile.gains)),
        cast=tuple(arithmetic(v, [p.cast[c] for p in sites], -0.25, 0.25) for c, v in enumerate(profile.cast)),
        gamma=geometric(profile.gamma, [p.gamma for p in sites]),
        contrast=geometric(profile.contrast, [p.contrast for p in sites]),
        illumination=arithmetic(profile.illumination, [p.illumination for p in sites], 0.0, 0.6),
        vignette=arithmetic(profile.vignette, [p.vignette for p in sites], 0.0, 0.9),
        blur=geometric(profile.blur, [p.blur for p in sites]),
        noise=geometric(profile.noise, [p.noise for p in sites]),
        zoom=geometric(profile.zoom, [p.zoom for p in sites]),
        jpeg_quality=round(arithmetic(profile.jpeg_quality, [p.jpeg_quality for p in sites], 20, 100)),
    )


@lru_cache(maxsize=8)
def _grids(height: int, width: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Normalised coordinates (x, y in [-1, 1] scaled to the aspect) and squared radius (1 at the corners)."""
    half_diag = math.hypot(width, height) / 2
    x = ((np.arange(width, dtype=np.float32) + 0.5) - width / 2) / half_diag
    y = ((np.arange(height, dtype=np.float32) + 0.5) - height / 2) / half_diag
    return x[None, :], y[:, None], x[None, :] ** 2 + y[:, None] ** 2


@lru_cache(maxsize=4)
def _noise_tile(height: int, width: int) -> np.ndarray:
    """A fixed noise tile larger than the image; each image takes a random window (cheap, deterministic)."""
    return np.random.default_rng(20220101).standard_normal((3, height + 32, width + 32), dtype=np.float32)


@lru_cache(maxsize=32)
def _ring_mask(height: int, width: int, radius_pct: int) -> Image.Image:
    _, _, r2 = _grids(height, width)
    r = np.sqrt(r2)
    rad = radius_pct / 100
    soft = 0.02
    m = np.clip((rad - r) / soft + 0.5, 0, 1)
    return Image.fromarray((m * 255).astype(np.uint8), "L")


def _tone_lut(gains: np.ndarray, cast: np.ndarray, gamma: float, contrast: float) -> list[int]:
    x = np.arange(256, dtype=np.float64) / 255
    out = []
    for c in range(3):
        y = np.clip(x * gains[c], 0, 1) ** gamma
        y = (y - 0.5) * contrast + 0.5 + cast[c]
        out.append(np.clip(np.rint(y * 255), 0, 255).astype(np.int64))
    return np.concatenate(out).tolist()


def acquire(img: np.ndarray, rng: np.random.Generator, p: SiteProfile) -> Image.Image:
    """Photograph the float scene `img` (3, H, W; modified in place) as the site's device would: uint8 RGB."""
    height, width = img.shape[1:]
    x, y, r2 = _grids(height, width)
    beta = rng.uniform(0, 2 * math.pi)
    g = p.illumination * rng.uniform(0.6, 1.4)
    field = (1 - p.vignette * rng.uniform(0.8, 1.2) * r2) + (g * math.cos(beta)) * x + (g * math.sin(beta)) * y
    field *= 255
    img *= field
    oy, ox = rng.integers(0, 32, 2)
    img += (255 * p.noise) * _noise_tile(height, width)[:, oy : oy + height, ox : ox + width]
    img += 0.5
    np.clip(img, 0, 255, out=img)
    planes = img.astype(np.uint8)
    im = Image.merge("RGB", [Image.fromarray(planes[c], "L") for c in range(3)])
    gains = np.asarray(p.gains) * rng.normal(1, 0.02, 3)
    im = im.point(_tone_lut(gains, np.asarray(p.cast), p.gamma, p.contrast))
    if p.blur > 0:  # one box pass of the same variance: 3x cheaper than PIL's Gaussian on RGB
        sigma = p.blur * width / 600 * rng.uniform(0.8, 1.2)
        im = im.filter(ImageFilter.BoxBlur((math.sqrt(12 * sigma**2 + 1) - 1) / 2))
    if rng.random() < p.ring_p:
        pct = int(round(100 * p.ring_radius * rng.uniform(0.96, 1.04)))
        im = Image.composite(im, Image.new("RGB", im.size, (6, 5, 5)), _ring_mask(height, width, pct))
    return im
