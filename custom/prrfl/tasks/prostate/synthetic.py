"""Writes a synthetic multi-site prostate T2 set in the real raw layout, so the real reader runs on it.

Output (under `raw_root`): one folder per site with `CaseNN.nii.gz` (int16 T2 volume, affine
encoding the voxel spacing, stored in the site's voxel order) and its mask (uint8 0/1) named with
the site's tag (`CaseNN_Segmentation.nii.gz` at RUNMC and BMC, `CaseNN_segmentation.nii.gz`
elsewhere, as both spellings occur in the public set), and synthetic.json (seed, scale, counts,
each site's protocol, geometry and protocol of every case, generator version). Everything is written into a hidden temporary folder
renamed to `raw_root` only when complete.

Per case: the protocol (field strength, endorectal coil, matrix and pixel size so the field of
view, slice thickness and count) is drawn from the site's ScannerProfile (MS-Net's Table I); the gland volume is then chosen so that the case's prostate voxel share follows
the site's Table I V_P (jittered by about 18 %); the anatomy (anatomy.py) is drawn and rendered,
and the site's scanner (scanner.py) acquires it. Each case has its own seed derived from (seed,
site, case), so a case does not change when the scale, the matrix or the other sites change.
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import nibabel as nib
import numpy as np

from prrfl.data.publish import build_dir
from prrfl.data.shift import check_shift

from .anatomy import Anatomy, Grid, render, sample_anatomy
from .layout import SITE_NAMES, SYNTHETIC_MARKER, TABLE_SITES, site
from .scanner import SCANNER_PROFILES, ScannerProfile, acquire, shifted

log = logging.getLogger(__name__)

GENERATOR_VERSION = "2"  # 2: Table I protocols (field strength, endorectal coil, pixel, slices), k-space noise, artefacts
MIN_CASES = 3  # one case per split of a 7:1:2 split
GLAND_VOLUME_ML = (18.0, 110.0)  # clip of the drawn gland volume


def case_counts(scale: float = 1.0, sites: Sequence[str] = TABLE_SITES, *, min_cases: int = MIN_CASES) -> dict[str, int]:
    """Cases per site: round-half-up(Table I count x scale), at least `min_cases`; scale=1.0 gives Table I."""
    if not scale > 0:
        raise ValueError(f"scale must be > 0, got {scale}")
    return {s: max(min_cases, int(math.floor(site(s).cases * scale + 0.5))) for s in sites}


@dataclass(frozen=True)
class CasePlan:
    """Geometry and seed of one synthetic case."""

    site: str
    index: int
    case_id: str
    seed: int
    matrix: int  # in-plane matrix as generated (the protocol's, times matrix_scale, capped)
    native_matrix: int  # the protocol's reconstructed matrix
    fov: float  # mm, square: native_matrix x the protocol's pixel size
    thickness: float  # mm
    slices: int
    centre: tuple[float, float, float]  # mm, the volume's centre relative to the gland's
    gland_volume_ml: float
    field_t: float  # field strength, tesla
    endorectal: bool  # endorectal coil (balloon and flare)

    @property
    def spacing(self) -> tuple[float, float, float]:
        return self.fov / self.matrix, self.fov / self.matrix, self.thickness

    @property
    def native_pixel(self) -> float:
        """The protocol's in-plane pixel size, mm (the stored one when the matrix is not scaled)."""
        return self.fov / self.native_matrix


def protocol_summary(profile: ScannerProfile) -> dict:
    """A site's acquisition protocol as written to synthetic.json (full-size geometry)."""
    return {
        "vendor": profile.vendor,
        "field_t": list(profile.field_t),
        "endorectal": profile.endorectal,
        "matrix": list(profile.matrices),
        "pixel_mm": [round(v, 4) for v in profile.pixel],
        "fov_mm": [round(v, 1) for v in profile.fov],
        "thickness_mm": list(profile.thickness),
        "phase_encoding": profile.phase_axis,
        "artefact": profile.artefact,
    }


def _case_seed(seed: int, site_name: str, index: int) -> np.random.SeedSequence:
    return np.random.SeedSequence([int(seed) & 0xFFFFFFFF, SITE_NAMES.index(site_name), int(index)])


def plan_case(site_name: str, index: int, seed: int, *, matrix_scale: float = 1.0, max_matrix: int | None = None) -> CasePlan:
    """The geometry of case `index` of a site (the matrix options change only the matrix)."""
    profile = SCANNER_PROFILES[site(site_name).name]
    geo_ss, anat_ss, _, _ = _case_seed(seed, site_name, index).spawn(4)
    rng = np.random.default_rng(geo_ss)
    native, pixel_lo, pixel_hi = profile.protocols[int(rng.integers(len(profile.protocols)))]
    pixel = round(float(rng.uniform(pixel_lo, pixel_hi)), 4)
    fov = native * pixel
    thickness = round(float(rng.uniform(*profile.thickness)), 2)
    slices = int(rng.integers(profile.slices[0], profile.slices[1] + 1))
    field_t = float(profile.field_t[int(rng.integers(len(profile.field_t)))])
    share = profile.prostate_share * float(np.exp(rng.normal(0.0, 0.18)))
    volume = float(np.clip(share * fov * fov * slices * thickness / 1000.0, *GLAND_VOLUME_ML))
    anat = sample_anatomy(np.random.default_rng(anat_ss), volume, endorectal=profile.endorectal)
    c = anat.semi[2]
    needed = 2 * (c + thickness) + 6
    if slices * thickness < needed:  # the whole gland must be covered
        slices = int(math.ceil(needed / thickness))
    cover = slices * thickness
    margin = max(cover / 2 - c - thickness - 2, 0.0)
    dz = float(rng.uniform(-0.3, 1.0)) * min(margin, 0.1 * cover)
    centre = (float(rng.normal(0, 4)), float(rng.normal(6, 4)), dz)
    matrix = max(16, int(round(native * matrix_scale)))
    if max_matrix is not None:
        matrix = min(matrix, int(max_matrix))
    case_id = f"Case{index:02d}"
    return CasePlan(
        site_name,
        int(index),
        case_id,
        int(seed),
        matrix,
        int(native),
        fov,
        thickness,
        slices,
        centre,
        volume,
        field_t,
        bool(profile.endorectal),
    )


@dataclass(frozen=True)
class SynthCase:
    """One rendered case in the radiological view (see reader.to_display)."""

    plan: CasePlan
    image: np.ndarray  # int16 [Z, H, W]
    mask: np.ndarray  # uint8 [Z, H, W]
    grid: Grid
    anatomy: Anatomy


def synthesize_case(plan: CasePlan, shift: float = 1.0) -> SynthCase:
    """Render and acquire one planned case (deterministic in the plan); `shift` scales how much the sites'
    acquisitions differ (scanner.shifted)."""
    profile = shifted(SCANNER_PROFILES[plan.site], shift)
    _, anat_ss, tex_ss, scan_ss = _case_seed(plan.seed, plan.site, plan.index).spawn(4)
    anat = sample_anatomy(np.random.default_rng(anat_ss), plan.gland_volume_ml, endorectal=plan.endorectal)
    grid = Grid.centred(plan.matrix, plan.fov, plan.slices, plan.thickness, plan.centre)
    signal, mask = render(anat, grid, np.random.default_rng(tex_ss), fat_gain=profile.fat_gain, fluid_gain=profile.fluid_gain)
    image = acquire(signal, grid, anat, profile, np.random.default_rng(scan_ss), field_t=plan.field_t)
    return SynthCase(plan, image, mask.astype(np.uint8), grid, anat)


def stored_layout(stack: np.ndarray, grid: Grid, orientation: str) -> tuple[np.ndarray, np.ndarray]:
    """(array [X,Y,Z], affine) storing a radiological [Z,H,W] stack in `orientation` ("RAS" or "LPS").

    World coordinates are RAS mm: right = -x, anterior = -y, superior = z of the grid.
    """
    dx, dy, dz = grid.spacing
    if orientation == "RAS":
        array = stack[:, ::-1, ::-1].transpose(2, 1, 0)
        affine = np.array([[dx, 0, 0, -grid.xs[-1]], [0, dy, 0, -grid.ys[-1]], [0, 0, dz, grid.zs[0]], [0, 0, 0, 1]])
    elif orientation == "LPS":
        array = stack.transpose(2, 1, 0)
        affine = np.array([[-dx, 0, 0, -grid.xs[0]], [0, -dy, 0, -grid.ys[0]], [0, 0, dz, grid.zs[0]], [0, 0, 0, 1]])
    else:
        raise ValueError(f"unknown orientation {orientation!r}; expected 'RAS' or 'LPS'")
    return np.ascontiguousarray(array), affine.astype(np.float64)


def nifti_image(array: np.ndarray, affine: np.ndarray) -> nib.Nifti1Image:
    """A NIfTI-1 image with qform and sform set to `affine` and spatial units mm."""
    img = nib.Nifti1Image(array, affine)
    img.set_qform(affine, code=1)
    img.set_sform(affine, code=1)
    img.header.set_xyzt_units("mm")
    return img


def write_case(folder: Path, case: SynthCase, profile: ScannerProfile) -> tuple[Path, Path]:
    """Write the case's volume and mask into a site folder; returns their paths."""
    image, affine = stored_layout(case.image, case.grid, profile.orientation)
    mask, _ = stored_layout(case.mask, case.grid, profile.orientation)
    image_path = folder / f"{case.plan.case_id}.nii.gz"
    mask_path = folder / f"{case.plan.case_id}{profile.mask_tag}.nii.gz"
    nib.save(nifti_image(image, affine), str(image_path))
    nib.save(nifti_image(mask, affine), str(mask_path))
    return image_path, mask_path


def _write_planned(task: tuple[str, int, int, float, int | None, str]) -> dict:
    """Plan, render and write one case into its site folder; returns its synthetic.json row."""
    site_name, index, seed, matrix_scale, max_matrix, folder, shift = task
    plan = plan_case(site_name, index, seed, matrix_scale=matrix_scale, max_matrix=max_matrix)
    case = synthesize_case(plan, shift)
    write_case(Path(folder), case, SCANNER_PROFILES[site_name])
    row = {k: v for k, v in asdict(plan).items() if k not in ("site", "seed", "index")}
    row["spacing"] = [round(v, 4) for v in plan.spacing]
    row["native_pixel"] = round(plan.native_pixel, 4)
    profile = SCANNER_PROFILES[site_name]
    row["vendor"], row["artefact"] = profile.vendor, profile.artefact
    row["bladder_filling"] = round(case.anatomy.bladder_filling, 3)
    row["rectal_content"] = case.anatomy.rectal_content
    row["prostate_share"] = round(float(case.mask.mean()), 5)
    return row


def _single_thread_blas() -> None:
    from threadpoolctl import threadpool_limits

    threadpool_limits(1)


def _write_all(tasks: list[tuple], workers: int) -> list[dict]:
    if workers <= 1 or len(tasks) < 2 * workers:
        return [_write_planned(t) for t in tasks]
    import multiprocessing as mp

    # spawn: safe when the caller has threads; each case is independent and deterministic
    with mp.get_context("spawn").Pool(workers, initializer=_single_thread_blas) as pool:
        return list(pool.imap(_write_planned, tasks, chunksize=1))


def generate_synthetic_prostate(
    raw_root: str | Path,
    *,
    scale: float = 1.0,
    seed: int = 0,
    sites: Sequence[str] = TABLE_SITES,
    matrix_scale: float = 1.0,
    max_matrix: int | None = None,
    min_cases: int = MIN_CASES,
    overwrite: bool = False,
    workers: int = 1,
    shift: float = 1.0,
) -> dict:
    """Write the synthetic raw layout to `raw_root` and return the content of its synthetic.json.

    Cases per site follow Table I times `scale` (at least `min_cases`); the in-plane matrix is the
    site protocol's (256-512 px) times `matrix_scale`, capped at `max_matrix` (the field of view
    stays, so the pixels grow). Deterministic in `seed`: the same arguments write the same bytes, whatever
    `workers` (> 1: cases rendered in spawned processes, for full-size sets; the calling program's
    main module must then be importable and guarded by `if __name__ == "__main__"`). `shift` scales how much
    the sites' acquisitions differ (scanner.shifted; 1 = the scanner profiles as written).
    """
    check_shift(shift)  # before any work
    if not matrix_scale > 0:
        raise ValueError(f"matrix_scale must be > 0, got {matrix_scale}")
    if max_matrix is not None and max_matrix < 16:
        raise ValueError(f"max_matrix must be at least 16, got {max_matrix}")
    names = [site(s).name for s in sites]
    if len(set(names)) != len(names) or not names:
        raise ValueError(f"sites must name each site once, got {list(sites)}")
    counts = case_counts(scale, names, min_cases=min_cases)
    t0 = time.perf_counter()
    raw_root = Path(raw_root)
    if raw_root.exists() and not overwrite:
        raise FileExistsError(f"{raw_root} already exists (pass overwrite=True to replace it)")

    def write(tmp: Path) -> dict:
        tasks = []
        for s in names:
            (tmp / s).mkdir()
            tasks += [(s, i, int(seed), float(matrix_scale), max_matrix, str(tmp / s), float(shift)) for i in range(counts[s])]
        rows = _write_all(tasks, workers)
        cases: dict[str, list[dict]] = {s: [] for s in names}
        for task, row in zip(tasks, rows, strict=True):
            cases[task[0]].append(row)
        info = {
            "generator": "prrfl.tasks.prostate.synthetic",
            "version": GENERATOR_VERSION,
            "seed": int(seed),
            "scale": float(scale),
            "matrix_scale": float(matrix_scale),
            "max_matrix": max_matrix,
            "min_cases": int(min_cases),
            "site_shift": float(shift),
            "sites": names,
            "counts": counts,
            "mask_tags": {s: SCANNER_PROFILES[s].mask_tag for s in names},
            "orientations": {s: SCANNER_PROFILES[s].orientation for s in names},
            "protocols": {s: protocol_summary(SCANNER_PROFILES[s]) for s in names},
            "cases": cases,
        }
        (tmp / SYNTHETIC_MARKER).write_text(json.dumps(info, indent=2) + "\n")
        return info

    info = build_dir(raw_root, write, overwrite=overwrite)
    log.info(
        "synthetic prostate: %d cases at %d site(s) written to %s in %.1f s",
        sum(counts.values()),
        len(names),
        raw_root,
        time.perf_counter() - t0,
    )
    return info
