"""Per-site acquisition: how each site's scanner turns the T2 signal of the anatomy into stored voxels.

A ScannerProfile is fixed per site (the domain shift a federated method must cope with); each
case jitters it. Order of effects: sequence contrast (fat and fluid gains, gamma), in-plane
blur (point-spread function), receive-coil sensitivity (a smooth phased-array field, brighter
towards the body surface; with an endorectal coil a strong flare around the coil that falls off
within a few centimetres), the stored intensity scale (MR values have no absolute unit: each
vendor and protocol stores a different range), Rician noise (the magnitude of complex Gaussian
noise: signal-dependent, Rayleigh-distributed in the air) and int16 quantisation.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy import ndimage

from .anatomy import Anatomy, Grid


@dataclass(frozen=True)
class ScannerProfile:
    """One site's scanner and protocol (full-size geometry; `matrix` is scaled by the generator)."""

    matrix: tuple[int, ...]  # in-plane matrix choices (square)
    fov: tuple[float, float]  # in-plane field of view, mm
    thickness: tuple[float, float]  # slice thickness = spacing, mm
    slices: tuple[int, int]  # slice count range
    intensity: tuple[float, float]  # stored value of signal 1.0 (urine), before the coil field
    gamma: float  # contrast curve applied to the signal
    fat_gain: float
    fluid_gain: float
    noise: float  # Rician sigma, fraction of the intensity scale
    blur_mm: float  # Gaussian point-spread sigma
    array_bias: float  # phased-array field: periphery brighter by about this fraction
    coil_gain: float  # endorectal coil flare at the coil (0: no endorectal coil)
    coil_reach_mm: float  # its fall-off length
    orientation: str  # stored voxel order: "LPS" (DICOM-like) or "RAS"
    mask_tag: str  # mask file name tag, as this site's files spell it
    prostate_share: float  # target prostate voxel share V_P (Table I where it has one)


SCANNER_PROFILES: dict[str, ScannerProfile] = {
    # Siemens, surface array; small field of view, thick slices, short coverage: the largest V_P
    "RUNMC": ScannerProfile(
        (384,), (154, 178), (3.6, 4.0), (17, 22), (900, 1300), 1.0, 1.0, 1.0, 0.022, 0.6, 0.35, 0.0, 0.0, "LPS", "_Segmentation", 0.0265
    ),
    # Philips: large stored values, flatter fat, harder gamma, more noise and blur, strong array shading
    "BMC": ScannerProfile(
        (512,), (206, 236), (3.0, 3.3), (20, 26), (2200, 3200), 1.25, 0.85, 0.95, 0.03, 0.7, 0.5, 0.0, 0.0, "RAS", "_Segmentation", 0.0176
    ),
    # Siemens: wide field of view, soft gamma
    "UCL": ScannerProfile(
        (384, 448), (200, 240), (3.0, 3.6), (18, 24), (500, 800), 0.9, 1.05, 1.0, 0.025, 0.6, 0.25, 0.0, 0.0, "LPS", "_segmentation", 0.0145
    ),
    # GE with an endorectal coil: strong bright field around the coil (posteriorly), many slices
    "BIDMC": ScannerProfile(
        (384,), (156, 180), (3.0, 3.3), (26, 34), (350, 550), 1.1, 0.95, 0.9, 0.02, 0.6, 0.15, 3.5, 17.0, "LPS", "_segmentation", 0.0216
    ),
    # Siemens: lowest stored values, noisiest, soft gamma, widest field of view
    "HK": ScannerProfile(
        (384,), (215, 250), (3.0, 3.6), (18, 24), (250, 420), 0.85, 1.1, 1.0, 0.045, 0.8, 0.3, 0.0, 0.0, "RAS", "_segmentation", 0.0139
    ),
    # outside Table I: a plausible Siemens protocol; its V_P target is an assumption
    "I2CVB": ScannerProfile(
        (384,), (180, 220), (3.0, 3.5), (20, 28), (1500, 2200), 1.05, 0.95, 1.0, 0.022, 0.5, 0.4, 0.0, 0.0, "RAS", "_segmentation", 0.018
    ),
}


def coil_field(grid: Grid, anat: Anatomy, profile: ScannerProfile, rng: np.random.Generator) -> np.ndarray:
    """Receive sensitivity [Z,H,W] (about 1 in the pelvis centre), float32."""
    X, Y, Z = grid.xs[None, None, :], grid.ys[None, :, None], grid.zs[:, None, None]
    half = (grid.xs[-1] - grid.xs[0]) / 2 + 1e-6
    cx, cy, cz = (grid.xs[0] + grid.xs[-1]) / 2, (grid.ys[0] + grid.ys[-1]) / 2, (grid.zs[0] + grid.zs[-1]) / 2
    strength = profile.array_bias * float(rng.uniform(0.7, 1.3))
    ang = float(rng.uniform(0, 2 * math.pi))
    gradient = 0.12 * strength * (np.cos(ang) * (X - cx) + np.sin(ang) * (Y - cy)) / half
    radial = 0.5 * strength * (((X - cx) / half) ** 2 + ((Y - cy) / half) ** 2)
    field = 1.0 + radial + gradient + 0.08 * strength * (Z - cz) / 50.0
    if profile.coil_gain > 0:
        gz, c = anat.centre[2], anat.semi[2]
        rx, ry, rr, _ = anat.rectum
        reach = profile.coil_reach_mm * float(rng.uniform(0.85, 1.15))
        dz = np.maximum(np.abs(Z - gz) - (c + 10), 0)
        d = np.sqrt((X - rx) ** 2 + (Y - (ry + 0.25 * rr)) ** 2 + dz**2)
        flare = np.exp(-np.maximum(d - 0.6 * rr, 0) / reach)
        field = 0.5 * field + profile.coil_gain * float(rng.uniform(0.8, 1.2)) * flare
    return np.asarray(field, np.float32)


def acquire(signal: np.ndarray, grid: Grid, anat: Anatomy, profile: ScannerProfile, rng: np.random.Generator) -> np.ndarray:
    """Stored int16 voxels [Z,H,W] of the anatomy's T2 `signal` (rendered with the profile's fat and fluid gains)."""
    dx = grid.spacing[0]
    gamma = profile.gamma * float(rng.uniform(0.97, 1.03))
    s = np.power(np.maximum(signal, 0), gamma, dtype=np.float32)
    sigma_px = profile.blur_mm / dx
    if sigma_px > 0.2:
        s = ndimage.gaussian_filter(s, (0, sigma_px, sigma_px), mode="nearest")
    s *= coil_field(grid, anat, profile, rng)
    scale = float(rng.uniform(*profile.intensity))
    s *= scale
    sigma = profile.noise * scale
    real = s + rng.standard_normal(s.shape, dtype=np.float32) * sigma
    imag = rng.standard_normal(s.shape, dtype=np.float32) * sigma
    out = np.sqrt(real * real + imag * imag)
    return np.clip(np.rint(out), 0, np.iinfo(np.int16).max).astype(np.int16)
