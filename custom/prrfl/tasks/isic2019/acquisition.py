"""How each Fed-ISIC2019 centre photographs its lesions, and the artefacts its images carry.

A centre's CentreProfile is the dermoscopy task's SiteProfile (prrfl.tasks.derm.acquisition: white balance, colour
cast, gamma, contrast, illumination gradient, vignetting, black field stop, blur, sensor noise, lesion zoom, hair,
JPEG quality, skin tones) plus what ISIC 2019's sources add: a range of field-stop radii, the rates of ruler marks
and of surgical-marker ink, and the sun damage (solar lentigines) of the centre's population. The four HAM10000
centres and MSK keep the dermoscopy task's profiles of the same cohorts (so both tasks see ViDIR, Rosendahl, MSK
and the scanned Vienna slides alike) with their ISIC 2019 artefacts added; Barcelona (BCN) is new:

- BCN: modern polarised dermoscopy, square crops of a circular field: the black field stop shows as dark corners
  or a full circle; neutral-cool white balance, high contrast, sharp, clean; rulers and ink rarely.
- HAM_vidir_molemax: video dermoscopy of followed-up nevi: soft, noisy, cool cast, small lesions, dark corners.
- HAM_vidir_modern: clean and sharp, slightly warm.
- HAM_rosendahl: older sun-damaged skin (tanned, freckled), hairy, strong uneven lighting, warm-red; rulers.
- MSK: varied devices: magenta tint, strong vignetting, frequent field stop, large lesions; rulers and ink marks.
- HAM_vienna_dias: old scanned slides: yellow, low contrast, blurred, always a ring, low JPEG quality.

Rulers and ink are drawn from a random stream of their own at a rate that depends on the centre only, never on
the lesion's class. `centre_profile(centre, shift)` scales every acquisition setting's departure from the six
centres' average by `shift` (0: one common device, 1: the profiles as written); the population (skin tones, hair,
lentigines) is not an acquisition setting and stays the centre's own.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from functools import lru_cache, partial

import numpy as np
from PIL import Image, ImageDraw, ImageFilter

from prrfl.data import shift as shifting
from prrfl.tasks.derm.acquisition import SITE_PROFILES, SiteProfile


@dataclass(frozen=True)
class CentreProfile:
    site: SiteProfile  # the acquisition the dermoscopy task models (its ring_radius is drawn per image from `ring`)
    ring: tuple[float, float]  # range of the field stop's radius, as a fraction of the half-diagonal
    ruler: float  # probability of ruler marks
    ink: float  # probability of surgical-marker ink beside the lesion
    lentigines: float  # mean number of solar lentigines on the skin around the lesion (population)


CENTRE_PROFILES: dict[str, CentreProfile] = {
    "BCN": CentreProfile(
        SiteProfile(
            gains=(0.96, 1.0, 1.07),  # neutral-cool
            cast=(-0.01, 0.0, 0.02),
            gamma=0.95,
            contrast=1.18,
            illumination=0.04,
            vignette=0.08,
            ring_p=0.8,
            ring_radius=0.8,  # drawn per image from `ring`
            blur=0.35,
            noise=0.008,
            zoom=1.1,
            hair=0.7,
            jpeg_quality=95,
            skin=(0.05, 0.55),
        ),
        ring=(0.66, 0.84),  # on a square frame: a full circle (below 0.71) or dark corners
        ruler=0.04,
        ink=0.03,
        lentigines=0.5,
    ),
    "HAM_vidir_molemax": CentreProfile(replace(SITE_PROFILES["B"], ring_p=0.9), ring=(0.9, 1.0), ruler=0.0, ink=0.0, lentigines=0.3),
    "HAM_vidir_modern": CentreProfile(SITE_PROFILES["A"], ring=(0.95, 1.05), ruler=0.03, ink=0.0, lentigines=0.8),
    "HAM_rosendahl": CentreProfile(SITE_PROFILES["C"], ring=(0.95, 1.05), ruler=0.2, ink=0.02, lentigines=6.0),
    "MSK": CentreProfile(SITE_PROFILES["D"], ring=(0.82, 0.94), ruler=0.3, ink=0.2, lentigines=1.0),
    "HAM_vienna_dias": CentreProfile(SITE_PROFILES["OOD"], ring=(0.62, 0.74), ruler=0.0, ink=0.0, lentigines=0.5),
}


@lru_cache(maxsize=64)  # every image of a centre asks for it
def centre_profile(centre: str, shift: float) -> CentreProfile:
    """The centre's profile with its acquisition's departure from the six centres' average times `shift`.

    Multiplicative settings (white balance gains, gamma, contrast, blur, sensor noise, zoom) move on the log scale
    around their geometric mean, additive ones (cast, illumination gradient, vignetting, field-stop rate and radii,
    ruler and ink rates) around their arithmetic mean (prrfl.data.shift). Skin tones, hair and lentigines are the
    centre's population and JPEG quality is the writer's (render.JPEG_QUALITY): neither is scaled."""
    shifting.check_shift(shift)
    p = CENTRE_PROFILES[centre]
    if shift == 1:
        return p
    profiles = list(CENTRE_PROFILES.values())
    sites = [q.site for q in profiles]
    geometric, arithmetic = partial(shifting.geometric, shift), partial(shifting.arithmetic, shift)
    s = p.site
    site = replace(
        s,
        gains=tuple(geometric(g, [q.gains[c] for q in sites]) for c, g in enumerate(s.gains)),
        cast=tuple(arithmetic(v, [q.cast[c] for q in sites], -0.25, 0.25) for c, v in enumerate(s.cast)),
        gamma=geometric(s.gamma, [q.gamma for q in sites]),
        contrast=geometric(s.contrast, [q.contrast for q in sites]),
        illumination=arithmetic(s.illumination, [q.illumination for q in sites], 0.0, 0.6),
        vignette=arithmetic(s.vignette, [q.vignette for q in sites], 0.0, 0.9),
        ring_p=arithmetic(s.ring_p, [q.ring_p for q in sites], 0.0, 1.0),
        blur=geometric(s.blur, [q.blur for q in sites]),
        noise=geometric(s.noise, [q.noise for q in sites]),
        zoom=geometric(s.zoom, [q.zoom for q in sites]),
    )
    ring = tuple(arithmetic(r, [q.ring[i] for q in profiles], 0.5, 1.5) for i, r in enumerate(p.ring))
    return replace(
        p,
        site=site,
        ring=(min(ring), max(ring)),
        ruler=arithmetic(p.ruler, [q.ruler for q in profiles], 0.0, 1.0),
        ink=arithmetic(p.ink, [q.ink for q in profiles], 0.0, 1.0),
    )


def image_site(profile: CentreProfile, rng: np.random.Generator) -> SiteProfile:
    """The SiteProfile one image is acquired with: the centre's, with this image's field-stop radius."""
    return replace(profile.site, ring_radius=float(rng.uniform(*profile.ring)))


def paint(img: np.ndarray, alpha: np.ndarray, colour: np.ndarray, x0: int = 0, y0: int = 0) -> None:
    """Composite `colour` (3,) into `img` (3, H, W) in place with coverage `alpha` (h, w) placed at (x0, y0)."""
    h, w = alpha.shape
    sub = img[:, y0 : y0 + h, x0 : x0 + w]
    sub += alpha * (np.asarray(colour, np.float32)[:, None, None] - sub)


_ROTATE = (None, Image.Transpose.ROTATE_90, Image.Transpose.ROTATE_180, Image.Transpose.ROTATE_270)


def draw_ruler(img: np.ndarray, rng: np.random.Generator) -> None:
    """Millimetre ruler marks along one edge of `img` (3, H, W), in place: ticks every ~1 mm, longer every 5 and 10,
    on the bare skin (a clear ruler) or on a white band (a printed sticker)."""
    height, width = img.shape[1:]
    side = int(rng.integers(4))
    w, h = (width, height) if side % 2 == 0 else (height, width)  # drawn as if along the top edge, then rotated
    ticks, band = Image.new("L", (w, h), 0), Image.new("L", (w, h), 0)
    dt, db = ImageDraw.Draw(ticks), ImageDraw.Draw(band)
    base = rng.uniform(0.03, 0.1) * h
    tilt = rng.normal(0, 0.04)
    pitch = rng.uniform(6.5, 10.0) * h / 224
    sticker = rng.random() < 0.5
    start = rng.uniform(0, pitch)
    x = np.arange(start, w, pitch)
    k = np.arange(len(x)) + int(rng.integers(10))
    length = np.where(k % 10 == 0, 0.055, np.where(k % 5 == 0, 0.04, 0.022)) * h
    y = base + tilt * (x - w / 2)
    if sticker:
        db.polygon(
            [(0, y[0] - base - 2), (w, y[-1] - base - 2), (w, y[-1] + 0.075 * h), (0, y[0] + 0.075 * h)], fill=int(rng.uniform(170, 230))
        )
    dt.line([(0, base + tilt * (-w / 2)), (w, base + tilt * (w / 2))], fill=230, width=1)
    for xi, yi, li in zip(x, y, length):
        dt.line([(xi, yi), (xi - tilt * li, yi + li)], fill=230, width=1)
    if side:
        ticks, band = ticks.transpose(_ROTATE[side]), band.transpose(_ROTATE[side])
    if sticker:
        paint(img, np.asarray(band.filter(ImageFilter.GaussianBlur(0.6)), np.float32) / 255, np.array([0.93, 0.93, 0.9]))
    paint(img, np.asarray(ticks.filter(ImageFilter.GaussianBlur(0.4)), np.float32) / 255, np.array([0.05, 0.05, 0.06]))


def draw_ink(img: np.ndarray, rng: np.random.Generator, cx: float, cy: float, radius: float) -> None:
    """Violet surgical-marker ink beside a lesion centred at (cx, cy) of `radius` px: an arc or a few dots, in place."""
    height, width = img.shape[1:]
    layer = Image.new("L", (width, height), 0)
    draw = ImageDraw.Draw(layer)
    r = radius * rng.uniform(1.3, 1.8) + 6
    a0 = rng.uniform(0, 2 * math.pi)
    pen = max(2, round(rng.uniform(2.0, 4.0) * height / 224))
    if rng.random() < 0.6:  # an arc of a circle drawn around the lesion
        a = a0 + np.linspace(0, rng.uniform(0.6, 2.0), 24)
        rr = r * (1 + np.cumsum(rng.normal(0, 0.01, 24)))
        draw.line(list(zip(cx + rr * np.cos(a), cy + rr * np.sin(a))), fill=255, width=pen, joint="curve")
    else:  # dots marking the margin
        for a in a0 + np.linspace(0, 2 * math.pi, int(rng.integers(2, 6)), endpoint=False):
            x, y = cx + r * math.cos(a), cy + r * math.sin(a)
            draw.ellipse((x - pen, y - pen, x + pen, y + pen), fill=255)
    alpha = np.asarray(layer.filter(ImageFilter.GaussianBlur(0.8)), np.float32) * (rng.uniform(0.55, 0.85) / 255)
    paint(img, alpha, np.array([0.42, 0.22, 0.56]) * rng.uniform(0.85, 1.1))
