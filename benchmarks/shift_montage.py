"""The synthetic federations' sites at several acquisition shifts (`data.synthetic_shift`), one picture per task.

Rows are the sites, columns the shifts: prostate, the mid-gland slice of each site's first case as a reader shows it
(the volume's 0.5-99.5 percentile window); dermoscopy, the same planned lesions of each cohort photographed with the
cohort's shifted acquisition. The same case and lesion seeds in every column, so a column differs from the next only
by the acquisition.

    python benchmarks/shift_montage.py --shifts 0 1 2 3 --out docs/results/calibration
"""

from __future__ import annotations

import argparse
import io
from pathlib import Path

import numpy as np
from matplotlib.figure import Figure
from PIL import Image

from prrfl.storage import atomic_write_bytes
from prrfl.tasks.derm.plan import plan_federation
from prrfl.tasks.derm.synthetic import render_synthetic_image
from prrfl.tasks.prostate.layout import TABLE_SITES
from prrfl.tasks.prostate.preview import LEVELS, preview_slices
from prrfl.tasks.prostate.synthetic import plan_case, synthesize_case

DERM_SITES = ("A", "B", "C", "D")


def _save(fig: Figure, path: Path) -> Path:
    """As a JPEG (photographs and MR slices: a fraction of a PNG's bytes)."""
    rendered, out = io.BytesIO(), io.BytesIO()
    fig.savefig(rendered, format="png", dpi=72, facecolor=fig.get_facecolor())
    with Image.open(rendered) as image:
        image.convert("RGB").save(out, format="jpeg", quality=85, optimize=True)
    return atomic_write_bytes(path, out.getvalue())


def prostate_montage(shifts: list[float], out: Path, case: int = 0, matrix_scale: float = 1 / 3) -> Path:
    fig = Figure(figsize=(2.4 * len(shifts), 2.5 * len(TABLE_SITES)), facecolor="black")
    grid = fig.subplots(len(TABLE_SITES), len(shifts), squeeze=False)
    for row, site in zip(grid, TABLE_SITES, strict=True):
        plan = plan_case(site, case, 0, matrix_scale=matrix_scale)
        for ax, shift in zip(row, shifts, strict=True):
            synth = synthesize_case(plan, shift)
            image, mask = synth.image, synth.mask  # already in the radiological view
            k = preview_slices(mask)[LEVELS.index("mid-gland")]
            lo, hi = np.percentile(image, [0.5, 99.5])
            ax.imshow(image[k], cmap="gray", vmin=lo, vmax=hi, interpolation="bilinear")
            ax.set_xticks([])
            ax.set_yticks([])
            ax.set_title(f"{site}, shift {shift:g}", fontsize=8, color="w")
    fig.tight_layout()
    return _save(fig, out / "shift_montage_prostate.jpg")


def derm_montage(shifts: list[float], out: Path, per_site: int = 2) -> Path:
    items = plan_federation(0.02, 0, sites=DERM_SITES, distractors=False)
    chosen = [i for s in DERM_SITES for i in [i for i in items if i.site == s][:per_site]]
    fig = Figure(figsize=(2.0 * per_site * len(shifts), 1.6 * len(DERM_SITES)), facecolor="white")
    grid = fig.subplots(len(DERM_SITES), per_site * len(shifts), squeeze=False)
    for r, site in enumerate(DERM_SITES):
        mine = [i for i in chosen if i.site == site]
        for c, shift in enumerate(shifts):
            for j, item in enumerate(mine):
                ax = grid[r][c * per_site + j]
                ax.imshow(np.asarray(render_synthetic_image(item, 300, 225, shift)))
                ax.set_xticks([])
                ax.set_yticks([])
                ax.set_title(f"{site} {item.kind}, shift {shift:g}", fontsize=7)
    fig.tight_layout()
    return _save(fig, out / "shift_montage_derm.jpg")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shifts", type=float, nargs="+", default=[0.0, 1.0, 2.0, 3.0])
    parser.add_argument("--out", type=Path, default=Path("."))
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    for path in (prostate_montage(args.shifts, args.out), derm_montage(args.shifts, args.out)):
        print(path)


if __name__ == "__main__":
    main()
