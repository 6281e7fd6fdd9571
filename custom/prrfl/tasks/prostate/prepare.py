"""Raw layout -> prepared per-site splits (<out>/<site>/{train,valid,test}.npz) and manifest.json.

Per case (reader.py reads, checks and reorients it): the volume becomes a stack of axial slices in
the radiological view (row 0 anterior, column 0 the patient's right, slice 0 the most inferior);
its intensities are normalised per volume (clipped to the volume's 0.5 and 99.5 percentiles,
then scaled to [0, 1]: MR values have no absolute unit, and the percentiles ignore the few
hottest voxels, such as an endorectal coil's flare); the slices are zero-padded to a square
(centred) and resized to `size` x `size` (area averaging when shrinking, bilinear when growing;
nearest neighbour for masks); images are stored as round(255 x value). Every slice of every
volume is kept, with or without prostate, so that a consumer can rebuild the volume (3-D Dice)
or choose its own slice sampling. The in-plane pixel spacing is not equalised: a site's
resolution and field of view are part of its domain shift.

Split: patient-level, seeded, per site (splitting.py). Each file is written atomically and
manifest.json last, after removing any old one first: a folder with a manifest is complete.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from prrfl.data.manifest import PreparedManifest, config_hash, write_manifest
from prrfl.tasks.derm.splitting import check_fractions

from .layout import MANIFEST_NAME, SPLITS, SYNTHETIC_MARKER, site
from .reader import CaseFiles, ProstateCase, from_display, list_sites, load_case, to_display
from .splitting import MIN_TRAIN_CASES, MIN_VALID_CASES, patient_split
from .store import save_split, split_path

log = logging.getLogger(__name__)

FORMAT = "prrfl.prostate.prepared/1"
PERCENTILES = (0.5, 99.5)
SPLIT_RULE = (
    "patient level, per site: sorted case ids shuffled with numpy default_rng(SeedSequence([seed, crc32(site)])); "
    "test = round(f_test*n), valid = round(f_valid*n) cases (>= 1 each when its fraction > 0), raised to "
    f"min_valid_cases wherever train keeps >= {MIN_TRAIN_CASES} cases, train the rest; all slices of a case in its split"
)


class ProstateManifest(PreparedManifest):
    """The content of <root>/manifest.json, with accessors."""

    FORMAT = FORMAT
    KIND = "prostate"

    def cases(self, site_name: str, split: str) -> list[str]:
        return list(self.data["sites"][site_name]["splits"][split]["cases"])

    def slices(self, site_name: str, split: str) -> int:
        return int(self.data["sites"][site_name]["splits"][split]["slices"])

    def table(self) -> str:
        """Per site: cases and slices per split, and the mean prostate voxel share (raw volumes vs Table I)."""
        head = f"{'site':<7}" + "".join(f"{s:>16}" for s in SPLITS) + f"{'V_P':>9}{'Table I':>9}"
        lines = [head, f"{'':<7}" + "".join(f"{'cases/slices':>16}" for _ in SPLITS)]
        for s, info in self.data["sites"].items():
            cells = "".join(f"{len(self.cases(s, sp))}/{self.slices(s, sp)}".rjust(16) for sp in SPLITS)
            table = info["table_prostate_share"]
            lines.append(f"{s:<7}{cells}{info['prostate_share']:>9.2%}" + (f"{table:>9.2%}" if table else f"{'-':>9}"))
        return "\n".join(lines)


def normalise_volume(stack: np.ndarray) -> np.ndarray:
    """float32 in [0, 1]: the volume clipped to its PERCENTILES and scaled (MONAI ScaleIntensityRangePercentiles)."""
    from monai.transforms import ScaleIntensityRangePercentiles

    lo, hi = PERCENTILES
    out = ScaleIntensityRangePercentiles(lower=lo, upper=hi, b_min=0.0, b_max=1.0, clip=True)(stack[None])
    return np.asarray(out.as_tensor() if hasattr(out, "as_tensor") else out, dtype=np.float32)[0]


def _square_offsets(h: int, w: int) -> tuple[int, int, int]:
    """(side L = max(h, w), top, left) of an [h, w] slice centred in its zero-padded L x L square."""
    side = max(h, w)
    return side, (side - h) // 2, (side - w) // 2


def square_pad(stack: np.ndarray) -> np.ndarray:
    """[Z,H,W] zero-padded, centred, to [Z,L,L] with L = max(H, W)."""
    _, h, w = stack.shape
    side, top, left = _square_offsets(h, w)
    return np.pad(stack, ((0, 0), (top, side - h - top), (left, side - w - left)))


def square_crop(stack: np.ndarray, h: int, w: int) -> np.ndarray:
    """The inverse of square_pad: the centred [Z,h,w] slices of a [Z,L,L] stack padded from them."""
    side, top, left = _square_offsets(h, w)
    if stack.shape[1:] != (side, side):
        raise ValueError(f"expected [Z,{side},{side}] slices padded from {h} x {w}, got {list(stack.shape)}")
    return stack[:, top : top + h, left : left + w]


def resize_slices(stack: np.ndarray, size: int, *, nearest: bool) -> np.ndarray:
    """Each [H,W] slice of a square [Z,H,W] stack resized to [size, size] (MONAI Resize).

    Images: area averaging when shrinking, bilinear when growing; masks (`nearest`): nearest-exact.
    """
    from monai.transforms import Resize

    if stack.shape[1] == size and stack.shape[2] == size:
        return stack.astype(np.float32)
    if nearest:
        resize = Resize((size, size), mode="nearest-exact")
    elif stack.shape[1] > size:
        resize = Resize((size, size), mode="area")
    else:
        resize = Resize((size, size), mode="bilinear", align_corners=False)
    out = resize(stack.astype(np.float32))  # the slice axis serves as MONAI's channel axis
    return np.asarray(out.as_tensor() if hasattr(out, "as_tensor") else out, dtype=np.float32)


def prepare_image(volume: np.ndarray, size: int) -> np.ndarray:
    """uint8 [Z,1,S,S]: the stored slices of a RAS+ image volume (training data and new cases alike)."""
    image = resize_slices(square_pad(normalise_volume(to_display(volume))), size, nearest=False)
    return np.clip(np.rint(image * 255.0), 0, 255).astype(np.uint8)[:, None]


def prepare_case(case: ProstateCase, size: int) -> tuple[np.ndarray, np.ndarray]:
    """(images uint8 [Z,1,S,S], masks uint8 [Z,S,S]) of one case, slices in order (inferior first)."""
    mask = resize_slices(square_pad(to_display(case.mask)), size, nearest=True)
    return prepare_image(case.image, size), (mask > 0.5).astype(np.uint8)


def restore_labels(labels: np.ndarray, volume_shape: tuple[int, int, int]) -> np.ndarray:
    """uint8 RAS+ [X,Y,Z]: per-slice labels [Z,S,S] on the prepared grid, taken back to the grid of the
    RAS+ volume they were prepared from (the inverse of prepare_image's geometry: resized back to the
    padded square with nearest neighbour, the padding cut off, the display view undone)."""
    x, y, z = volume_shape
    if labels.ndim != 3 or labels.shape[0] != z:
        raise ValueError(f"expected [{z},S,S] labels for a volume of shape {list(volume_shape)}, got {list(labels.shape)}")
    side, _, _ = _square_offsets(y, x)  # display slices are [Y, X]
    square = resize_slices(labels, side, nearest=True)
    return from_display(np.rint(square_crop(square, y, x)).astype(np.uint8))


def _prepare_site(
    site_name: str, files: list[CaseFiles], assignment: dict[str, list[str]], out_root: Path, size: int
) -> tuple[dict[str, Any], list[str]]:
    """Write the site's three npz files; returns its manifest section and warnings."""
    by_id = {f.case_id: f for f in files}
    spec = site(site_name)
    info: dict[str, Any] = {
        "client": spec.client,
        "vendor": spec.vendor,
        "table_cases": spec.cases,
        "table_prostate_share": spec.prostate_share,
        "splits": {},
        "cases": {},
    }
    warnings: list[str] = []
    shares = []
    for split in SPLITS:
        images, masks, ids, index = [], [], [], []
        for case_id in assignment[split]:
            case = load_case(by_id[case_id])
            warnings += case.warnings
            im, m = prepare_case(case, size)
            images.append(im)
            masks.append(m)
            ids += [case_id] * im.shape[0]
            index.append(np.arange(im.shape[0]))
            shares.append(case.prostate_share)
            info["cases"][case_id] = {
                "split": split,
                "image": case.files.image.name,
                "mask": case.files.mask.name,
                "shape": list(case.shape),
                "spacing": [round(v, 4) for v in case.spacing],
                "prostate_share": round(case.prostate_share, 6),
                "slices_with_prostate": int(case.mask.any(axis=(0, 1)).sum()),
            }
        im = np.concatenate(images) if images else np.zeros((0, 1, size, size), np.uint8)
        m = np.concatenate(masks) if masks else np.zeros((0, size, size), np.uint8)
        idx = np.concatenate(index) if index else np.zeros(0, np.int64)
        save_split(split_path(out_root, site_name, split), im, m, ids, idx)
        fg = int(m.sum(dtype=np.int64))
        info["splits"][split] = {
            "cases": list(assignment[split]),
            "slices": int(im.shape[0]),
            "slices_with_prostate": int(m.reshape(m.shape[0], -1).any(axis=1).sum()),
            "foreground_pixels": fg,
            "background_pixels": int(m.size) - fg,
        }
    info["prostate_share"] = float(np.mean(shares))
    return info, warnings


def prepare_prostate(
    raw_root: str | Path,
    out_root: str | Path,
    *,
    size: int = 256,
    seed: int = 0,
    split: Sequence[float] = (0.7, 0.1, 0.2),
    sites: Sequence[str] | None = None,
    min_valid_cases: int = MIN_VALID_CASES,
) -> ProstateManifest:
    """Prepare the sites of the raw layout under `raw_root` into `out_root` (see the module docstring).

    `sites` None: the five Table I sites (each must be present) plus I2CVB when its folder exists.
    The whole layout is listed and checked before any volume is read; a bad case stops the
    preparation with an error naming its file.
    """
    t0 = time.perf_counter()
    if not isinstance(size, int) or isinstance(size, bool) or size < 8:
        raise ValueError(f"size must be an integer >= 8, got {size!r}")
    fractions = check_fractions(split)
    raw_root, out_root = Path(raw_root), Path(out_root)
    listing = list_sites(raw_root, sites)
    assignments = {s: patient_split([f.case_id for f in files], fractions, seed, s, min_valid_cases) for s, files in listing.items()}
    (out_root / MANIFEST_NAME).unlink(missing_ok=True)  # from here on the folder is not complete

    sites_info: dict[str, Any] = {}
    warnings: list[str] = []
    for s, files in listing.items():
        sites_info[s], w = _prepare_site(s, files, assignments[s], out_root, size)
        warnings += w
        slices = sum(v["slices"] for v in sites_info[s]["splits"].values())
        log.info("prepared site %s: %d cases, %d slices", s, len(files), slices)

    marker = raw_root / SYNTHETIC_MARKER
    synthetic = None
    if marker.is_file():
        synthetic = {k: v for k, v in json.loads(marker.read_text()).items() if k != "cases"}
    config = {
        "format": FORMAT,
        "size": size,
        "seed": seed,
        "split": list(fractions),
        "min_valid_cases": min_valid_cases,
        "sites": list(listing),
        "normalisation": {"method": "percentile clip then scale to [0, 1]", "percentiles": list(PERCENTILES)},
        "synthetic": synthetic,
    }
    manifest = {
        "format": FORMAT,
        "config": config,
        "config_hash": config_hash(config),
        "image_layout": "images uint8 [N,1,S,S] = round(255 x normalised slice); masks uint8 [N,S,S] in {0,1}; "
        "case_ids str [N]; slice_index int64 [N]",
        "orientation": "axial slices, radiological view: row 0 anterior, column 0 the patient's right; "
        "slice_index 0 = most inferior slice; all slices of every volume kept",
        "resizing": "zero-pad to a centred square, then area (shrink) / bilinear (grow) for images, nearest-exact for masks",
        "split_rule": SPLIT_RULE,
        "sources": {"raw_root": str(raw_root.resolve())},
        "sites": sites_info,
        "warnings": warnings,
    }
    write_manifest(out_root, manifest)
    log.info("prepared %d site(s) at %d px into %s in %.1f s", len(listing), size, out_root, time.perf_counter() - t0)
    return ProstateManifest(out_root, manifest)
