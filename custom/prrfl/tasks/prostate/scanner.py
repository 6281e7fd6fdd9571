"""Per-site acquisition: how each site's scanner turns the T2 signal of the anatomy into stored voxels.

A ScannerProfile is fixed per site (the domain shift a federated method must cope with): vendor,
field strength, endorectal coil, the in-plane protocol (reconstructed matrix and pixel size, so
the field of view), slice thickness, contrast, noise and one site-specific artefact. Each case
jitters it (and draws its field strength where a site has two scanners).

Order of effects (`acquire`): sequence contrast (fat and fluid gains, gamma), wrap-around of the
body outside the field of view (where the profile has it), receive-coil sensitivity (a smooth
phased-array field brighter under the anterior and posterior body surface; with an endorectal coil
a strong flare around the coil that falls off within a few centimetres), transmit (B1) shading
(the dielectric effect: strong at 3 T, slight at 1.5 T), slice crosstalk (where the profile has
it), the stored intensity scale (MR values have no absolute unit: each vendor and protocol stores
a different range), then k-space: respiratory motion of the anterior abdominal wall (ghosts along
the phase-encode direction, where the profile has it), complex Gaussian noise, and the k-space
window (only the central `acquired` fraction of the reconstructed matrix is measured, zero-filled
and apodised: this sets the resolution, makes the noise spatially correlated, and rings at sharp
edges when the apodisation is weak); the stored value is the magnitude (Rician noise:
Rayleigh-distributed in the air), optionally with parallel-imaging noise amplification (g-factor),
rounded to int16.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from functools import lru_cache, partial

import numpy as np
import scipy.fft

from prrfl.data import shift as shifting

from .anatomy import Anatomy, Grid, body_wall_signal

NOISE_AT_FIELD = {1.5: 1.8, 3.0: 1.0}  # noise sigma relative to a 3 T acquisition (SNR grows about linearly with B0)
DIELECTRIC_AT_FIELD = {1.5: 0.06, 3.0: 0.30}  # depth of the B1 (dielectric) shading at the body's size
ARTEFACTS = ("wrap", "gibbs", "gfactor", "flare", "ghost", "crosstalk", "none")


@dataclass(frozen=True)
class ScannerProfile:
    """One site's scanner and protocol (full-size geometry; the generator may scale the matrix)."""

    vendor: str
    field_t: tuple[float, ...]  # field strength(s) in tesla; a case draws one
    endorectal: bool  # endorectal coil: a balloon in the rectum and a bright near-coil flare
    protocols: tuple[tuple[int, float, float], ...]  # (reconstructed matrix, pixel mm low, high); a case draws one
    thickness: tuple[float, float]  # slice thickness = spacing, mm
    slices: tuple[int, int]  # slice count range
    intensity: tuple[float, float]  # stored value of signal 1.0 (urine), before the coil field
    gamma: float  # contrast curve applied to the signal
    fat_gain: float
    fluid_gain: float
    noise: float  # Rician sigma at 3 T, fraction of the intensity scale (x NOISE_AT_FIELD at 1.5 T)
    acquired: float  # measured fraction of the reconstructed matrix's k-space (resolution, noise correlation)
    apodisation: float  # k-space filter: 0 = hard truncation (Gibbs ringing) .. 1 = strong smoothing
    array_bias: float  # phased-array field: near-surface tissue brighter by about this fraction
    coil_gain: float  # endorectal coil flare at the coil (0 without one)
    coil_reach_mm: float  # its fall-off length
    phase_axis: str  # phase-encode direction: "LR" (image columns) or "AP" (image rows)
    artefact: str  # the site's own artefact, one of ARTEFACTS
    orientation: str  # stored voxel order: "LPS" (DICOM-like) or "RAS"
    mask_tag: str  # mask file name tag, as this site's files spell it
    prostate_share: float  # target prostate voxel share V_P (Table I where it has one)

    @property
    def pixel(self) -> tuple[float, float]:
        """In-plane pixel size range over the protocols, mm."""
        return min(p[1] for p in self.protocols), max(p[2] for p in self.protocols)

    @property
    def matrices(self) -> tuple[int, ...]:
        return tuple(p[0] for p in self.protocols)

    @property
    def fov(self) -> tuple[float, float]:
        """Field of view range over the protocols, mm."""
        return min(p[0] * p[1] for p in self.protocols), max(p[0] * p[2] for p in self.protocols)


# Protocols of MS-Net (Liu et al., IEEE TMI 2020), Table I: field strength, endorectal coil, in-plane
# pixel and slice thickness, vendor. Matrices (so fields of view), contrast, noise levels and
# artefacts are plausible choices for such protocols, not measurements of the real set.
SCANNER_PROFILES: dict[str, ScannerProfile] = {
    # A: Siemens 3 T, pelvic array; 0.6-0.625 mm, 3.6-4 mm slices, short coverage: the largest V_P.
    # Artefact: wrap-around of the lateral body wall along the left-right phase-encode direction.
    "RUNMC": ScannerProfile(
        vendor="Siemens",
        field_t=(3.0,),
        endorectal=False,
        protocols=((320, 0.6, 0.625),),
        thickness=(3.6, 4.0),
        slices=(15, 20),
        intensity=(900, 1300),
        gamma=1.0,
        fat_gain=1.0,
        fluid_gain=1.0,
        noise=0.02,
        acquired=0.85,
        apodisation=0.6,
        array_bias=0.35,
        coil_gain=0.0,
        coil_reach_mm=0.0,
        phase_axis="LR",
        artefact="wrap",
        orientation="LPS",
        mask_tag="_Segmentation",
        prostate_share=0.0265,
    ),
    # B: Philips 1.5 T with an endorectal coil; 0.4 mm (512 reconstructed from about 300 measured), 3 mm.
    # Large stored values, flatter fat, harder gamma. Artefact: Gibbs ringing (weak k-space apodisation).
    "BMC": ScannerProfile(
        vendor="Philips",
        field_t=(1.5,),
        endorectal=True,
        protocols=((512, 0.4, 0.4),),
        thickness=(3.0, 3.0),
        slices=(20, 26),
        intensity=(2200, 3200),
        gamma=1.25,
        fat_gain=0.85,
        fluid_gain=0.95,
        noise=0.017,
        acquired=0.58,
        apodisation=0.2,
        array_bias=0.4,
        coil_gain=2.6,
        coil_reach_mm=18.0,
        phase_axis="LR",
        artefact="gibbs",
        orientation="RAS",
        mask_tag="_Segmentation",
        prostate_share=0.0176,
    ),
    # C: Siemens at 1.5 T or 3 T (drawn per case), no endorectal coil; 0.325-0.625 mm, 3-3.6 mm.
    # Soft gamma. Artefact: parallel-imaging noise amplification (g-factor) in the centre.
    "UCL": ScannerProfile(
        vendor="Siemens",
        field_t=(1.5, 3.0),
        endorectal=False,
        protocols=((512, 0.325, 0.4), (384, 0.45, 0.55), (320, 0.56, 0.625)),
        thickness=(3.0, 3.6),
        slices=(18, 24),
        intensity=(500, 800),
        gamma=0.9,
        fat_gain=1.05,
        fluid_gain=1.0,
        noise=0.02,
        acquired=0.75,
        apodisation=0.6,
        array_bias=0.25,
        coil_gain=0.0,
        coil_reach_mm=0.0,
        phase_axis="LR",
        artefact="gfactor",
        orientation="LPS",
        mask_tag="_segmentation",
        prostate_share=0.0145,
    ),
    # D: GE 3 T with an endorectal coil; 0.25 mm (512 interpolated from about 300 measured: small field
    # of view), 2.2-3 mm. Artefact: the coil's flare, which dominates the volume, and strongly correlated noise.
    "BIDMC": ScannerProfile(
        vendor="GE",
        field_t=(3.0,),
        endorectal=True,
        protocols=((512, 0.25, 0.25),),
        thickness=(2.2, 3.0),
        slices=(24, 32),
        intensity=(350, 550),
        gamma=1.1,
        fat_gain=0.95,
        fluid_gain=0.9,
        noise=0.02,
        acquired=0.6,
        apodisation=0.5,
        array_bias=0.15,
        coil_gain=3.5,
        coil_reach_mm=17.0,
        phase_axis="AP",
        artefact="flare",
        orientation="LPS",
        mask_tag="_segmentation",
        prostate_share=0.0216,
    ),
    # E: Siemens 1.5 T with an endorectal coil; 0.625 mm, 3.6 mm. Lowest stored values, soft gamma.
    # Artefact: respiratory motion ghosts of the anterior abdominal wall along the antero-posterior phase encoding.
    "HK": ScannerProfile(
        vendor="Siemens",
        field_t=(1.5,),
        endorectal=True,
        protocols=((320, 0.625, 0.625),),
        thickness=(3.6, 3.6),
        slices=(17, 23),
        intensity=(150, 250),
        gamma=0.85,
        fat_gain=1.1,
        fluid_gain=1.0,
        noise=0.025,
        acquired=0.8,
        apodisation=0.6,
        array_bias=0.3,
        coil_gain=3.0,
        coil_reach_mm=20.0,
        phase_axis="AP",
        artefact="ghost",
        orientation="RAS",
        mask_tag="_segmentation",
        prostate_share=0.0139,
    ),
    # outside Table I (MS-Net lists it as I2CVB/HCRUDB): Siemens 3 T, no endorectal coil, 0.67-0.79 mm,
    # 1.25 mm slices; its V_P target is an assumption. Artefact: slice crosstalk (odd/even slice intensity).
    "I2CVB": ScannerProfile(
        vendor="Siemens",
        field_t=(3.0,),
        endorectal=False,
        protocols=((256, 0.67, 0.79),),
        thickness=(1.25, 1.25),
        slices=(48, 64),
        intensity=(1500, 2200),
        gamma=1.05,
        fat_gain=0.95,
        fluid_gain=1.0,
        noise=0.028,
        acquired=0.9,
        apodisation=0.6,
        array_bias=0.4,
        coil_gain=0.0,
        coil_reach_mm=0.0,
        phase_axis="LR",
        artefact="crosstalk",
        orientation="RAS",
        mask_tag="_segmentation",
        prostate_share=0.018,
    ),
}


FEDERATED_SITES = ("RUNMC", "BMC", "UCL", "BIDMC", "HK")  # Table I's sites, whose average a shift scales from


@lru_cache(maxsize=64)  # per (site, shift): every case of a site asks for it
def shifted(profile: ScannerProfile, shift: float) -> ScannerProfile:
    """`profile` with its acquisition's departure from the federation's average scanner times `shift`.

    The average is taken over Table I's five sites: the geometric mean of the multiplicative settings (contrast
    gamma, fat and fluid gains, noise, stored intensity range; the endorectal flare's gain and reach among the
    coil sites) and the arithmetic mean of the additive ones (measured k-space fraction, apodisation, phased-array
    bias). `shift` 1 is the profile itself, 0 gives every site the average acquisition, 2 doubles every difference
    (on the log scale for the multiplicative settings), and so on. The protocol (field strength, endorectal coil or
    not, matrix, pixel, slices), the site's own artefact and the anatomy are not scaled."""
    shifting.check_shift(shift)
    if shift == 1:
        return profile
    sites = [SCANNER_PROFILES[s] for s in FEDERATED_SITES]
    coils = [p for p in sites if p.coil_gain > 0]
    geometric, arithmetic = partial(shifting.geometric, shift), partial(shifting.arithmetic, shift)

    coil = {}
    if profile.coil_gain > 0:
        coil = {
            "coil_gain": geometric(profile.coil_gain, [p.coil_gain for p in coils]),
            "coil_reach_mm": geometric(profile.coil_reach_mm, [p.coil_reach_mm for p in coils]),
        }
    return replace(
        profile,
        intensity=tuple(geometric(v, [p.intensity[i] for p in sites]) for i, v in enumerate(profile.intensity)),
        gamma=geometric(profile.gamma, [p.gamma for p in sites]),
        fat_gain=geometric(profile.fat_gain, [p.fat_gain for p in sites]),
        fluid_gain=geometric(profile.fluid_gain, [p.fluid_gain for p in sites]),
        noise=geometric(profile.noise, [p.noise for p in sites]),
        acquired=arithmetic(profile.acquired, [p.acquired for p in sites], 0.25, 1.0),
        apodisation=arithmetic(profile.apodisation, [p.apodisation for p in sites], 0.0, 1.0),
        array_bias=arithmetic(profile.array_bias, [p.array_bias for p in sites], 0.0, 0.9),
        **coil,
    )


def _coords(grid: Grid) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    return grid.xs[None, None, :], grid.ys[None, :, None], grid.zs[:, None, None]


def receive_field(grid: Grid, anat: Anatomy, profile: ScannerProfile, rng: np.random.Generator) -> np.ndarray:
    """Receive sensitivity [Z,H,W] (about 1 at the gland without an endorectal coil), float32.

    Phased array: elements on the anterior and posterior body surface, so tissue near those
    surfaces is brighter (normalised at the gland). Endorectal coil: a flare around the coil in
    the rectum (posterior gland, rectal wall) falling off with the distance from it.
    """
    X, Y, Z = _coords(grid)
    yc, ba, bb = anat.body[:3]
    strength = profile.array_bias * float(rng.uniform(0.7, 1.3))
    reach = float(rng.uniform(55.0, 80.0))
    post = float(rng.uniform(0.6, 1.0))  # the posterior elements (in the table) weigh differently per case

    def array(y: np.ndarray | float) -> np.ndarray:
        return np.exp(-np.clip(y - (yc - bb), 0, None) / reach) + post * np.exp(-np.clip(yc + bb - y, 0, None) / reach)

    ang = float(rng.uniform(0, 2 * math.pi))
    gradient = 0.12 * strength * (np.cos(ang) * X + np.sin(ang) * (Y - yc)) / ba
    field = 1.0 + strength * (array(Y) / array(0.0) - 1.0) + gradient + 0.08 * strength * Z / 50.0
    field = np.maximum(field, 0.2)
    if profile.coil_gain > 0:
        c = anat.semi[2]
        rx, ry, rr, _ = anat.rectum
        creach = profile.coil_reach_mm * float(rng.uniform(0.85, 1.15))
        dz = np.maximum(np.abs(Z) - (c + 10), 0)
        d = np.sqrt((X - rx) ** 2 + (Y - (ry - 0.25 * rr)) ** 2 + dz**2)  # the coil loop lies in the balloon's anterior wall
        flare = np.exp(-np.maximum(d - 0.6 * rr, 0) / creach)
        field = 0.5 * field + profile.coil_gain * float(rng.uniform(0.8, 1.2)) * flare
    return np.asarray(field, np.float32)


def b1_shading(grid: Grid, anat: Anatomy, field_t: float, rng: np.random.Generator) -> np.ndarray:
    """Transmit (B1) inhomogeneity [1,H,W]: the dielectric effect, a brighter centre and a darker band
    towards the body wall (deepest on one side), growing with the field strength and the body's size."""
    X, Y, _ = _coords(grid)
    yc, ba, bb = anat.body[:3]
    depth = DIELECTRIC_AT_FIELD.get(field_t, 0.3 * (field_t / 3.0) ** 2) * float(rng.uniform(0.7, 1.3)) * (bb / 110.0)
    r = np.sqrt((X / (0.85 * ba)) ** 2 + ((Y - yc) / bb) ** 2)
    side = np.arctan2(Y - yc, X)
    r0, th0 = float(rng.uniform(0.45, 0.7)), float(rng.uniform(0, 2 * math.pi))
    band = np.exp(-(((r - r0) / 0.22) ** 2)) * (1 + 0.7 * np.cos(side - th0)) / 1.7
    shade = 1 + 0.35 * depth * np.exp(-((r / 0.35) ** 2)) - depth * band
    return np.asarray(shade, np.float32)


def kspace_window(n: int, acquired: float, apodisation: float) -> np.ndarray:
    """1-D k-space weights [n] (FFT order): the measured central `acquired` fraction, edge and taper set by `apodisation`."""
    f = np.abs(scipy.fft.fftfreq(n))  # cycles per pixel, 0..0.5
    fc = 0.5 * acquired
    width = 0.002 + 0.02 * apodisation
    edge = 1.0 / (1.0 + np.exp(np.clip((f - fc) / width, -50, 50)))
    taper = 1.0 - apodisation * np.sin(0.5 * np.pi * np.minimum(f / fc, 1.0)) ** 2
    return (edge * taper).astype(np.float32)


def _wrapped(grid: Grid, anat: Anatomy, rng: np.random.Generator) -> np.ndarray:
    """[1,H,W]: the body wall beyond the left and right edges, folded in (phase oversampling too small for the patient)."""
    fov = grid.xs[-1] - grid.xs[0] + grid.spacing[0]
    fov_rec = fov * (1 + float(rng.uniform(0.4, 1.0)))  # the oversampled field of view; what lies beyond it folds
    X, Y = grid.xs[None, :], grid.ys[:, None]
    z = float(grid.zs.mean())
    folded = body_wall_signal(anat, X + fov_rec, Y, z) + body_wall_signal(anat, X - fov_rec, Y, z)
    return (0.5 * folded)[None]  # lateral tissue lies far from the anterior and posterior coil elements


def _ghosts(k: np.ndarray, s: np.ndarray, grid: Grid, anat: Anatomy, rng: np.random.Generator, axis: int) -> np.ndarray:
    """k-space [Z,H,W] with the anterior abdominal wall's respiratory motion: a periodic phase error of
    the moving part along the phase-encode lines, i.e. ghosts of it along the phase-encode direction."""
    Y = grid.ys[None, :, None]
    anterior = anat.body[0] - anat.body[2]  # the anterior skin
    moving = s * np.clip((anat.pubis_y - 5.0 - Y) / 20.0, 0.0, 1.0).astype(np.float32) * (Y > anterior - 10)
    n = s.shape[axis]
    lines = np.arange(n) - n // 2  # acquisition order of the phase-encode lines (linear)
    period = float(rng.uniform(5.0, 9.0))
    amp = float(rng.uniform(0.3, 0.5))
    phase = amp * np.sin(2 * np.pi * lines / period + float(rng.uniform(0, 2 * np.pi)))
    err = np.fft.ifftshift(np.exp(1j * phase) - 1.0).astype(np.complex64)
    shape = [1, 1, 1]
    shape[axis] = n
    return k + scipy.fft.fft2(moving, axes=(1, 2), norm="ortho") * err.reshape(shape)


def _g_factor(grid: Grid, rng: np.random.Generator, axis: int) -> np.ndarray:
    """Noise amplification of parallel imaging (acceleration 2 along the phase-encode direction):
    highest in a band through the centre of the field of view, about 1 at the edges."""
    pos = grid.xs if axis == 2 else grid.ys
    half = (pos[-1] - pos[0]) / 2 + 1e-6
    q = (pos - pos.mean()) / half
    g = 1.0 + float(rng.uniform(0.3, 0.6)) * np.exp(-((q / 0.45) ** 2))
    return (g[None, None, :] if axis == 2 else g[None, :, None]).astype(np.float32)


def acquire(
    signal: np.ndarray,
    grid: Grid,
    anat: Anatomy,
    profile: ScannerProfile,
    rng: np.random.Generator,
    *,
    field_t: float | None = None,
) -> np.ndarray:
    """Stored int16 voxels [Z,H,W] of the anatomy's T2 `signal` (rendered with the profile's fat and fluid gains).

    `field_t`: the case's field strength (default: the profile's first).
    """
    field_t = float(profile.field_t[0] if field_t is None else field_t)
    axis = 2 if profile.phase_axis == "LR" else 1
    gamma = profile.gamma * float(rng.uniform(0.97, 1.03))
    s = np.maximum(signal, 0).astype(np.float32)
    if profile.artefact == "wrap":
        s = s + _wrapped(grid, anat, rng)
    s = np.power(s, gamma, dtype=np.float32)
    s *= receive_field(grid, anat, profile, rng)
    s *= b1_shading(grid, anat, field_t, rng)
    if profile.artefact == "crosstalk":  # interleaved thin slices saturate each other: every other slice darker
        s[int(rng.integers(0, 2)) :: 2] *= 1.0 - float(rng.uniform(0.04, 0.09))
    scale = float(rng.uniform(*profile.intensity))
    s *= scale
    k = scipy.fft.fft2(s, axes=(1, 2), norm="ortho")
    if profile.artefact == "ghost":
        k = _ghosts(k, s, grid, anat, rng, axis)
    z, h, w = s.shape
    window = (
        kspace_window(h, profile.acquired, profile.apodisation)[:, None] * kspace_window(w, profile.acquired, profile.apodisation)[None, :]
    )
    sigma = profile.noise * NOISE_AT_FIELD.get(field_t, 3.0 / field_t) * scale
    sigma_k = sigma / max(float(np.sqrt(np.mean(window.astype(np.float64) ** 2))), 1e-6)  # pixel sigma after the window
    noise = rng.standard_normal((2, z, h, w), dtype=np.float32)
    noise_k = (noise[0] + 1j * noise[1]).astype(np.complex64) * np.float32(sigma_k)
    if profile.artefact == "gfactor":
        image = scipy.fft.ifft2(k * window, axes=(1, 2), norm="ortho")
        image += scipy.fft.ifft2(noise_k * window, axes=(1, 2), norm="ortho") * _g_factor(grid, rng, axis)
    else:
        image = scipy.fft.ifft2((k + noise_k) * window, axes=(1, 2), norm="ortho")
    out = np.abs(image)
    return np.clip(np.rint(out), 0, np.iinfo(np.int16).max).astype(np.int16)
