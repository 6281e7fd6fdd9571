"""What a Fed-ISIC2019 lesion looks like, per class (no pixels here; render.py draws them).

Every lesion is the dermoscopy task's lesion (prrfl.tasks.derm.lesions.LesionSpec: outline, border sharpness,
base tint, colour blobs, pigment network, dots) plus a tuple of structures drawn on top of it, in lesion units
(mean border radius 1):

- Lines: thin straight segments (arborizing vessels);
- Discs: filled ellipses of their own colours (lacunae, blue-grey nests, follicular openings, dotted and
  glomerular vessels, blood spots);
- Patch: an irregular structureless area, optionally flaky or ring-shaped (scar, keratin, crust, scale).

The three pigmented classes are the dermoscopy task's own lesions (melanoma, nevus, benign keratosis, with their
look-alike borrowing); the five others are built here from the dermoscopic criteria a dermatologist reads:

- BCC: a pink, pearly, translucent papule (low opacity: the skin shows through) crossed by arborizing vessels
  (sharp red trees whose branches thin out), with blue-grey ovoid nests and dots (many in the pigmented variant)
  and sometimes a central ulceration (dark red-brown crust); no pigment network.
- AK: a flat, ill-defined (wide, faint border) pink-red erythema; the "strawberry" pattern is the red
  pseudonetwork left between regularly spaced white-yellow follicular openings with pale halos; white-yellow
  surface scale in flakes.
- DF: small to medium, round, light brown with a delicate network that is only seen at the periphery, because a
  central white scar-like patch covers the middle.
- VASC: a sharply demarcated lesion filled with round red, red-purple or dark blue lacunae packed together,
  separated by pale septa; no network.
- SCC: a pink-red nodule whose centre is a structureless white-yellow keratin mass, with glomerular (coiled
  clusters) and dotted vessels and blood spots around it and a rim of white scale at the border.

Every class draws its radius from a range that overlaps the others', so that size alone does not tell the class,
and each has variants that borrow a neighbour's feature (pigmented BCC and AK, DF without a visible scar, SCC with
little keratin), as real lesions do.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from prrfl.tasks.derm.lesions import LesionSpec, _blobs, _border, _edge, _warp, mix_colours, sample_lesion

C = {  # reference colours of the structures drawn here (about sRGB, before the centre's acquisition)
    "erythema": (0.86, 0.47, 0.45),
    "vessel": (0.76, 0.08, 0.14),
    "blood": (0.40, 0.04, 0.07),
    "crust": (0.34, 0.13, 0.08),
    "nest": (0.30, 0.35, 0.48),
    "keratin": (0.96, 0.93, 0.80),
    "keratin_yellow": (0.93, 0.84, 0.56),
    "scale": (0.95, 0.93, 0.87),
    "follicle": (0.98, 0.94, 0.78),
    "halo": (0.93, 0.78, 0.74),
    "scar": (0.96, 0.92, 0.89),
    "septa": (0.86, 0.62, 0.62),
    "lacuna_red": (0.72, 0.08, 0.15),
    "lacuna_purple": (0.48, 0.08, 0.30),
    "lacuna_blue": (0.18, 0.12, 0.34),
    "df_brown": (0.62, 0.44, 0.32),
}
COLOURS = {k: np.array(v, np.float32) for k, v in C.items()}

KINDS = ("MEL", "NV", "BCC", "AK", "BKL", "DF", "VASC", "SCC")
# how often a melanoma, nevus or keratosis borrows a look-alike's features (prrfl.tasks.derm.lesions.AMBIGUITY):
# lower than the dermoscopy task's, so that most lesions show their class's criteria at a glance
AMBIGUITY = 0.25


@dataclass(frozen=True)
class Lines:
    """Thin straight segments of one colour (vessels)."""

    segments: np.ndarray  # (n, 5): u0, v0, u1, v1, width
    colour: np.ndarray  # (3,)
    opacity: float


@dataclass(frozen=True)
class Discs:
    """Filled ellipses, each of its own colour, softened by `soft` (lesion units)."""

    discs: np.ndarray  # (n, 8): u, v, semi-axis u, semi-axis v, angle, r, g, b
    opacity: float
    soft: float


@dataclass(frozen=True)
class Patch:
    """An irregular structureless area centred at (u, v); flaky where `texture` > 0, a ring where `inner` > 0."""

    u: float
    v: float
    radius: float
    border: np.ndarray  # (ANGLE_BINS,) radius multiplier per angle (mean 1)
    edge: float  # width of the transition, lesion units
    colour: np.ndarray  # (3,)
    opacity: float
    texture: float  # 0: uniform, 1: only the flakes remain
    noise: np.ndarray  # (k, k) control values of the flake pattern
    inner: float = 0.0  # > 0: absent inside inner * radius
    coverage: float = 0.5  # fraction of the area the flakes cover


@dataclass(frozen=True)
class IsicLesion:
    """The dermoscopy task's lesion (outline, tint, network, dots) and the structures drawn over it, in order."""

    spec: LesionSpec
    structures: tuple[Lines | Discs | Patch, ...] = ()


def _base(kind: str, rng: np.random.Generator, **fields) -> LesionSpec:
    """A LesionSpec without the pigmented classes' structures (network, fissures, dots) unless given."""
    defaults = {
        "network": 0.0,
        "net_freq": 5.0,
        "net_thick": 0.3,
        "warp": _warp(rng, 0.1),
        "broken": 0.0,
        "fissures": 0.0,
        "dots": np.zeros((0, 4), np.float32),
    }
    return LesionSpec(kind, **{**defaults, **fields})


def _colour(name: str, jitter: float, rng: np.random.Generator) -> np.ndarray:
    return np.clip(COLOURS[name] * rng.uniform(1 - jitter, 1 + jitter, 3), 0, 1).astype(np.float32)


def _scatter(rng: np.random.Generator, n: int, reach: tuple[float, float]) -> np.ndarray:
    """n points (u, v), uniform over the annulus reach[0] <= rho <= reach[1]."""
    r = np.sqrt(rng.uniform(reach[0] ** 2, reach[1] ** 2, n))
    a = rng.uniform(0, 2 * math.pi, n)
    return np.column_stack([r * np.cos(a), r * np.sin(a)])


def _packed(rng: np.random.Generator, spacing: float, reach: float, jitter: float) -> np.ndarray:
    """Points (u, v) on a jittered, randomly rotated hexagonal grid of `spacing`, inside rho < reach."""
    n = int(reach / spacing) + 2
    j, i = np.mgrid[-n : n + 1, -n : n + 1].astype(np.float64)
    p = np.column_stack([((i + 0.5 * (j % 2)) * spacing).ravel(), (j * spacing * 0.866).ravel()])
    p += rng.normal(0, jitter * spacing, p.shape)
    a = rng.uniform(0, math.pi)
    rot = np.array([[math.cos(a), -math.sin(a)], [math.sin(a), math.cos(a)]])
    p = p @ rot.T + rng.uniform(-0.5, 0.5, 2) * spacing
    return p[np.hypot(p[:, 0], p[:, 1]) < reach]


def _discs(points: np.ndarray, ru: np.ndarray, rv: np.ndarray, angle: np.ndarray, colours: np.ndarray) -> np.ndarray:
    if len(points) == 0:
        return np.zeros((0, 8), np.float32)
    return np.column_stack([points, ru, rv, angle, colours]).astype(np.float32)


def _round_discs(
    rng: np.random.Generator, points: np.ndarray, radius: tuple[float, float], colour: np.ndarray, jitter: float
) -> np.ndarray:
    """Roughly round discs of one colour (each jittered by `jitter`) at `points`."""
    n = len(points)
    r = rng.uniform(*radius, n)
    cols = np.clip(colour[None, :] * rng.uniform(1 - jitter, 1 + jitter, (n, 1)), 0, 1)
    return _discs(points, r, r * rng.uniform(0.8, 1.0, n), rng.uniform(0, math.pi, n), cols)


def _patch(
    rng: np.random.Generator,
    *,
    centre: tuple[float, float],
    radius: float,
    irregular: float,
    edge: float,
    colour: np.ndarray,
    opacity: float,
    texture: float,
    grain: int = 8,
    inner: float = 0.0,
    coverage: float = 0.5,
) -> Patch:
    """An irregular patch whose outline has harmonics of relative amplitude `irregular`; `grain` flakes across."""
    noise = rng.standard_normal((grain, grain)).astype(np.float32)
    border = _border(rng, irregular, 8, 1.0)
    return Patch(centre[0], centre[1], radius, border, edge, colour, opacity, texture, noise, inner, coverage)


def _jitter(rng: np.random.Generator, sd: float) -> tuple[float, float]:
    u, v = rng.normal(0, sd, 2)
    return float(u), float(v)


def _tree(rng: np.random.Generator, segments: list, u: float, v: float, angle: float, length: float, width: float, depth: int) -> None:
    """One vessel: three slightly bending sub-segments, then (depth > 0) two thinner, shorter, diverging branches."""
    for _ in range(3):
        angle += rng.normal(0, 0.22)
        u1, v1 = u + length / 3 * math.cos(angle), v + length / 3 * math.sin(angle)
        if math.hypot(u1, v1) > 0.93:
            return
        segments.append((u, v, u1, v1, width))
        u, v = u1, v1
    if depth == 0:
        return
    for sign in (-1.0, 1.0):
        if rng.random() < 0.9:
            turn = sign * rng.uniform(0.35, 0.85)
            _tree(rng, segments, u, v, angle + turn, length * rng.uniform(0.6, 0.8), width * rng.uniform(0.6, 0.75), depth - 1)


def arborizing_vessels(rng: np.random.Generator, trees: int, opacity: float) -> Lines:
    """Branching red vessels: each trunk starts near the border and runs across the lesion, forking 3 times."""
    segments: list = []
    for _ in range(trees):
        phi = rng.uniform(0, 2 * math.pi)
        r0 = rng.uniform(0.55, 0.85)
        heading = phi + math.pi + rng.normal(0, 0.45)  # inwards
        _tree(rng, segments, r0 * math.cos(phi), r0 * math.sin(phi), heading, rng.uniform(0.35, 0.6), rng.uniform(0.02, 0.034), 3)
    seg = np.array(segments, np.float32).reshape(-1, 5)
    return Lines(seg, COLOURS["vessel"] * rng.uniform(0.9, 1.1), opacity)


def blue_grey_nests(rng: np.random.Generator, pigmented: bool) -> Discs:
    """BCC's blue-grey ovoid nests and dots: a few (many when pigmented) scattered over the lesion."""
    n = int(rng.integers(3, 9)) if pigmented else int(rng.poisson(1.2))
    ru = rng.uniform(0.06, 0.15, n)
    colours = np.clip(COLOURS["nest"][None, :] * rng.uniform(0.8, 1.15, (n, 1)), 0, 1)
    nests = _discs(_scatter(rng, n, (0.1, 0.8)), ru, ru * rng.uniform(0.45, 0.8, n), rng.uniform(0, math.pi, n), colours)
    n_dots = int(rng.integers(4, 14)) if pigmented else int(rng.poisson(2))
    dots = _round_discs(rng, _scatter(rng, n_dots, (0.0, 0.85)), (0.02, 0.035), COLOURS["nest"], 0.15)
    return Discs(np.concatenate([nests, dots]), rng.uniform(0.6, 0.9), 0.02)


def crust(rng: np.random.Generator, sd: float, radius: tuple[float, float]) -> Patch:
    """A dark red-brown crust (ulceration, dried blood) near the centre."""
    return _patch(
        rng,
        centre=_jitter(rng, sd),
        radius=rng.uniform(*radius),
        irregular=0.28,
        edge=0.035,
        colour=_colour("crust", 0.12, rng),
        opacity=rng.uniform(0.8, 0.95),
        texture=0.15,
    )


def _bcc(rng: np.random.Generator) -> IsicLesion:
    pigmented = rng.random() < 0.3
    spec = _base(
        "bcc",
        rng,
        radius=rng.uniform(0.14, 0.34),
        aspect=1 + abs(rng.normal(0, 0.18)),
        border=_border(rng, rng.uniform(0.05, 0.12), 8, 1.0),
        edge=_edge(rng, rng.uniform(0.06, 0.14), 0.4),
        base=mix_colours("pink", "white", rng.uniform(0.15, 0.5)) * rng.uniform(0.95, 1.05),  # pearly pink
        centre_shade=rng.uniform(-0.15, 0.0),  # lighter centre
        blobs=_blobs(rng, int(rng.integers(1, 4)), ["white", "pink", "red"], [0.5, 0.3, 0.2], 0.6, (0.2, 0.4), (0.2, 0.5)),
        opacity=rng.uniform(0.5, 0.78),  # translucent
    )
    ulcer = (crust(rng, 0.12, (0.15, 0.32)),) if rng.random() < 0.35 else ()
    vessels = arborizing_vessels(rng, int(rng.integers(2, 5)), rng.uniform(0.8, 1.0))
    return IsicLesion(spec, (*ulcer, blue_grey_nests(rng, pigmented), vessels))


def strawberry(rng: np.random.Generator) -> tuple[Discs, Discs]:
    """AK's follicular openings on a regular grid: pale halos, then white-yellow keratin plugs; the erythema left
    between them is the red pseudonetwork."""
    spacing = rng.uniform(0.15, 0.22)
    pts = _packed(rng, spacing, 0.85, 0.18)
    follicle = spacing * rng.uniform(0.12, 0.18)
    halos = _round_discs(rng, pts, (1.9 * follicle, 2.4 * follicle), COLOURS["halo"], 0.04)
    plugs = _round_discs(rng, pts, (0.7 * follicle, 1.1 * follicle), COLOURS["follicle"], 0.05)
    return Discs(halos, rng.uniform(0.25, 0.45), 0.03), Discs(plugs, rng.uniform(0.6, 0.85), 0.015)


def _ak(rng: np.random.Generator) -> IsicLesion:
    pigmented = rng.random() < 0.15
    blob_names = ["red", "pink", "light_brown"] if pigmented else ["red", "pink"]
    blob_p = [0.4, 0.3, 0.3] if pigmented else [0.6, 0.4]
    spec = _base(
        "ak",
        rng,
        radius=rng.uniform(0.18, 0.38),
        aspect=1 + abs(rng.normal(0, 0.25)),
        border=_border(rng, rng.uniform(0.08, 0.16), 8, 1.0),
        edge=_edge(rng, rng.uniform(0.22, 0.35), 0.3),  # ill-defined, flat
        base=_colour("erythema", 0.06, rng),
        centre_shade=rng.uniform(-0.05, 0.08),
        blobs=_blobs(rng, int(rng.integers(2, 5)), blob_names, blob_p, 0.7, (0.2, 0.4), (0.3, 0.6)),
        opacity=rng.uniform(0.45, 0.7),
    )
    scale = _patch(
        rng,
        centre=_jitter(rng, 0.25),
        radius=rng.uniform(0.35, 0.8),
        irregular=0.2,
        edge=0.1,
        colour=_colour("scale", 0.03, rng),
        opacity=rng.uniform(0.55, 0.85),
        texture=1.0,
        grain=14,
        coverage=rng.uniform(0.3, 0.6),
    )
    return IsicLesion(spec, (*strawberry(rng), scale))


def _df(rng: np.random.Generator) -> IsicLesion:
    spec = _base(
        "df",
        rng,
        radius=rng.uniform(0.12, 0.26),
        aspect=1 + abs(rng.normal(0, 0.12)),
        border=_border(rng, rng.uniform(0.03, 0.07), 6, 1.2),
        edge=_edge(rng, rng.uniform(0.12, 0.22), 0.3),  # faint, fading periphery
        base=_colour("df_brown", 0.06, rng),
        centre_shade=rng.uniform(-0.25, -0.05),
        blobs=_blobs(rng, int(rng.integers(0, 3)), ["light_brown", "tan", "pink"], [0.4, 0.3, 0.3], 0.5, (0.2, 0.4), (0.2, 0.45)),
        opacity=rng.uniform(0.6, 0.85),
        network=rng.uniform(0.3, 0.5),  # delicate: fine and thin; seen at the periphery only, around the scar
        net_freq=rng.uniform(11, 16),
        net_thick=rng.uniform(0.22, 0.32),
        warp=_warp(rng, rng.uniform(0.08, 0.14)),
        broken=0.25,
    )
    scar = _patch(
        rng,
        centre=_jitter(rng, 0.07),
        radius=rng.uniform(0.32, 0.55),
        irregular=0.18,
        edge=rng.uniform(0.08, 0.16),
        colour=_colour("scar", 0.02, rng),
        opacity=rng.uniform(0.75, 0.95) if rng.random() < 0.9 else rng.uniform(0.2, 0.35),  # 10%: a faint scar
        texture=rng.uniform(0.1, 0.3),
    )
    return IsicLesion(spec, (scar,))


def lacunae(rng: np.random.Generator) -> Discs:
    """VASC's lagoons: round, packed on a jittered grid, of one hue per lesion (red, red-purple or dark blue) with
    some spread; the lesion's pale base shows between them as septa."""
    spacing = rng.uniform(0.2, 0.36)
    pts = _packed(rng, spacing, 0.92 - 0.4 * spacing, 0.12)
    n = len(pts)
    t = np.clip(rng.uniform(0, 1) + rng.normal(0, 0.15, n), 0, 1)[:, None]  # 0 red, 0.5 red-purple, 1 dark blue
    colours = np.where(
        t < 0.5,
        (1 - 2 * t) * COLOURS["lacuna_red"] + 2 * t * COLOURS["lacuna_purple"],
        (2 - 2 * t) * COLOURS["lacuna_purple"] + (2 * t - 1) * COLOURS["lacuna_blue"],
    ) * rng.uniform(0.85, 1.1, (n, 1))
    r = 0.5 * spacing * rng.uniform(0.65, 0.95, n)
    return Discs(
        _discs(pts, r, r * rng.uniform(0.8, 1.0, n), rng.uniform(0, math.pi, n), np.clip(colours, 0, 1)), rng.uniform(0.85, 1.0), 0.02
    )


def _vasc(rng: np.random.Generator) -> IsicLesion:
    spec = _base(
        "vasc",
        rng,
        radius=rng.uniform(0.12, 0.3),
        aspect=1 + abs(rng.normal(0, 0.15)),
        border=_border(rng, rng.uniform(0.04, 0.1), 8, 1.0),
        edge=_edge(rng, rng.uniform(0.015, 0.04), 0.3),  # well demarcated
        base=_colour("septa", 0.05, rng),
        centre_shade=0.0,
        blobs=np.zeros((0, 7), np.float32),
        opacity=rng.uniform(0.9, 1.0),
    )
    return IsicLesion(spec, (lacunae(rng),))


def glomerular_vessels(rng: np.random.Generator) -> Discs:
    """SCC's vessels and bleeding around the keratin: coiled clusters of 2-4 red dots (glomerular), single red dots
    (dotted) and a few larger dark red blood spots."""
    clusters = _scatter(rng, int(rng.integers(8, 20)), (0.5, 0.88))
    loops = np.concatenate([c + rng.normal(0, 0.025, (int(rng.integers(2, 5)), 2)) for c in clusters])
    dotted = _scatter(rng, int(rng.integers(3, 12)), (0.45, 0.9))
    vessels = _round_discs(rng, np.concatenate([loops, dotted]), (0.014, 0.026), COLOURS["vessel"], 0.1)
    blood = _round_discs(rng, _scatter(rng, int(rng.integers(1, 6)), (0.3, 0.8)), (0.03, 0.06), COLOURS["blood"], 0.15)
    return Discs(np.concatenate([vessels, blood]), rng.uniform(0.8, 0.95), 0.008)


def _scc(rng: np.random.Generator) -> IsicLesion:
    spec = _base(
        "scc",
        rng,
        radius=rng.uniform(0.15, 0.34),
        aspect=1 + abs(rng.normal(0, 0.18)),
        border=_border(rng, rng.uniform(0.06, 0.14), 10, 1.0),
        edge=_edge(rng, rng.uniform(0.05, 0.12), 0.4),
        base=mix_colours("pink", "red", rng.uniform(0.2, 0.6)) * rng.uniform(0.95, 1.05),
        centre_shade=rng.uniform(-0.1, 0.05),
        blobs=_blobs(rng, int(rng.integers(1, 4)), ["red", "pink"], [0.6, 0.4], 0.7, (0.15, 0.35), (0.3, 0.6)),
        opacity=rng.uniform(0.75, 0.95),
    )
    w = rng.uniform(0, 0.7)  # white to yellow
    keratin = _patch(
        rng,
        centre=_jitter(rng, 0.08),
        radius=rng.uniform(0.2, 0.3) if rng.random() < 0.12 else rng.uniform(0.35, 0.6),  # 12%: little keratin
        irregular=0.22,
        edge=rng.uniform(0.05, 0.1),
        colour=(1 - w) * COLOURS["keratin"] + w * COLOURS["keratin_yellow"],
        opacity=rng.uniform(0.85, 1.0),
        texture=rng.uniform(0.05, 0.25),
    )
    blood_crust = (crust(rng, 0.1, (0.07, 0.15)),) if rng.random() < 0.3 else ()
    scale = _patch(
        rng,
        centre=(0.0, 0.0),
        radius=rng.uniform(1.0, 1.08),
        irregular=0.1,
        edge=0.06,
        colour=_colour("scale", 0.03, rng),
        opacity=rng.uniform(0.5, 0.8),
        texture=1.0,
        grain=22,
        inner=0.78,  # a rim of flakes at the border
        coverage=rng.uniform(0.25, 0.5),
    )
    return IsicLesion(spec, (keratin, *blood_crust, scale, glomerular_vessels(rng)))


_SAMPLERS = {"BCC": _bcc, "AK": _ak, "DF": _df, "VASC": _vasc, "SCC": _scc}


def sample_isic_lesion(kind: str, rng: np.random.Generator) -> IsicLesion:
    """A lesion of class `kind` (one of KINDS); MEL, NV and BKL are the dermoscopy task's own lesions."""
    if kind in ("MEL", "NV", "BKL"):
        return IsicLesion(sample_lesion(kind.lower(), rng, AMBIGUITY))
    if kind not in _SAMPLERS:
        raise ValueError(f"unknown Fed-ISIC2019 lesion class {kind!r}; expected one of {list(KINDS)}")
    return _SAMPLERS[kind](rng)
