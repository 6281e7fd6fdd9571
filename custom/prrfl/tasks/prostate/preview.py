"""PNG previews of a raw layout: per site, a few axial slices of some cases with the mask's contour.

Read through the same reader as preparation (reader.py), so what the pictures show is what
preparation gets: slices in the radiological view (anterior up, the patient's right on the
left), windowed to the volume's 0.5-99.5 percentiles, the prostate mask outlined in red.
Columns run cranial to caudal: above the base (bladder, seminal vesicles), base, mid-gland,
apex, below the apex.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from prrfl.storage import atomic_write_bytes

from .layout import SITES
from .reader import ProstateCase, ProstateDataError, list_sites, load_case, present_sites, to_display

LEVELS: tuple[str, ...] = ("above base", "base", "mid-gland", "apex", "below apex")


def preview_slices(mask_stack: np.ndarray, columns: int = 5) -> list[int]:
    """Slice indices (of a [Z,H,W] stack, slice 0 inferior) from above the base down to below the apex."""
    z = mask_stack.shape[0]
    present = np.flatnonzero(mask_stack.reshape(z, -1).any(axis=1))
    lo, hi = (int(present[0]), int(present[-1])) if present.size else (0, z - 1)
    span = hi - lo
    picks = [
        min(z - 1, hi + max(2, (z - 1 - hi) // 2)),
        hi - span // 6,
        (lo + hi) // 2,
        lo + span // 6,
        max(0, lo - max(2, lo // 2)),
    ]
    if columns >= 5:
        return picks
    return picks[1 : 1 + columns] if columns <= 3 else picks[:columns]


def _draw_case(axes: Sequence, case: ProstateCase, columns: int) -> None:
    image, mask = to_display(case.image), to_display(case.mask)
    lo, hi = np.percentile(image, [0.5, 99.5])
    dx, dy, dz = case.spacing
    h, w = image.shape[1:]
    extent = (0, w * dx, h * dy, 0)
    picks = preview_slices(mask, columns)
    names = LEVELS if columns >= 5 else (LEVELS[1 : 1 + columns] if columns <= 3 else LEVELS[:columns])
    for ax, k, name in zip(axes, picks, names, strict=True):
        ax.imshow(image[k], cmap="gray", vmin=lo, vmax=hi, extent=extent, interpolation="bilinear")
        if mask[k].any():
            ax.contour(mask[k], levels=[0.5], colors=["#ff3b30"], linewidths=0.9, extent=extent, origin="upper")
        ax.set_title(f"{name} (slice {k + 1}/{image.shape[0]})", fontsize=7, color="w")
        ax.set_xticks([])
        ax.set_yticks([])
    x, y, z = case.shape
    axes[0].set_ylabel(
        f"{case.case_id}\n{x}x{y}x{z}, {dx:.2f}x{dy:.2f}x{dz:.1f} mm\nV_P {case.prostate_share:.2%}",
        fontsize=7,
        color="w",
    )


def write_previews(
    raw_root: str | Path,
    out_dir: str | Path,
    *,
    sites: Sequence[str] | None = None,
    cases: int = 2,
    columns: int = 5,
) -> list[Path]:
    """Write `<out_dir>/<site>.png` (the first `cases` cases of each site); returns the paths.

    `sites` None: every known site with a folder under `raw_root`.
    """
    from matplotlib.figure import Figure

    if cases < 1 or not 1 <= columns <= 5:
        raise ValueError(f"cases must be >= 1 and columns 1-5, got {cases} and {columns}")
    out_dir = Path(out_dir)
    if sites is None:
        sites = present_sites(raw_root)
        if not sites:
            raise ProstateDataError(f"no site folder under {raw_root}; expected some of {', '.join(SITES)}")
    written = []
    for site_name, files in list_sites(raw_root, sites).items():
        chosen = [load_case(f) for f in files[:cases]]
        fig = Figure(figsize=(2.4 * columns + 0.6, 2.5 * len(chosen) + 0.4), facecolor="black")
        grid = fig.subplots(len(chosen), columns, squeeze=False)
        for row, case in zip(grid, chosen, strict=True):
            _draw_case(row, case, columns)
        fig.suptitle(f"{site_name}: {len(files)} case(s), axial T2, prostate mask in red", color="w", fontsize=9)
        fig.tight_layout()
        buf = io.BytesIO()
        fig.savefig(buf, format="png", dpi=110, facecolor="black")
        written.append(atomic_write_bytes(out_dir / f"{site_name}.png", buf.getvalue()))
    return written


def write_level_montage(
    raw_root: str | Path,
    out_path: str | Path,
    *,
    sites: Sequence[str] | None = None,
    cases: int = 2,
    level: str = "mid-gland",
    outline: bool = False,
) -> Path:
    """One PNG with one slice at `level` (one of LEVELS) of the first `cases` cases of every site, a
    row per site, large enough to judge the image as a radiologist would; the mask outlined if `outline`."""
    from matplotlib.figure import Figure

    if level not in LEVELS or cases < 1:
        raise ValueError(f"level must be one of {LEVELS} and cases >= 1, got {level!r} and {cases}")
    if sites is None:
        sites = present_sites(raw_root)
        if not sites:
            raise ProstateDataError(f"no site folder under {raw_root}; expected some of {', '.join(SITES)}")
    listing = list_sites(raw_root, sites)
    fig = Figure(figsize=(4.2 * cases, 4.4 * len(listing)), facecolor="black")
    grid = fig.subplots(len(listing), cases, squeeze=False)
    for row, (site_name, files) in zip(grid, listing.items(), strict=True):
        for ax, f in zip(row, [*files[:cases], *[None] * cases], strict=False):
            ax.set_xticks([])
            ax.set_yticks([])
            if f is None:
                continue
            case = load_case(f)
            image, mask = to_display(case.image), to_display(case.mask)
            k = preview_slices(mask)[LEVELS.index(level)]
            lo, hi = np.percentile(image, [0.5, 99.5])
            dx, dy, dz = case.spacing
            extent = (0, image.shape[2] * dx, image.shape[1] * dy, 0)
            ax.imshow(image[k], cmap="gray", vmin=lo, vmax=hi, extent=extent, interpolation="bilinear")
            if outline and mask[k].any():
                ax.contour(mask[k], levels=[0.5], colors=["#ff3b30"], linewidths=0.7, extent=extent, origin="upper")
            ax.set_title(
                f"{site_name} {case.case_id} {level}: {dx:.2f} x {dz:.2f} mm, FOV {image.shape[2] * dx:.0f} mm",
                fontsize=8,
                color="w",
            )
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100, facecolor="black")
    return atomic_write_bytes(Path(out_path), buf.getvalue())
