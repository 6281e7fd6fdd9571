"""What a lesion looks like, per class: shape, border, colours, structures (no pixels here).

A lesion lives in its own coordinates (mean border radius 1). Its border is a radius
r(theta) = 1 + random Fourier harmonics: few and small for nevi (round/oval, regular), many and
large for melanoma (asymmetric, irregular), moderate for seborrhoeic keratoses, whose edge is
sharp (stuck-on). Colour comes from a base tint plus Gaussian blobs (many colours for melanoma:
black, dark brown, blue-grey, red, regression white), structures from a pigment network (regular
and faint for nevi, thick, warped and patchy for melanoma), cerebriform fissures (keratoses) and
dots (globules, milia-like cysts, comedo-like openings, peppering). An atypia score whose ranges
overlap between nevi and melanoma keeps the task from being trivial.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import numpy as np

ANGLE_BINS = 720  # resolution of the per-angle lookup tables (border radius, edge width)
_THETA = np.linspace(-math.pi, math.pi, ANGLE_BINS, endpoint=False)

C = {  # reference colours of dermoscopic structures
    "fair_skin": (0.93, 0.76, 0.67),
    "tan_skin": (0.74, 0.52, 0.40),
    "tan": (0.72, 0.56, 0.42),
    "light_brown": (0.62, 0.42, 0.28),
    "brown": (0.46, 0.29, 0.18),
    "dark_brown": (0.28, 0.16, 0.10),
    "black": (0.09, 0.07, 0.07),
    "blue_grey": (0.40, 0.45, 0.55),
    "red": (0.74, 0.33, 0.30),
    "white": (0.88, 0.84, 0.82),
    "pink": (0.80, 0.50, 0.50),
    "milia": (0.95, 0.92, 0.80),
    "grey": (0.45, 0.45, 0.48),
    "hair": (0.12, 0.09, 0.08),
}
COLOURS = {k: np.array(v, np.float32) for k, v in C.items()}
DOT_COLOURS = ("dark_brown", "black", "milia", "grey")


@dataclass(frozen=True)
class LesionSpec:
    """What one lesion looks like; lengths are in lesion units (mean border radius = 1)."""

    kind: str  # nv, bkl, mel or other (a HAM10000 diagnosis outside the task)
    radius: float  # mean radius as a fraction of the shorter image side (before site zoom)
    aspect: float  # major / minor axis ratio (>= 1)
    border: np.ndarray  # (ANGLE_BINS,) border radius per angle
    edge: np.ndarray  # (ANGLE_BINS,) width of the border transition per angle
    base: np.ndarray  # (3,) base colour
    centre_shade: float  # >0: darker centre, <0: lighter centre
    blobs: np.ndarray  # (n, 7): u, v, sigma, strength, r, g, b
    network: float  # pigment-network contrast (0: none)
    net_freq: float  # network cycles per unit length
    net_thick: float  # line half-width in |sin| units
    warp: np.ndarray  # (3, 4): amplitude, fu, fv, phase of sinusoids warping the network / fissures
    broken: float  # 0: continuous network, 1: patchy (atypical)
    fissures: float  # cerebriform ridge contrast (seborrhoeic keratosis)
    dots: np.ndarray  # (n, 4): u, v, radius, colour index into DOT_COLOURS
    opacity: float


def _harmonics(rng: np.random.Generator, amp: float, k_max: int, decay: float, k_min: int = 1) -> np.ndarray:
    k = np.arange(k_min, k_max + 1)
    a = amp * k.astype(np.float64) ** -decay * rng.uniform(0.3, 1.0, k.size)
    phase = rng.uniform(0, 2 * math.pi, k.size)
    return (a[:, None] * np.cos(k[:, None] * _THETA[None, :] + phase[:, None])).sum(0)


def mix_colours(a: str, b: str, t: float) -> np.ndarray:
    return (1 - t) * COLOURS[a] + t * COLOURS[b]


def _blobs(
    rng: np.random.Generator,
    n: int,
    names: list[str],
    p: list[float],
    spread: float,
    sigma: tuple[float, float],
    strength: tuple[float, float],
    centre: tuple[float, float] = (0.0, 0.0),
) -> np.ndarray:
    if n == 0:
        return np.zeros((0, 7), np.float32)
    r = spread * np.sqrt(rng.uniform(0, 1, n))
    a = rng.uniform(0, 2 * math.pi, n)
    cols = np.stack([COLOURS[names[i]] for i in rng.choice(len(names), n, p=p)])
    return np.column_stack(
        [
            centre[0] + r * np.cos(a),
            centre[1] + r * np.sin(a),
            rng.uniform(*sigma, n),
            rng.uniform(*strength, n),
            cols,
        ]
    ).astype(np.float32)


def _dots(rng: np.random.Generator, n: int, q: tuple[float, float], radius: tuple[float, float], colour: int) -> np.ndarray:
    if n == 0:
        return np.zeros((0, 4), np.float32)
    r = np.sqrt(rng.uniform(q[0] ** 2, q[1] ** 2, n))
    a = rng.uniform(0, 2 * math.pi, n)
    return np.column_stack([r * np.cos(a), r * np.sin(a), rng.uniform(*radius, n), np.full(n, colour)]).astype(np.float32)


def _warp(rng: np.random.Generator, amp: float) -> np.ndarray:
    f = rng.uniform(0.8, 2.5, (3, 2)) * rng.choice([-1, 1], (3, 2))
    return np.column_stack([amp * rng.uniform(0.5, 1, 3), f, rng.uniform(0, 2 * math.pi, 3)]).astype(np.float32)


def _edge(rng: np.random.Generator, width: float, variation: float) -> np.ndarray:
    return np.clip(width * (1 + variation * _harmonics(rng, 1.0, 4, 0.5)), 0.012, 0.35).astype(np.float32)


def _border(rng: np.random.Generator, amp: float, k_max: int, decay: float) -> np.ndarray:
    b = 1 + _harmonics(rng, amp, k_max, decay)
    b = np.maximum(b, 0.35)
    return (b / b.mean()).astype(np.float32)


# Dermoscopy is hard because lesions borrow each other's features: pigmented keratoses with
# melanoma colours, melanomas with a nevus' regular outline, irritated nevi with keratosis dots.
# A fraction AMBIGUITY of lesions takes each feature group (outline, colours, structures) from a
# look-alike of another class with probability 1/2, while keeping its own label.
AMBIGUITY = 0.35
LOOK_ALIKES = {"nv": ("mel", "bkl"), "mel": ("nv", "bkl"), "bkl": ("mel", "nv")}
_FEATURE_GROUPS = (
    ("radius", "aspect", "border", "edge"),
    ("base", "centre_shade", "blobs", "opacity"),
    ("network", "net_freq", "net_thick", "warp", "broken", "fissures", "dots"),
)


def sample_lesion(kind: str, rng: np.random.Generator, ambiguity: float | None = None) -> LesionSpec:
    """Draw a lesion of `kind`, sometimes with features of a look-alike class (default AMBIGUITY)."""
    spec = _sample_pure(kind, rng)
    if kind not in LOOK_ALIKES or rng.random() >= (AMBIGUITY if ambiguity is None else ambiguity):
        return spec
    other = _sample_pure(LOOK_ALIKES[kind][int(rng.integers(0, 2))], rng)
    borrowed = {f: getattr(other, f) for group in _FEATURE_GROUPS if rng.random() < 0.5 for f in group}
    return dataclasses.replace(spec, **borrowed)


def _sample_pure(kind: str, rng: np.random.Generator) -> LesionSpec:
    """A typical lesion of `kind`. An atypia score overlaps between nv and mel."""
    no_dots = np.zeros((0, 4), np.float32)
    if kind == "nv":  # round/oval, regular border, uniform brown, faint regular network, few globules
        a = rng.beta(4.0, 4.0) if rng.random() < 0.15 else rng.beta(1.5, 6.0)  # 15% dysplastic-looking
        n_glob = int(rng.integers(4, 14)) if rng.random() < 0.3 else 0
        blue = rng.random() < 0.06  # blue nevus: uniform blue-grey, a colour melanoma also shows
        base = (
            mix_colours("blue_grey", "dark_brown", rng.uniform(0.2, 0.6))
            if blue
            else mix_colours("light_brown", "dark_brown", rng.uniform(0.15, 0.75))
        )
        return LesionSpec(
            kind,
            radius=rng.uniform(0.15, 0.30),
            aspect=1 + abs(rng.normal(0, 0.12)) + 0.15 * a,
            border=_border(rng, 0.03 + 0.12 * a, 6, 1.4),
            edge=_edge(rng, rng.uniform(0.07, 0.14), 0.25),
            base=base * rng.uniform(0.93, 1.07),
            centre_shade=rng.uniform(-0.1, 0.25),
            blobs=_blobs(
                rng,
                rng.poisson(2.5 * a),
                ["brown", "dark_brown", "light_brown"],
                [0.4, 0.3, 0.3],
                0.5,
                (0.2, 0.4),
                (0.2, 0.5),
            ),
            network=rng.uniform(0.15, 0.4) if rng.random() < 0.65 else 0.0,
            net_freq=rng.uniform(9, 14),
            net_thick=rng.uniform(0.25, 0.4),
            warp=_warp(rng, 0.01 + 0.06 * a),
            broken=0.6 * a,
            fissures=0.0,
            dots=_dots(rng, n_glob, (0.0, 0.55), (0.035, 0.055), 0) if n_glob else no_dots,
            opacity=rng.uniform(0.8, 1.0),
        )
    if kind == "mel":  # asymmetric, irregular border, multi-coloured, atypical broken network, peripheral dots
        early = rng.random() < 0.15  # early melanoma: fairly regular, few colours
        a = rng.beta(2.0, 4.0) if early else rng.beta(5.0, 2.5)
        off = tuple(rng.normal(0, 0.2, 2))  # colour asymmetry: blobs crowd on one side
        n_blobs = 1 + rng.poisson(2 * a) if early else 2 + rng.poisson(1 + 3 * a)
        dots = [_dots(rng, int(rng.integers(5, 30)), (0.45, 0.95), (0.015, 0.06), int(rng.integers(0, 2)))]
        if rng.random() < 0.35:  # regression: peppering
            dots.append(_dots(rng, int(rng.integers(10, 40)), (0.0, 0.7), (0.01, 0.025), 3))
        return LesionSpec(
            kind,
            radius=rng.uniform(0.2, 0.40),
            aspect=1 + abs(rng.normal(0, 0.2)) + 0.25 * a,
            border=_border(rng, 0.05 + 0.22 * a, 18, 0.75),
            edge=_edge(rng, rng.uniform(0.03, 0.09), 0.9),
            base=mix_colours("brown", "dark_brown", rng.uniform(0.2, 1.0)) * rng.uniform(0.9, 1.1),
            centre_shade=rng.uniform(-0.2, 0.2),
            blobs=_blobs(
                rng,
                n_blobs,
                ["black", "dark_brown", "blue_grey", "red", "light_brown", "white"],
                [0.25, 0.2, 0.2, 0.12, 0.13, 0.1],
                0.75,
                (0.12, 0.35),
                (0.45, 0.9),
                off,
            ),
            network=rng.uniform(0.3, 0.6) if rng.random() < 0.7 else 0.0,
            net_freq=rng.uniform(6, 12),
            net_thick=rng.uniform(0.3, 0.55),
            warp=_warp(rng, 0.12 + 0.25 * a),
            broken=0.5 + 0.5 * a,
            fissures=0.0,
            dots=np.concatenate(dots),
            opacity=rng.uniform(0.9, 1.0),
        )
    if kind == "bkl":  # lighter tan, waxy/stuck-on, sharp edge, milia-like cysts, comedo-like openings, fissures
        pigmented = rng.random() < 0.2
        base = mix_colours("tan", "brown" if pigmented else "light_brown", rng.uniform(0.0, 0.8))
        gloss = _blobs(rng, int(rng.integers(1, 3)), ["white"], [1.0], 0.5, (0.25, 0.45), (0.1, 0.25))
        mottle = _blobs(rng, int(rng.integers(0, 3)), ["light_brown", "tan", "brown"], [0.4, 0.4, 0.2], 0.6, (0.15, 0.3), (0.2, 0.5))
        dots = np.concatenate(
            [
                _dots(rng, int(rng.integers(4, 20)), (0.0, 0.85), (0.02, 0.045), 2),  # milia-like cysts
                _dots(rng, int(rng.integers(3, 12)), (0.0, 0.85), (0.025, 0.05), int(rng.integers(0, 2))),  # comedo-like openings
            ]
        )
        return LesionSpec(
            kind,
            radius=rng.uniform(0.17, 0.34),
            aspect=1 + abs(rng.normal(0, 0.25)),
            border=_border(rng, 0.05 + 0.06 * rng.random(), 10, 1.0),
            edge=_edge(rng, rng.uniform(0.015, 0.04), 0.3),
            base=base * rng.uniform(0.95, 1.08),
            centre_shade=rng.uniform(-0.15, 0.05),
            blobs=np.concatenate([mottle, gloss]),
            network=0.0,
            net_freq=rng.uniform(3, 6),
            net_thick=0.3,
            warp=_warp(rng, 0.3),
            broken=0.0,
            fissures=rng.uniform(0.12, 0.35),
            dots=dots,
            opacity=rng.uniform(0.75, 0.95),
        )
    if kind == "other":  # bcc/akiec/vasc/df rows of HAM10000: pink-red, soft (only present to be dropped)
        return LesionSpec(
            kind,
            radius=rng.uniform(0.15, 0.3),
            aspect=1 + abs(rng.normal(0, 0.2)),
            border=_border(rng, 0.06, 8, 1.0),
            edge=_edge(rng, 0.15, 0.3),
            base=COLOURS["pink"].copy(),
            centre_shade=0.05,
            blobs=_blobs(rng, 3, ["red", "white"], [0.7, 0.3], 0.6, (0.15, 0.3), (0.3, 0.6)),
            network=0.0,
            net_freq=5.0,
            net_thick=0.3,
            warp=_warp(rng, 0.1),
            broken=0.0,
            fissures=0.0,
            dots=no_dots,
            opacity=rng.uniform(0.6, 0.85),
        )
    raise ValueError(f"unknown lesion kind {kind!r}")
