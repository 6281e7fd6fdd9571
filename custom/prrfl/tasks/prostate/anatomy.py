"""A synthetic axial T2-weighted male pelvis at the level of the prostate, sampled per case.

`sample_anatomy` draws one patient (gland size and shape, zonal anatomy, rectum content, body
habitus, bony pelvis); `render` paints it on a grid of axial slices and returns the T2 signal of
each voxel (0 = no signal, 1 = urine) and the whole-gland mask. Coordinates are mm in the
radiological view: x to the viewer's right (the patient's left), y posterior (down the image),
z superior; the origin is the gland's centre.

What is painted, back to front:
* the body outline (rounded, wider posteriorly) with skin, subcutaneous fat (bright) and the
  gluteal cleft;
* the pelvic side wall, modelled as a ring around the pelvic floor: obturator internus (dark
  grey) lining the bone; the bone itself (black cortex, medium marrow): the pubic bodies meeting
  at the symphysis anteriorly, the obturator foramen (obturator externus), the ischium
  posterolaterally, continuous acetabulum at the level of the hips, widening into the pubic arch
  below the apex; lateral to it the hip muscles, the femoral heads in their acetabula with the
  joint cartilage, and the femoral necks; iliopsoas and pectineus anteriorly, gluteus maximus
  posterolaterally, rectus abdominis above the pubis;
* the levator ani, a thin dark sling around the gland and the rectum, with the fat of the
  ischioanal fossae outside it; the coccyx behind the rectum cranially;
* femoral vessels (arterial flow void, slow vein), pelvic vessels, the penile bulb below the apex;
* periprostatic fat with the bright venous plexus (anterior, lateral) and the neurovascular
  bundles (posterolateral);
* the rectum: dark muscular wall, brighter mucosa, lumen collapsed, with gas (black), fluid, an
  air-fluid level, stool (mottled, with gas bubbles), or an endorectal coil's balloon (dark,
  large, flattening the gland); its size follows its content;
* the seminal vesicles (bright, lobulated) and the bladder (urine: the brightest signal, dark
  wall) above the gland; its filling (empty .. full) sets how far it reaches cranially and
  anteriorly and how thick its wall is;
* the gland: a deformed ellipsoid (random smooth harmonics of the outline that drift along z;
  largest just above mid-gland, narrowing to the base and more to the apex; apex tilted
  anteriorly; posterior surface flattened by the rectum) with a bright peripheral zone
  (posterior crescent), a darker heterogeneous transition zone anteriorly (size = degree of
  hyperplasia; nodules of mixed signal with dark rims; a dark surgical capsule), a darker central
  zone at the base, the dark anterior fibromuscular stroma, the urethra with its sphincter at the
  apex, sometimes a dark peripheral-zone focus, and a thin capsule whose conspicuity varies per
  case and fades towards apex and base; the gland's signal is weighted by the share of the slice's
  thickness inside it (through-plane partial volume: soft edges at apex and base, thick slices).
Tissue values are jittered per case and modulated by smooth random textures (coarse and fine).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy import ndimage

# Relative T2 signal (fast spin echo, urine = 1): fluid > fat > peripheral zone > marrow > transition
# zone > muscle > fibrous tissue > cortical bone, air.
TISSUE: dict[str, float] = {
    "fat": 0.74,
    "skin": 0.30,
    "muscle": 0.23,
    "cortex": 0.03,
    "marrow": 0.58,
    "cartilage": 0.30,
    "urine": 1.00,
    "bladder_wall": 0.15,
    "rectal_wall": 0.12,
    "mucosa": 0.36,
    "rectal_fluid": 0.80,
    "balloon": 0.02,
    "pz": 0.60,
    "tz": 0.33,
    "tz_rim": 0.19,
    "afs": 0.15,
    "capsule": 0.11,
    "urethra": 0.45,
    "sv": 0.85,
    "sv_septum": 0.28,
    "vein": 0.85,
    "flow_void": 0.03,
    "slow_vein": 0.25,
    "symphysis": 0.22,
    "bulb": 0.70,
}
RECTAL_RADIUS = {  # outer radius (mm) of the rectum by its content: distended by gas, fluid or stool
    "collapsed": (11.0, 14.0),
    "air": (15.0, 20.0),
    "mixed": (14.0, 19.0),
    "fluid": (14.0, 18.0),
    "stool": (15.0, 20.0),
}
FLUIDS = ("urine", "rectal_fluid", "sv", "vein", "bulb")
WARP_MAX_MM = 8.0  # largest displacement of the smooth deformation applied to the whole anatomy


def gland_profile(t: np.ndarray) -> np.ndarray:
    """In-plane size of the gland at normalised height t (-1 apex .. 1 base): 0 outside, largest just above mid."""
    t = np.clip(t, -1.0, 1.0)
    return np.sqrt(1.0 - t * t) * (1.0 + 0.15 * t)


GLAND_VOLUME_FACTOR = 1.3393  # integral of gland_profile(t)^2 over [-1, 1]: V = factor * pi * a * b * c


@dataclass(frozen=True)
class Grid:
    """Voxel centres of a stack of axial slices, in mm (x right on screen, y posterior, z superior)."""

    xs: np.ndarray  # [W], increasing
    ys: np.ndarray  # [H], increasing
    zs: np.ndarray  # [Z], increasing (slice 0 is the most inferior)

    @classmethod
    def centred(cls, matrix: int, fov: float, slices: int, thickness: float, centre: tuple[float, float, float]) -> Grid:
        d = fov / matrix
        offsets = (np.arange(matrix) - (matrix - 1) / 2) * d
        zo = (np.arange(slices) - (slices - 1) / 2) * thickness
        return cls(centre[0] + offsets, centre[1] + offsets, centre[2] + zo)

    @property
    def shape(self) -> tuple[int, int, int]:
        return len(self.zs), len(self.ys), len(self.xs)

    @property
    def spacing(self) -> tuple[float, float, float]:
        """(dx, dy, dz) in mm."""
        dx, dy, dz = (float(a[1] - a[0]) if len(a) > 1 else 1.0 for a in (self.xs, self.ys, self.zs))
        return dx, dy, dz


@dataclass(frozen=True)
class Anatomy:
    """One synthetic patient. Lengths in mm; `p` scales the bony pelvis."""

    # gland
    semi: tuple[float, float, float]  # a (left-right), b (antero-posterior), c (cranio-caudal)
    angle: float
    tilt: tuple[float, float]  # shift of the in-plane centre per unit of normalised height (x, y)
    harmonics: np.ndarray  # [K, 4]: order, amplitude, phase, drift along t
    flatten: float  # posterior flattening by the rectum
    tz_size: float  # transition zone size (hyperplasia), fraction of the gland
    tz_shift: float  # anterior offset of the transition zone, fraction of b
    nodules: np.ndarray  # [N, 5]: u, v (fractions of the in-plane semi-axes), t, radius mm, value
    lesion: np.ndarray | None  # [5]: u, v, t, radius mm, value (a dark peripheral-zone focus) or None
    plexus: np.ndarray  # [M, 5]: x, y, z, radius, half-length of periprostatic veins
    # surroundings
    p: float
    fat: float  # subcutaneous fat thickness
    body: tuple[float, float, float, float, float]  # centre y, semi-axis x, semi-axis y, exponent, cleft depth
    body_harmonics: np.ndarray  # [K, 3]: order, amplitude, phase
    wall: tuple[float, float, float, float]  # pelvic side wall: centre y, inner semi-axes x and y, phase
    rectum: tuple[float, float, float, float]  # centre x, centre y, outer radius (y), x/y ratio
    rectal_wall: float
    rectal_content: str  # collapsed, air, mixed, fluid, stool, balloon (endorectal coil)
    femoral: tuple[float, float, float, float]  # centre |x|, y, z, radius of the femoral heads
    pubis_y: float  # posterior surface of the symphysis
    bladder: tuple[float, float, float, float, float, float]  # centre x, y, z, semi-axes x, y, z
    bladder_wall: float
    bladder_filling: float  # 0 empty .. 1 full
    capsule: float  # conspicuity of the gland's capsule at mid-gland, 0 (invisible) .. 1 (a clear dark rim)
    capsule_mm: float  # its width
    peri_fat: float  # extent of the periprostatic fat, in gland radii
    values: dict[str, float]  # per-case tissue values

    @property
    def centre(self) -> tuple[float, float, float]:
        """The gland's centre: the origin of the anatomy's coordinates."""
        return (0.0, 0.0, 0.0)


def _uniform(rng: np.random.Generator, lo: float, hi: float) -> float:
    return float(rng.uniform(lo, hi))


def _gland_shape(rng: np.random.Generator, volume_ml: float, endorectal: bool) -> tuple:
    """Semi-axes, outline harmonics and flattening of a gland of `volume_ml`."""
    ratio_b, ratio_c = _uniform(rng, 0.66, 0.80), _uniform(rng, 0.80, 0.95)
    ks = np.arange(2, 6)
    amps = rng.uniform(0.2, 1.0, ks.size) * 0.055 / np.sqrt(ks - 1)
    harmonics = np.stack([ks, amps, rng.uniform(0, 2 * np.pi, ks.size), rng.normal(0, 0.8, ks.size)], axis=1)
    flatten = _uniform(rng, 0.22, 0.32) if endorectal else _uniform(rng, 0.06, 0.16)
    # the volume of the deformed outline: mean squared radius over the angle
    theta = np.linspace(0, 2 * np.pi, 256, endpoint=False)
    radius = 1 + sum(h[1] * np.cos(h[0] * theta + h[2]) for h in harmonics)
    radius = radius - flatten * np.maximum(np.sin(theta), 0) ** 3
    unit_volume = GLAND_VOLUME_FACTOR * math.pi * ratio_b * ratio_c * float(np.mean(radius**2))
    a = (volume_ml * 1000.0 / unit_volume) ** (1 / 3)
    return (a, a * ratio_b, a * ratio_c), harmonics, flatten


def sample_anatomy(rng: np.random.Generator, gland_volume_ml: float, *, endorectal: bool = False) -> Anatomy:
    """Draw one patient whose gland holds about `gland_volume_ml` millilitres."""
    (a, b, c), harmonics, flatten = _gland_shape(rng, gland_volume_ml, endorectal)
    tz_size = _uniform(rng, 0.6, 1.05)
    n_nod = int(2 + rng.poisson(5 * tz_size))
    r_nod, a_nod = rng.uniform(0, 0.8, n_nod) ** 0.5, rng.uniform(0, 2 * np.pi, n_nod)
    nodules = np.stack(
        [
            r_nod * np.cos(a_nod) * 0.7 * tz_size,
            r_nod * np.sin(a_nod) * 0.55 * tz_size - 0.2,
            rng.uniform(-0.35, 0.8, n_nod),
            rng.uniform(3.0, 8.0, n_nod) * (0.6 + 0.5 * tz_size),
            rng.choice([0.16, 0.24, 0.42, 0.55], n_nod) * rng.uniform(0.85, 1.15, n_nod),
        ],
        axis=1,
    )
    lesion = None
    if rng.random() < 0.35:
        ang = math.radians(90 + float(rng.choice([-1, 1])) * _uniform(rng, 25, 70))
        lesion = np.array(
            [0.78 * math.cos(ang), 0.78 * math.sin(ang), _uniform(rng, -0.6, 0.3), _uniform(rng, 3.5, 7.0), _uniform(rng, 0.22, 0.3)]
        )
    n_vein = int(rng.integers(14, 26))
    ang = rng.uniform(math.radians(-170), math.radians(-10), n_vein)  # anterior and lateral (y < 0 is anterior)
    tv = rng.uniform(-0.7, 0.7, n_vein)
    rv = rng.uniform(1.1, 1.4, n_vein) * gland_profile(tv)
    plexus = np.stack(
        [rv * a * np.cos(ang), rv * b * np.sin(ang), tv * c, rng.uniform(0.8, 2.2, n_vein), rng.uniform(4, 12, n_vein)],
        axis=1,
    )

    p = _uniform(rng, 0.92, 1.08)
    fat = _uniform(rng, 10.0, 40.0)
    if endorectal:
        rr, content = _uniform(rng, 21.0, 26.0), "balloon"
    else:
        content = str(rng.choice(list(RECTAL_RADIUS), p=[0.35, 0.15, 0.15, 0.15, 0.2]))
        rr = _uniform(rng, *RECTAL_RADIUS[content])
    rect_y = b * (1 - flatten) + rr + _uniform(rng, 1.0, 3.0)
    ratio = _uniform(rng, 1.15, 1.3) if endorectal else _uniform(rng, 1.05, 1.25)
    rect = (float(rng.normal(0, 2.0)), rect_y, rr, ratio)
    pubis_y = min(-24.0 * p - b, -40.0 * p)
    wall_y = 8.0 * p
    wall = (wall_y, a + _uniform(rng, 22.0, 30.0) * p, wall_y - pubis_y, _uniform(rng, 0, 2 * math.pi))
    y_ant = pubis_y - 18.0 * p - 8.0 - fat
    y_post = rect_y + rr + _uniform(rng, 50.0, 70.0) * p + fat
    body_a = 155.0 * p + fat * _uniform(rng, 0.8, 1.3)
    cleft = _uniform(rng, 25, 45) + 0.5 * fat
    body = ((y_ant + y_post) / 2, body_a, (y_post - y_ant) / 2, _uniform(rng, 2.2, 2.8), cleft)
    bk = np.arange(2, 5)
    body_harmonics = np.stack([bk, rng.uniform(0, 0.02, bk.size), rng.uniform(0, 2 * np.pi, bk.size)], axis=1)

    fem_r = _uniform(rng, 21.0, 25.0) * p
    fx = max(_uniform(rng, 92.0, 102.0) * p, wall[1] + 26.0 * p + fem_r)
    femoral = (fx, wall_y - 6.0 * p, 0.3 * c + _uniform(rng, 6.0, 16.0), fem_r)
    # the bladder floor rests on the base; filling (empty .. full) sets how far it reaches cranially and
    # anteriorly, and thins its wall
    fill = float(rng.beta(1.4, 1.4))
    by, bsz = -0.4 * b - 4.0 - 14.0 * fill, (12.0 + 34.0 * fill) * _uniform(rng, 0.9, 1.1)
    bx, bw = float(rng.normal(0, 3)), (26.0 + 32.0 * fill) * _uniform(rng, 0.9, 1.1)
    bladder = (bx, by, 0.72 * c + bsz, bw, (15.0 + 28.0 * fill) * _uniform(rng, 0.9, 1.1), bsz)
    values = {k: v * float(rng.normal(1.0, 0.04)) for k, v in TISSUE.items()}
    values["pz"] = _uniform(rng, 0.5, 0.64)
    values["tz"] = _uniform(rng, 0.28, 0.38)
    return Anatomy(
        semi=(a, b, c),
        angle=float(rng.normal(0, 0.06)),
        tilt=(float(rng.normal(0, 0.04)), _uniform(rng, 0.1, 0.3)),
        harmonics=harmonics,
        flatten=flatten,
        tz_size=tz_size,
        tz_shift=_uniform(rng, 0.12, 0.25),
        nodules=nodules,
        lesion=lesion,
        plexus=plexus,
        p=p,
        fat=fat,
        body=body,
        body_harmonics=body_harmonics,
        wall=wall,
        rectum=rect,
        rectal_wall=_uniform(rng, 2.8, 4.0) if not endorectal else _uniform(rng, 1.8, 2.5),
        rectal_content=content,
        femoral=femoral,
        pubis_y=pubis_y,
        bladder=bladder,
        bladder_wall=(2.0 + 3.0 * (1 - fill)) * _uniform(rng, 0.85, 1.15),
        bladder_filling=fill,
        capsule=float(rng.uniform(0.15, 1.0)),
        capsule_mm=_uniform(rng, 0.7, 1.5),
        peri_fat=_uniform(rng, 1.15, 1.6),
        values=values,
    )


@dataclass(frozen=True)
class _Region:
    sl: tuple[slice, slice, slice]
    X: np.ndarray  # [z, h, w] (displaced) x of each voxel
    Y: np.ndarray  # [z, h, w] (displaced) y
    Z: np.ndarray  # [z, 1, 1]


class _Canvas:
    """Signal and texture-amplitude maps over a grid, painted region by region (later paint wins)."""

    def __init__(self, grid: Grid, tex_coarse: np.ndarray, tex_fine: np.ndarray, warp: tuple[np.ndarray, np.ndarray]):
        self.grid = grid
        self.value = np.zeros(grid.shape, np.float32)
        self.amp_coarse = np.zeros(grid.shape, np.float32)
        self.amp_fine = np.zeros(grid.shape, np.float32)
        self.tex_coarse, self.tex_fine = tex_coarse, tex_fine
        # every structure is evaluated at smoothly displaced coordinates: organic, asymmetric shapes
        self.X = grid.xs.astype(np.float32)[None, None, :] + warp[0]
        self.Y = grid.ys.astype(np.float32)[None, :, None] + warp[1]

    def region(self, x0: float, x1: float, y0: float, y1: float, z0: float = -math.inf, z1: float = math.inf) -> _Region | None:
        """The sub-grid inside the box (None when empty), widened by the largest displacement."""
        g = self.grid
        x0, x1, y0, y1 = x0 - WARP_MAX_MM, x1 + WARP_MAX_MM, y0 - WARP_MAX_MM, y1 + WARP_MAX_MM
        i0, i1 = np.searchsorted(g.xs, x0), np.searchsorted(g.xs, x1, side="right")
        j0, j1 = np.searchsorted(g.ys, y0), np.searchsorted(g.ys, y1, side="right")
        k0, k1 = np.searchsorted(g.zs, z0), np.searchsorted(g.zs, z1, side="right")
        if i0 >= i1 or j0 >= j1 or k0 >= k1:
            return None
        sl = (slice(k0, k1), slice(j0, j1), slice(i0, i1))
        return _Region(sl, self.X[sl], self.Y[sl], g.zs[k0:k1].astype(np.float32)[:, None, None])

    def around(self, cx: float, cy: float, r: float, z0: float = -math.inf, z1: float = math.inf) -> _Region | None:
        return self.region(cx - r, cx + r, cy - r, cy + r, z0, z1)

    def paint(self, reg: _Region, where: np.ndarray, value: float | np.ndarray, coarse: float = 0.03, fine: float = 0.03) -> None:
        shape = self.value[reg.sl].shape
        where = np.broadcast_to(where, shape)
        for target, v in ((self.value, value), (self.amp_coarse, coarse), (self.amp_fine, fine)):
            np.copyto(target[reg.sl], np.broadcast_to(np.asarray(v, np.float32), shape), where=where)

    def signal(self) -> np.ndarray:
        out = self.value * (1 + self.amp_coarse * self.tex_coarse + self.amp_fine * self.tex_fine)
        return np.maximum(out, 0, out=out)


def _ellipse(
    reg: _Region,
    cx: float | np.ndarray,
    cy: float | np.ndarray,
    ax: float | np.ndarray,
    ay: float | np.ndarray,
    angle: float = 0.0,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Normalised radius (1 on the outline) and the local coordinates (u along the rotated x axis, v)."""
    dx, dy = reg.X - cx, reg.Y - cy
    if angle:
        c, s = math.cos(angle), math.sin(angle)
        dx, dy = dx * c + dy * s, -dx * s + dy * c
    return np.sqrt((dx / ax) ** 2 + (dy / ay) ** 2), dx, dy


def _sphere_radius(z: np.ndarray, zc: float, r: float) -> np.ndarray:
    return np.sqrt(np.maximum(r * r - (z - zc) ** 2, 0.0))


def _ramp(x: np.ndarray | float, lo: float, hi: float) -> np.ndarray:
    """0 below lo, 1 above hi, linear between."""
    return np.clip((np.asarray(x) - lo) / (hi - lo), 0.0, 1.0)


def _upsample(arr: np.ndarray, n_out: int, axis: int) -> np.ndarray:
    """Linear interpolation of `arr` along `axis` to `n_out` samples, pixel centres aligned (scipy's grid_mode)."""
    n_in = arr.shape[axis]
    pos = np.clip((np.arange(n_out) + 0.5) * (n_in / n_out) - 0.5, 0, n_in - 1)
    lo = np.minimum(np.floor(pos).astype(np.intp), n_in - 2)
    frac = (pos - lo).astype(np.float32)
    shape = [1] * arr.ndim
    shape[axis] = n_out
    frac = frac.reshape(shape)
    return np.take(arr, lo, axis=axis) * (1 - frac) + np.take(arr, lo + 1, axis=axis) * frac


def smooth_noise(rng: np.random.Generator, grid: Grid, sigma_mm: float) -> np.ndarray:
    """Unit-variance smooth random field on the grid (correlation length about `sigma_mm`), float32.

    White noise on a grid of sigma/2 mm (or the pixel size), Gaussian-smoothed there, then
    linearly interpolated to the pixels.
    """
    dx, _, dz = grid.spacing
    z, h, w = grid.shape
    step = max(sigma_mm / 2.0, dx)
    ch = max(2, int(math.ceil((grid.ys[-1] - grid.ys[0]) / step)) + 1)
    cw = max(2, int(math.ceil((grid.xs[-1] - grid.xs[0]) / step)) + 1)
    coarse = rng.standard_normal((z, ch, cw), dtype=np.float32)
    coarse = ndimage.gaussian_filter(coarse, (sigma_mm / max(dz, 1e-3) / 2, 1.5, 1.5), mode="wrap")
    coarse /= max(float(coarse.std()), 1e-6)
    return np.ascontiguousarray(_upsample(_upsample(coarse, h, 1), w, 2), dtype=np.float32)


def render(
    anat: Anatomy, grid: Grid, rng: np.random.Generator, *, fat_gain: float = 1.0, fluid_gain: float = 1.0
) -> tuple[np.ndarray, np.ndarray]:
    """(signal float32 [Z,H,W] >= 0, gland mask bool [Z,H,W]) of `anat` on `grid`.

    `fat_gain` and `fluid_gain` scale the fat and fluid signals (a sequence's contrast); `rng`
    draws the texture fields only.
    """
    warp_mm = float(rng.uniform(2.0, 4.0))
    warp = tuple(np.clip(warp_mm * smooth_noise(rng, grid, 22.0), -WARP_MAX_MM, WARP_MAX_MM) for _ in range(2))
    cv = _Canvas(grid, smooth_noise(rng, grid, 8.0), smooth_noise(rng, grid, 1.6), warp)  # type: ignore[arg-type]
    septa = smooth_noise(rng, grid, 5.0)
    planes = smooth_noise(rng, grid, 14.0)
    val = dict(anat.values)
    val["fat"] *= fat_gain
    val["marrow"] *= 0.5 + 0.5 * fat_gain  # fatty marrow follows fat
    for k in FLUIDS:
        val[k] *= fluid_gain
    deep = _body(cv, anat, val, septa)
    _pelvic_wall(cv, anat, val, deep)
    _hips(cv, anat, val, deep)
    _fat_planes(cv, val, planes)
    _pelvic_floor(cv, anat, val)
    _vessels(cv, anat, val)
    _periprostatic(cv, anat, val)
    _rectum(cv, anat, val)
    _seminal_vesicles(cv, anat, val)
    _bladder(cv, anat, val)
    mask = _gland(cv, anat, val)
    return cv.signal(), mask


def _thin_line(grid: Grid) -> tuple[float, float]:
    """(width factor, contrast) of sub-millimetre lines at this pixel size: wider than a pixel and
    fainter on coarse grids (partial volume), so they stay continuous instead of breaking up."""
    dx = grid.spacing[0]
    return max(1.0, dx / 0.6), min(1.0, 0.6 / dx)


def body_outline(an: Anatomy, X: np.ndarray, Y: np.ndarray, Z: np.ndarray | float) -> tuple[np.ndarray, np.ndarray]:
    """(normalised radius, < 1 inside the skin; angle) of the body outline at (X, Y, Z) mm."""
    yc, ba, bb, expo, _ = an.body
    dx, dy = X, Y - yc
    theta = np.arctan2(dy / bb, dx / ba)
    wobble = 1 + sum(h[1] * np.cos(h[0] * theta + h[2]) for h in an.body_harmonics)
    width = ba * (0.9 + 0.1 * _ramp(dy, -bb, 0.3 * bb)) * (1 + 0.0015 * Z)  # narrower anteriorly
    rho = ((np.abs(dx) / width) ** expo + (np.abs(dy) / bb) ** expo) ** (1 / expo) / wobble
    return rho, theta


def body_wall_signal(an: Anatomy, X: np.ndarray, Y: np.ndarray, Z: np.ndarray | float) -> np.ndarray:
    """A coarse T2 signal of the body wall at (X, Y, Z) mm: skin, subcutaneous fat, then muscle, 0 outside.

    Used for what lies outside a slice's field of view (wrap-around), where the full render is not run.
    """
    rho, theta = body_outline(an, X, Y, Z)
    bb = an.body[2]
    fat_t = an.fat * (1 + 0.3 * np.cos(2 * theta + an.body_harmonics[0, 2]))
    out = np.where(rho < 1 - fat_t / bb, an.values["muscle"], an.values["fat"])
    out = np.where(rho > 1 - 1.8 / bb, an.values["skin"], out)
    return np.where(rho < 1, out, 0.0).astype(np.float32)


def _body(cv: _Canvas, an: Anatomy, val: dict[str, float], septa: np.ndarray) -> np.ndarray:
    """Paint the body, skin, subcutaneous fat (with fibrous septa and small vessels: the zero lines of
    a smooth random field) and cleft; returns the deep (sub-fascial) region [Z,H,W]."""
    yc, ba, bb, expo, cleft = an.body
    deep = np.zeros(cv.grid.shape, bool)
    reg = cv.region(-ba - 5, ba + 5, yc - bb - 5, yc + bb + 5)
    if reg is None:
        return deep
    rho, theta = body_outline(an, reg.X, reg.Y, reg.Z)
    cv.paint(reg, rho < 1, val["fat"], 0.025, 0.03)
    patchy = cv.tex_coarse[reg.sl] > 0.0
    width, contrast = _thin_line(cv.grid)
    cv.paint(reg, (rho < 1) & patchy & (np.abs(septa[reg.sl]) < 0.045 * width), val["fat"] * (1 - 0.45 * contrast))
    cv.paint(reg, (rho < 1) & (rho > 1 - 1.8 / bb), val["skin"], 0.05, 0.05)
    fat_t = an.fat * (1 + 0.3 * np.cos(2 * theta + an.body_harmonics[0, 2]))
    inner = rho < 1 - fat_t / bb
    # gluteal cleft: a narrow wedge of air from the posterior skin inwards, lined by skin
    depth = (reg.Y - (yc + bb - cleft)) / cleft
    half = 0.4 + 1.2 * np.clip(depth, 0, None)
    cv.paint(reg, (np.abs(reg.X) < half + 1.8) & (depth > 0) & (rho < 1), val["skin"], 0.05, 0.05)
    cv.paint(reg, (np.abs(reg.X) < half) & (depth > 0.05), 0.0, 0.0, 0.0)
    inner = inner & ~(np.abs(reg.X) < half + 1.6 * an.fat * _ramp(depth, -0.6, 0.3))  # buttock fat at the cleft
    deep[reg.sl] = inner
    return deep


def _wall_frame(reg: _Region, an: Anatomy) -> tuple[np.ndarray, ...]:
    """The pelvic side wall around a voxel: normalised radius (1 = inner surface of the bone), angle
    in degrees (symmetric: -90 anterior at the symphysis, 0 lateral, +90 posterior), the local
    half-width (mm) and the widening of the pubic arch below the apex (0..1). The outline is a
    rounded triangle, narrow at the symphysis, widest at the ischial spines."""
    wy, ww, wh, ph = an.wall
    c = an.semi[2]
    below = _ramp(-reg.Z, c + 2, c + 22)
    dy = reg.Y - wy
    width = (ww + 18.0 * below) * (0.62 + 0.38 * _ramp(dy, -wh, 0.0))
    theta = np.arctan2(dy / wh, np.abs(reg.X) / width)
    rho = np.sqrt((reg.X / width) ** 2 + (dy / wh) ** 2) / (1 + 0.025 * np.cos(3 * theta + ph))
    return rho, np.degrees(theta), width, below


def _segment(th: np.ndarray, start: float | np.ndarray, end: float | np.ndarray, taper_start: bool | np.ndarray) -> np.ndarray:
    """Relative thickness (0 outside, 0.2 at the ends, 1 in the middle) of a bone spanning angles start..end."""
    width = 0.35 * (np.asarray(end) - np.asarray(start))
    e1 = np.where(taper_start, np.clip((th - start) / width, 0, 1), (th >= start).astype(np.float32))
    e2 = np.clip((end - th) / width, 0, 1)
    prof = 0.2 + 0.8 * np.sqrt(np.sin(np.pi / 2 * e1) * np.sin(np.pi / 2 * e2))
    return np.where((th >= start) & (th <= end), prof, 0.0)


def _pelvic_wall(cv: _Canvas, an: Anatomy, val: dict[str, float], deep: np.ndarray) -> None:
    wy, ww, wh, _ = an.wall
    p, c = an.p, an.semi[2]
    ext = ww + 60
    reg = cv.region(-ext, ext, wy - wh - 30, wy + wh + 10)
    if reg is None:
        return
    rho, th, ww_z, below = _wall_frame(reg, an)
    hip = _ramp(reg.Z, 0.2 * c, 0.6 * c)  # acetabular level: a continuous bony wall
    d_mm = (rho - 1) * ww_z  # distance outside the inner bone surface, roughly in mm (laterally exact)
    d_ant = (rho - 1) * wh
    d = np.where(th < -45, d_ant, d_mm)
    in_deep = deep[reg.sl]
    # hip muscle mass lateral to the wall (external rotators, glutei medius/minimus), behind the femoral vessels
    fx, fy = an.femoral[0], an.femoral[1]
    for side in (-1, 1):
        r, _, _ = _ellipse(reg, side * (fx + 5 * p), fy + 28 * p, 62 * p, 58 * p, side * math.radians(-20))
        cv.paint(reg, in_deep & (d > 0) & (r < 1), val["muscle"], 0.06, 0.14)
    # bone: pubis anteriorly, ischium posterolaterally, a continuous acetabular wall at the hips; each
    # segment thickest in its middle (the pubis at the symphysis), tapering to its ends
    thick = (16.0 + 8.0 * hip + 6.0 * below) * p
    lo = -90.0 + 34.0 * hip + 45.0 * below  # the symphysis ends at the apex, the pubic arch opens below
    joined = hip >= 0.5
    pubis = _segment(th, lo, np.where(joined, 50.0, -40.0), taper_start=below > 0.05)
    ischium = np.where(joined, 0.0, _segment(th, -12.0, 50.0, taper_start=True))
    depth = thick * np.maximum(pubis, ischium)
    bone = (d > 0) & (d < depth)
    cortex = 2.2
    marrow = bone & (d > cortex) & (d < depth - cortex)
    foramen = (th > -40) & (th < -12) & ~joined
    cv.paint(reg, in_deep & (d > 0) & (d < 14 * p) & foramen, val["muscle"], 0.06, 0.14)  # obturator externus
    cv.paint(reg, bone, val["cortex"], 0.0, 0.05)
    cv.paint(reg, marrow, val["marrow"], 0.1, 0.16)
    symph = (np.abs(reg.X) < 2.4) & (d > 0) & (d < thick) & (th < -80)
    cv.paint(reg, symph, val["symphysis"], 0.0, 0.05)
    # obturator internus lining the wall from the pubis to behind the ischium
    taper = _ramp(th, -78, -55) * _ramp(-th, -58, -35)
    oi = (d < 0) & (d > -12.0 * p * taper) & (taper > 0.05)
    cv.paint(reg, oi, val["muscle"], 0.05, 0.12)


def _hips(cv: _Canvas, an: Anatomy, val: dict[str, float], deep: np.ndarray) -> None:
    p, c = an.p, an.semi[2]
    fx, fy, fz, fr = an.femoral
    for side in (-1, 1):
        cx = side * fx
        # iliopsoas anterior to the hip joint, pectineus lower and more medial
        reg = cv.around(cx - side * 10 * p, fy - 36 * p, 26 * p)
        if reg is not None:
            upper = _ramp(reg.Z, fz - 20, fz - 5)
            mx = cx - side * (10 + 14 * (1 - upper)) * p
            r, _, _ = _ellipse(reg, mx, fy - 36 * p, 20 * p, 12 * p, side * math.radians(20))
            cv.paint(reg, (r < 1) & deep[reg.sl], val["muscle"], 0.05, 0.12)
        # femoral neck and greater trochanter, below and lateral to the head
        reg = cv.around(cx + side * 30 * p, fy + 4, 42 * p, fz - fr - 28, fz + 0.3 * fr)
        if reg is not None:
            r, _, _ = _ellipse(reg, cx + side * 30 * p, fy + 4, 36 * p, 13 * p, side * math.radians(-10))
            cv.paint(reg, r < 1, val["cortex"], 0.0, 0.05)
            cv.paint(reg, r < 1 - 2.6 / (13 * p), val["marrow"], 0.1, 0.16)
        # femoral head in the acetabular cup, with the joint cartilage
        reg = cv.around(cx, fy, 1.5 * fr + 2, fz - fr, fz + fr)
        if reg is not None:
            rz = np.maximum(_sphere_radius(reg.Z, fz, fr), 1e-3)
            present = rz > 1.0
            r, du, _ = _ellipse(reg, cx, fy, rz, rz)
            cup = present & (reg.Z > fz - 0.55 * fr) & (side * du < -0.15 * rz) & (r < 1 + 11.0 / rz)
            cv.paint(reg, cup, val["cortex"], 0.0, 0.05)
            cv.paint(reg, cup & (r > 1 + 4.0 / rz) & (r < 1 + 8.5 / rz), val["marrow"], 0.1, 0.16)
            cv.paint(reg, present & (r < 1 + 1.8 / rz), val["cartilage"], 0.0, 0.05)
            cv.paint(reg, present & (r < 1), val["cortex"], 0.0, 0.05)
            cv.paint(reg, present & (r < 1 - 2.2 / rz), val["marrow"], 0.1, 0.16)
    # gluteus maximus posterolaterally; rectus abdominis above the pubis
    wy, ww, wh, _ = an.wall
    for side in (-1, 1):
        gx, gy = side * (ww + 10 * p), wy + 0.9 * wh + 14 * p
        reg = cv.around(gx, gy, 70 * p)
        if reg is not None:
            r, _, _ = _ellipse(reg, gx, gy, 64 * p, 24 * p, side * math.radians(-33))
            cv.paint(reg, deep[reg.sl] & (r < 1), val["muscle"], 0.06, 0.18)
        y_r = an.body[0] - an.body[2] + an.fat + 7
        reg = cv.around(side * 20, y_r, 18, 0.1 * c, math.inf)
        if reg is not None:
            r, _, _ = _ellipse(reg, side * 20, y_r, 16, 6.5)
            cv.paint(reg, r < 1, val["muscle"], 0.05, 0.1)


def _fat_planes(cv: _Canvas, val: dict[str, float], planes: np.ndarray) -> None:
    """Thin fat planes between the muscles (bright lines through the dark muscle mass)."""
    muscle = np.abs(cv.value - val["muscle"]) < 1e-6
    width, contrast = _thin_line(cv.grid)
    lines = muscle & (np.abs(planes) < 0.05 * width) & (cv.tex_coarse > -0.3)
    cv.value[lines] = val["muscle"] + (val["fat"] * 0.9 - val["muscle"]) * contrast
    cv.amp_fine[lines] = 0.1


def _pelvic_floor(cv: _Canvas, an: Anatomy, val: dict[str, float]) -> None:
    """Levator ani around the gland and rectum; coccyx behind the rectum cranially."""
    a, b, c = an.semi
    p = an.p
    rx, ry, rr, _ = an.rectum
    y_back = ry + rr + 6
    reg = cv.region(-a - 30, a + 30, -b - 10, y_back + 15, -math.inf, 0.4 * c)
    if reg is not None:
        shrink = _ramp(-reg.Z, 0, 1.5 * c)
        la = a + 10 * p - 8 * shrink
        cy = 6.0
        lb = y_back - cy - 4 * shrink
        r, du, dv = _ellipse(reg, 0, cy, la, lb)
        r = r / (1 + 0.03 * np.cos(3 * np.arctan2(dv, du) + 0.8))
        band = np.abs(r - 1) * np.minimum(la, lb) < 2.2
        cv.paint(reg, band & (dv > -0.25 * lb), val["muscle"], 0.05, 0.12)
    cyc = ry + rr + 24 * p
    reg = cv.around(0, cyc + 10, 20, 0.4 * c, math.inf)
    if reg is not None:
        r, _, _ = _ellipse(reg, 0, cyc + 0.3 * (reg.Z - 0.4 * c), 10, 6.5)
        cv.paint(reg, r < 1, val["cortex"], 0.0, 0.05)
        cv.paint(reg, r < 1 - 1.8 / 6.5, val["marrow"], 0.1, 0.16)


def _vessels(cv: _Canvas, an: Anatomy, val: dict[str, float]) -> None:
    a, b, c = an.semi
    p = an.p
    fx, fy, fz, fr = an.femoral
    wy, ww, wh, _ = an.wall
    for side in (-1, 1):
        for dxv, rad, kind in ((-2, 4.0, "flow_void"), (-13, 5.0, "slow_vein")):
            cx, cy = side * (fx - fr + dxv * p), fy - fr - 18 * p
            reg = cv.around(cx, cy, rad + 1)
            if reg is not None:
                r, _, _ = _ellipse(reg, cx, cy, rad, rad)
                cv.paint(reg, r < 1, val[kind], 0.0, 0.05)
        # internal pudendal / obturator vessels along the inner side of obturator internus
        for k in range(3):
            cx, cy = side * (ww - 15 * p), wy - 18 + 14 * k
            reg = cv.around(cx, cy, 3.5)
            if reg is not None:
                r, _, _ = _ellipse(reg, cx, cy, 1.8 + 0.4 * k, 1.8 + 0.4 * k)
                cv.paint(reg, r < 1, val["vein"] if k != 1 else val["flow_void"], 0.0, 0.05)
    # penile bulb below the apex, with its dark tunica
    reg = cv.around(0, -0.1 * b, 16, -math.inf, -c - 4)
    if reg is not None:
        grow = _ramp(-c - 4 - reg.Z, 0, 10)
        r, _, _ = _ellipse(reg, 0, -0.1 * b, 3 + 9 * grow, 2 + 8 * grow)
        present = grow > 0.05
        cv.paint(reg, present & (r < 1), val["bladder_wall"], 0.03, 0.06)
        cv.paint(reg, present & (r < 0.8), val["bulb"], 0.06, 0.1)


def _gland_frame(reg: _Region, an: Anatomy) -> tuple[np.ndarray, ...]:
    """Per voxel: normalised height t, the in-plane local coordinates u, v (mm) and semi-axes A, B at t."""
    a, b, c = an.semi
    t = reg.Z / c
    s = gland_profile(t)
    cx, cy = an.tilt[0] * c * t, an.tilt[1] * c * t
    ca, sa = math.cos(an.angle), math.sin(an.angle)
    dx, dy = reg.X - cx, reg.Y - cy
    u, v = dx * ca + dy * sa, -dx * sa + dy * ca
    return t, u, v, np.maximum(a * s, 1e-3), np.maximum(b * s, 1e-3)


def _gland_radius(an: Anatomy, t: np.ndarray, u: np.ndarray, v: np.ndarray, A: np.ndarray, B: np.ndarray) -> np.ndarray:
    """Normalised radius (< 1 inside the gland) of the deformed outline."""
    theta = np.arctan2(v / B, u / A)
    outline = 1.0 + sum(h[1] * np.cos(h[0] * theta + h[2] + h[3] * t) for h in an.harmonics)
    outline = outline - an.flatten * np.maximum(np.sin(theta), 0.0) ** 3
    return np.sqrt((u / A) ** 2 + (v / B) ** 2) / outline


def _occupancy(an: Anatomy, t: np.ndarray, radius: np.ndarray, thickness: float) -> np.ndarray:
    """Through-plane partial volume: the share of each voxel's slice thickness (a flat slice profile,
    sampled at its centre and a third of the thickness above and below) inside the gland; where the
    outline changes fast along z (apex, base) the edge becomes a soft ramp, at mid-gland it stays
    sharp. `radius`: the voxel's radius relative to the gland's largest outline (inside at height t
    where radius < gland_profile(t); the outline's slow drift over a third of a slice is neglected)."""
    out = np.zeros(np.broadcast_shapes(t.shape, radius.shape), np.float32)
    for f in (-1 / 3, 0.0, 1 / 3):
        tf = t + f * thickness / an.semi[2]
        out += (radius < gland_profile(tf)) & (np.abs(tf) < 1)
    return out / 3


def gland_occupancy(an: Anatomy, grid: Grid) -> tuple[np.ndarray, np.ndarray]:
    """(partial-volume occupancy [Z,H,W] in 0..1, gland mask at the slices' centres [Z,H,W]) of the
    undeformed gland on `grid` (the render adds the smooth deformation)."""
    X = grid.xs.astype(np.float32)[None, None, :] + np.zeros((1, len(grid.ys), 1), np.float32)
    Y = grid.ys.astype(np.float32)[None, :, None] + np.zeros((1, 1, len(grid.xs)), np.float32)
    reg = _Region((slice(None),) * 3, X, Y, grid.zs.astype(np.float32)[:, None, None])
    t, u, v, _, _ = _gland_frame(reg, an)
    radius = _gland_radius(an, t, u, v, an.semi[0], an.semi[1])
    return _occupancy(an, t, radius, grid.spacing[2]), (radius < gland_profile(t)) & (np.abs(t) < 1)


def _periprostatic(cv: _Canvas, an: Anatomy, val: dict[str, float]) -> None:
    a, b, c = an.semi
    reg = cv.region(-1.6 * a - 5, 1.6 * a + 5, -1.6 * b - 8, 1.6 * b, -1.05 * c, 1.05 * c)
    if reg is None:
        return
    t, u, v, A, B = _gland_frame(reg, an)
    rho = _gland_radius(an, t, u, v, A, B)
    cv.paint(reg, (rho < an.peri_fat) & (np.abs(t) < 1) & (v < 0.8 * B), val["fat"], 0.03, 0.04)
    for x, y, z, rad, length in an.plexus:
        rv = cv.around(x, y, rad + 1, z - length, z + length)
        if rv is not None:
            r = np.sqrt(((rv.X - x) / rad) ** 2 + ((rv.Y - y) / rad) ** 2 + ((rv.Z - z) / length) ** 2)
            cv.paint(rv, r < 1, val["vein"], 0.0, 0.1)
    # neurovascular bundles, posterolateral (5 and 7 o'clock)
    for side in (-1, 1):
        ang = math.radians(90 - side * 55)
        x, y = 1.08 * a * math.cos(ang), 1.02 * b * math.sin(ang) * (1 - 0.5 * an.flatten)
        rv = cv.around(x, y, 4, -0.9 * c, 0.8 * c)
        if rv is not None:
            s = gland_profile(rv.Z / c)
            r = np.sqrt((rv.X - x * s) ** 2 + (rv.Y - y * s) ** 2)
            cv.paint(rv, r < 2.6, val["slow_vein"], 0.0, 0.1)
            cv.paint(rv, r < 1.2, val["flow_void"], 0.0, 0.0)


def _rectum(cv: _Canvas, an: Anatomy, val: dict[str, float]) -> None:
    a, b, c = an.semi
    rx, ry, rr, ratio = an.rectum
    reg = cv.around(rx, ry + 20, rr * ratio + 25)
    if reg is None:
        return
    coil = an.rectal_content == "balloon"
    z = reg.Z
    cy = ry + 0.35 * np.maximum(z - 0.6 * c, 0)  # curves backwards along the sacrum
    canal = _ramp(z, -c - 12, -c + 2)  # anal canal below the apex: smaller, thicker wall
    balloon = (np.abs(z) < c + 12) & coil
    normal = (12.0 if coil else rr) * (0.62 + 0.38 * canal)
    rad = np.where(balloon, rr, normal)
    r, du, dv = _ellipse(reg, rx, cy, rad * ratio, rad)
    theta = np.arctan2(dv, du)
    r = r / (1 + np.where(balloon, 0.0, 0.03 * np.cos(3 * theta + 1.3) + 0.02 * np.cos(5 * theta)))
    wall = np.where(balloon, an.rectal_wall, an.rectal_wall * (1 + 0.6 * (1 - canal)))
    inner = 1 - wall / rad
    cv.paint(reg, r < 1, val["rectal_wall"], 0.04, 0.08)
    cv.paint(reg, r < inner, val["mucosa"], 0.06, 0.12)
    lumen = r < inner - 1.6 / rad
    content = an.rectal_content
    if coil:
        cv.paint(reg, lumen & balloon, val["balloon"], 0.0, 0.05)
        content, lumen = "collapsed", lumen & ~balloon
    # the lumen's outline: mucosal folds
    folded = r / (1 + 0.18 * np.cos(4 * theta + 0.7) + 0.1 * np.cos(7 * theta + 2.0))
    if content == "collapsed":
        cv.paint(reg, lumen & (folded < 0.35 * inner), val["rectal_fluid"] * 0.45, 0.1, 0.2)
        cv.paint(reg, lumen & (folded < 0.18 * inner), 0.0, 0.0, 0.0)
    elif content == "air":
        cv.paint(reg, lumen & (folded < 0.8 * inner), 0.0, 0.0, 0.0)
    elif content == "fluid":
        cv.paint(reg, lumen & (folded < 0.85 * inner), val["rectal_fluid"], 0.05, 0.1)
    elif content == "stool":  # faeces: mottled intermediate signal with small gas bubbles
        inside = lumen & (folded < 0.85 * inner)
        cv.paint(reg, inside, val["mucosa"] * 1.1, 0.25, 0.45)
        cv.paint(reg, inside & (cv.tex_fine[reg.sl] > 1.1), 0.0, 0.0, 0.0)
    else:  # mixed: gas rises anteriorly (the patient lies supine), fluid level behind it
        level = reg.Y < cy - 0.05 * rad
        cv.paint(reg, lumen & (folded < 0.85 * inner) & level, 0.0, 0.0, 0.0)
        cv.paint(reg, lumen & (folded < 0.85 * inner) & ~level, val["rectal_fluid"], 0.05, 0.1)


def _seminal_vesicles(cv: _Canvas, an: Anatomy, val: dict[str, float]) -> None:
    a, b, c = an.semi
    z0, z1 = 0.45 * c, c + 22
    for side in (-1, 1):
        reg = cv.around(side * 24, 0.5 * b + 4, 34, z0, z1)
        if reg is None:
            continue
        q = _ramp(reg.Z, z0, z1)
        size = np.sin(np.pi * np.clip(q * 1.1 + 0.05, 0, 1)) + 1e-3
        cx = side * (8 + 14 * q)
        cy = 0.4 * b + an.tilt[1] * 0.3 * c + 5 * q
        r, _, _ = _ellipse(reg, cx, cy, 18 * size + 1e-3, 6.5 * size + 1e-3, side * math.radians(-16))
        inside = (r < 1) & (size > 0.15)
        cv.paint(reg, inside, val["sv_septum"], 0.03, 0.1)
        lobules = np.abs(cv.tex_fine[reg.sl]) > 0.3  # fluid-filled convolutions between thin walls
        cv.paint(reg, inside & (r < 0.88) & lobules, val["sv"], 0.05, 0.08)


def _bladder(cv: _Canvas, an: Anatomy, val: dict[str, float]) -> None:
    bx, by, bz, sx, sy, sz = an.bladder
    reg = cv.region(bx - sx - 2, bx + sx + 2, by - sy - 2, by + sy + 2, bz - sz, bz + sz)
    if reg is None:
        return
    k = np.sqrt(np.maximum(1 - ((reg.Z - bz) / sz) ** 2, 0))
    present = k > 0.08
    r, du, dv = _ellipse(reg, bx, by, sx * k + 1e-3, sy * k + 1e-3)
    theta = np.arctan2(dv, du)
    empty = 1.0 - an.bladder_filling  # an emptier bladder is flatter and folded
    r = r / (
        1 + 0.03 * np.cos(3 * theta + 0.4) - (0.08 + 0.1 * empty) * np.maximum(np.sin(theta), 0) ** 2 + 0.05 * empty * np.cos(6 * theta)
    )
    cv.paint(reg, present & (r < 1), val["bladder_wall"], 0.03, 0.06)
    cv.paint(reg, present & (r < 1 - an.bladder_wall / (sy * k + 1e-3)), val["urine"], 0.012, 0.01)


def _gland(cv: _Canvas, an: Anatomy, val: dict[str, float]) -> np.ndarray:
    a, b, c = an.semi
    mask = np.zeros(cv.grid.shape, bool)
    pad = 1.5 * max(a, b) + 4
    half = 0.5 * cv.grid.spacing[2]
    reg = cv.region(-pad, pad, -pad, pad, -c - half, c + half)
    if reg is None:
        return mask
    t, u, v, A, B = _gland_frame(reg, an)
    inside_t = np.abs(t) < 1
    radius = _gland_radius(an, t, u, v, a, b)  # relative to the largest outline: scale-free
    rho = radius * (a / A)  # relative to the outline at this height
    gland = (rho < 1) & inside_t
    occupancy = _occupancy(an, t, radius, cv.grid.spacing[2])
    touched = occupancy > 0
    # the capsule: a dark rim whose conspicuity varies per case, fades towards apex and base, and is
    # clearest posterolaterally (against fat), least anteriorly (fused with the stroma)
    rim = (rho < 1 + an.capsule_mm / B) & inside_t & ~gland
    theta = np.arctan2(v / B, u / A)
    level = 1.0 - 0.8 * _ramp(np.abs(t), 0.4, 0.95)
    k = np.clip(an.capsule * level * (0.75 + 0.25 * np.sin(theta)), 0.0, 1.0)
    around = cv.value[reg.sl]
    cv.paint(reg, rim, around + (val["capsule"] - around) * k, 0.0, 0.05)
    before = cv.value[reg.sl].copy()
    gland = touched  # painted wherever the slice touches the gland, then weighted by the occupancy
    # peripheral zone; darker central zone at the base (posterior, central)
    cz = 0.4 * _ramp(t, 0.3, 1.0) * np.exp(-2.5 * (u / A) ** 2)
    cv.paint(reg, gland, val["pz"] * (1 - cz), 0.07, 0.08)
    # transition zone (grows with hyperplasia), anterior, lobulated, bounded by the dark surgical capsule
    tz = an.tz_size * _ramp(t, -0.75, -0.25) * _ramp(-t, -1.02, -0.72)
    tzA, tzB = np.maximum(0.82 * tz * A, 1e-3), np.maximum(0.68 * tz * B, 1e-3)
    tv = v + an.tz_shift * B
    phi = np.arctan2(tv / tzB, u / tzA)
    lobes = 1 + 0.06 * np.cos(2 * phi + 0.5 * t) + 0.05 * np.cos(3 * phi + 1.0)
    r_tz = np.sqrt((u / tzA) ** 2 + (tv / tzB) ** 2) / lobes
    in_tz = gland & (r_tz < 1) & (tz > 0.05)
    cv.paint(reg, gland & (r_tz < 1 + 1.6 / tzB) & (tz > 0.05), val["tz_rim"], 0.05, 0.1)
    cv.paint(reg, in_tz, val["tz"], 0.18, 0.22)
    for nu, nv, nt, nr, nval in an.nodules:
        s_n = float(gland_profile(np.array(nt)))
        xc, yc = nu * a * s_n, nv * b * s_n  # local coordinates at the nodule's height
        r_n = np.sqrt(((u - xc) / nr) ** 2 + ((v - yc) / (0.85 * nr)) ** 2 + ((reg.Z - nt * c) / (1.2 * nr)) ** 2)
        cv.paint(reg, in_tz & (r_n < 1), val["tz_rim"], 0.05, 0.1)
        cv.paint(reg, in_tz & (r_n < 1 - 1.0 / nr), nval, 0.12, 0.16)
    # anterior fibromuscular stroma: the anterior rim of the gland
    afs = gland & (rho > 0.8 + 0.06 * np.cos(3 * u / A)) & (v < -0.45 * B)
    cv.paint(reg, afs, val["afs"], 0.05, 0.1)
    if an.lesion is not None:
        lu, lv, lt, lr, lval = an.lesion
        s_l = float(gland_profile(np.array(lt)))
        du, dv, dz = (u - lu * a * s_l) / lr, (v - lv * b * s_l) / (0.8 * lr), (reg.Z - lt * c) / lr
        r_l = np.sqrt(du**2 + dv**2 + dz**2)
        cv.paint(reg, gland & ~in_tz & (r_l < 1), lval, 0.06, 0.1)
    # urethra, with its dark sphincter towards the apex
    ur = np.sqrt(u**2 + (v + 0.12 * B) ** 2)
    cv.paint(reg, gland & (t < -0.35) & (ur < 4.2), val["afs"], 0.03, 0.06)
    cv.paint(reg, gland & (t < 0.85) & (ur < 1.8), val["urethra"], 0.03, 0.06)
    after = cv.value[reg.sl]
    cv.value[reg.sl] = before + (after - before) * occupancy
    mask[reg.sl] = (rho < 1) & inside_t  # the outline at the slice's centre, as drawn on the slice
    return mask
