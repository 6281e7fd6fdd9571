"""Reading the raw multi-site layout: case listing, NIfTI loading, reorientation, checks.

A site folder holds `<case>.nii.gz` (T2 volume) and `<case>_segmentation.nii.gz` or
`<case>_Segmentation.nii.gz` (binary whole-gland mask; both spellings occur in the public set,
any other spelling is refused). Volumes are reoriented to the closest canonical (RAS+) axes with
the image's own orientation, applied to the image and its mask alike (so their voxels stay paired
even where a mask header is sloppy): axis 0 runs to the patient's right, axis 1 anterior, axis 2
(the last, the slice axis of an axial acquisition) superior. `to_display` turns such a volume into
a stack of axial slices as a radiologist views them.

Every refusal is a ProstateDataError (a ValueError) whose message names the file or folder and
says what was expected: no case is ever read silently wrong.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import nibabel as nib
import numpy as np
from nibabel import orientations

from .layout import MASK_TAGS, OPTIONAL_SITES, SITES, TABLE_SITES, nifti_stem, site

log = logging.getLogger(__name__)

SPACING_TOLERANCE = 0.01  # relative voxel-size difference between image and mask that is only a warning


class ProstateDataError(ValueError):
    """Raw prostate data that cannot be used as it is; the message names the file and what was expected."""


@dataclass(frozen=True)
class CaseFiles:
    """The two files of one case."""

    site: str
    case_id: str
    image: Path
    mask: Path


@dataclass(frozen=True)
class ProstateCase:
    """One loaded case, in canonical RAS+ voxel order (slice axis last)."""

    site: str
    case_id: str
    image: np.ndarray  # float32 [X, Y, Z]
    mask: np.ndarray  # uint8 [X, Y, Z] in {0, 1}
    spacing: tuple[float, float, float]  # mm along X, Y, Z
    affine: np.ndarray  # 4x4, voxel -> world (RAS mm) of the reoriented arrays
    files: CaseFiles
    warnings: tuple[str, ...] = field(default=())

    @property
    def shape(self) -> tuple[int, int, int]:
        return tuple(int(v) for v in self.image.shape)  # type: ignore[return-value]

    @property
    def prostate_share(self) -> float:
        """Fraction of the volume's voxels inside the prostate (Table I's V_P for one case)."""
        return float(self.mask.mean())


def _natural_key(case_id: str) -> list[object]:
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", case_id)]


def _expected(case_id: str) -> str:
    return f"{case_id}{MASK_TAGS[0]}.nii.gz or {case_id}{MASK_TAGS[1]}.nii.gz"


def list_cases(raw_root: str | Path, site_name: str) -> list[CaseFiles]:
    """The cases of one site folder, in natural case order, each image paired with its mask.

    Files that are not NIfTI by their name (and hidden files) are ignored; an image without mask,
    a mask without image, a mask tag spelled otherwise, a case given twice, a missing or empty
    folder are refused.
    """
    site(site_name)
    folder = Path(raw_root) / site_name
    if not folder.is_dir():
        what = "is not a folder" if folder.exists() else "is missing"
        raise ProstateDataError(f"site folder {folder} {what}; expected a folder per site ({', '.join(SITES)}) under {raw_root}")
    images: dict[str, Path] = {}
    masks: dict[str, Path] = {}
    for path in sorted(folder.iterdir()):
        stem = nifti_stem(path.name)
        if path.name.startswith(".") or stem is None or not path.is_file():
            if not path.name.startswith("."):
                log.debug("%s: not a NIfTI file, ignored", path)
            continue
        tag = next((t for t in MASK_TAGS if stem.endswith(t) and len(stem) > len(t)), None)
        if tag is None and stem.lower().endswith(MASK_TAGS[0]):
            case_id = stem[: -len(MASK_TAGS[0])]
            raise ProstateDataError(f"{path}: mask file name not recognised; expected {_expected(case_id)} (the tag is case-sensitive)")
        case_id, table = (stem[: -len(tag)], masks) if tag else (stem, images)
        if case_id in table:
            kind = "mask" if tag else "image"
            both = f"{table[case_id].name} and {path.name}"
            raise ProstateDataError(f"{path}: case {case_id} has two {kind} files ({both}); expected one")
        table[case_id] = path
    for case_id, path in masks.items():
        if case_id not in images:
            raise ProstateDataError(f"{path}: mask without image; expected {folder / (case_id + '.nii.gz')}")
    for case_id, path in images.items():
        if case_id not in masks:
            raise ProstateDataError(f"{path}: image without mask; expected {_expected(case_id)} in {folder}")
    if not images:
        raise ProstateDataError(
            f"site folder {folder} holds no case; expected <case>.nii.gz volumes with their {_expected('<case>')} masks"
        )
    return [CaseFiles(site_name, c, images[c], masks[c]) for c in sorted(images, key=_natural_key)]


def resolve_sites(raw_root: str | Path, sites: Sequence[str] | None) -> list[str]:
    """The sites to read: as given, or (None) the Table I sites plus the optional ones present."""
    if sites is not None:
        names = [site(s).name for s in sites]
        if len(set(names)) != len(names):
            raise ValueError(f"sites {list(sites)} name a site twice")
        return names
    return list(TABLE_SITES) + [s for s in OPTIONAL_SITES if (Path(raw_root) / s).is_dir()]


def present_sites(raw_root: str | Path) -> list[str]:
    """The known sites that have a folder under `raw_root`, in Table I order."""
    return [s for s in SITES if (Path(raw_root) / s).is_dir()]


def list_sites(raw_root: str | Path, sites: Sequence[str] | None = None) -> dict[str, list[CaseFiles]]:
    """Per site, its cases (see list_cases and resolve_sites)."""
    raw_root = Path(raw_root)
    if not raw_root.is_dir():
        raise ProstateDataError(f"raw prostate folder {raw_root} is missing; expected one folder per site inside it")
    return {s: list_cases(raw_root, s) for s in resolve_sites(raw_root, sites)}


def _reason(e: BaseException) -> str:
    text = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    return text if len(text) < 200 else text[:200] + "..."


def _read_nifti(path: Path, what: str) -> tuple[np.ndarray, np.ndarray, nib.Nifti1Image | nib.Nifti2Image]:
    """(data, affine, the nibabel image) of a 3-D NIfTI volume (a trailing singleton 4th axis is dropped)."""
    if not path.is_file():
        raise ProstateDataError(f"{what} file {path} is missing")
    expected = "expected a readable 3-D NIfTI volume (.nii or .nii.gz)"
    try:
        img = nib.load(str(path))
    except Exception as e:  # nibabel raises ImageFileError, OSError, EOFError, zlib.error, ValueError...
        raise ProstateDataError(f"cannot read {what} {path}: {_reason(e)}; {expected}") from e
    if not isinstance(img, (nib.Nifti1Image, nib.Nifti2Image)):
        raise ProstateDataError(f"{what} {path} is a {type(img).__name__}, not NIfTI; {expected}")
    shape = tuple(int(v) for v in img.shape)
    if len(shape) == 4 and shape[3] == 1:
        shape = shape[:3]
    if len(shape) != 3 or min(shape) < 1:
        raise ProstateDataError(f"{what} {path} has shape {list(img.shape)}; {expected}")
    try:
        data = np.asanyarray(img.dataobj).reshape(shape)
    except Exception as e:  # truncated or corrupt data after a valid header
        raise ProstateDataError(f"cannot read the voxels of {what} {path}: {_reason(e)}; {expected}") from e
    affine = np.asarray(img.affine, dtype=np.float64)
    if not np.isfinite(affine).all() or abs(np.linalg.det(affine[:3, :3])) < 1e-9:
        raise ProstateDataError(f"{what} {path} has an invalid affine (not finite or singular): {affine.tolist()}")
    return data, affine, img


def _check_image_values(image: np.ndarray, path: Path) -> np.ndarray:
    """float32 intensities of an image volume: finite and not constant."""
    if not np.isfinite(image).all():
        raise ProstateDataError(f"image {path} has non-finite voxels (NaN or inf); expected finite intensities")
    image = image.astype(np.float32)
    if float(image.max()) <= float(image.min()):
        raise ProstateDataError(f"image {path} is constant ({float(image.min()):g}); expected an MR volume")
    return image


def canonical_orientation(affine: np.ndarray, shape: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
    """(nibabel orientation of the stored axes, the voxel -> world affine of the volume reoriented to the
    closest canonical RAS+ axes), as nibabel's as_closest_canonical."""
    ornt = orientations.io_orientation(affine)
    return ornt, affine @ orientations.inv_ornt_aff(ornt, tuple(shape))


def to_canonical(volume: np.ndarray, ornt: np.ndarray, dtype: type) -> np.ndarray:
    """A volume in stored voxel order -> RAS+ voxel order (`ornt` from canonical_orientation)."""
    return np.ascontiguousarray(orientations.apply_orientation(volume, ornt), dtype=dtype)


def from_canonical(volume: np.ndarray, ornt: np.ndarray) -> np.ndarray:
    """The inverse of to_canonical: a RAS+ volume back in the stored voxel order of the file it came from."""
    back = orientations.ornt_transform(orientations.axcodes2ornt(("R", "A", "S")), ornt)
    return np.ascontiguousarray(orientations.apply_orientation(volume, back))


@dataclass(frozen=True)
class ImageVolume:
    """One image volume without a mask (a new case to segment): RAS+ intensities and what undoes the reorientation."""

    path: Path
    image: np.ndarray  # float32 [X, Y, Z], RAS+ (as ProstateCase.image)
    ornt: np.ndarray  # orientation of the stored axes: from_canonical(image, ornt) has the file's voxel order
    source: nib.Nifti1Image | nib.Nifti2Image  # the file's header and affine (dataobj not read again)
    shape: tuple[int, int, int]  # the stored voxel grid


def load_image(path: str | Path) -> ImageVolume:
    """Read, check and reorient one image volume as load_case does for a case's image."""
    path = Path(path)
    data, affine, img = _read_nifti(path, "image")
    image = _check_image_values(data, path)
    ornt, _ = canonical_orientation(affine, image.shape)
    return ImageVolume(path, to_canonical(image, ornt, np.float32), ornt, img, tuple(int(v) for v in image.shape))


def _check_mask_values(mask: np.ndarray, path: Path) -> np.ndarray:
    binary = (mask == 0) | (mask == 1)
    if not binary.all():
        bad = np.unique(mask[~binary])
        shown = ", ".join(f"{v:g}" for v in bad[:5]) + (", ..." if bad.size > 5 else "")
        raise ProstateDataError(f"mask {path} has label(s) {shown}; expected a binary prostate mask with labels 0 and 1 only")
    out = mask.astype(np.uint8)
    if not out.any():
        raise ProstateDataError(f"mask {path} has no prostate voxel (all 0); expected labels 0 and 1")
    return out


def load_case(files: CaseFiles) -> ProstateCase:
    """Read, check and reorient one case (image float32, mask uint8, both RAS+, slice axis last)."""
    image, affine, _ = _read_nifti(files.image, "image")
    mask, mask_affine, _ = _read_nifti(files.mask, "mask")
    if image.shape != mask.shape:
        raise ProstateDataError(
            f"mask {files.mask} has shape {list(mask.shape)} but its image {files.image.name} has "
            f"{list(image.shape)}; expected the same voxel grid"
        )
    image = _check_image_values(image, files.image)
    mask = _check_mask_values(mask, files.mask)

    codes, mask_codes = orientations.aff2axcodes(affine), orientations.aff2axcodes(mask_affine)
    if codes != mask_codes:
        raise ProstateDataError(
            f"mask {files.mask} is oriented {''.join(mask_codes)} but its image {files.image.name} is "
            f"{''.join(codes)}; expected both on the same voxel grid"
        )
    warnings: list[str] = []
    sizes, mask_sizes = nib.affines.voxel_sizes(affine), nib.affines.voxel_sizes(mask_affine)
    if np.any(np.abs(sizes - mask_sizes) > SPACING_TOLERANCE * sizes):
        warnings.append(
            f"mask {files.mask} has voxel size {np.round(mask_sizes, 3).tolist()} mm, its image "
            f"{np.round(sizes, 3).tolist()} mm: the image's is used"
        )
    if np.any(np.abs(affine[:3, 3] - mask_affine[:3, 3]) > 0.5 * sizes.max()):
        warnings.append(f"mask {files.mask} has a different origin than its image: voxels are paired by index")

    ornt, canonical = canonical_orientation(affine, image.shape)
    image = to_canonical(image, ornt, np.float32)
    mask = to_canonical(mask, ornt, np.uint8)
    sx, sy, sz = (float(v) for v in nib.affines.voxel_sizes(canonical))
    spacing = (sx, sy, sz)
    if spacing[2] < min(spacing[:2]):
        warnings.append(
            f"image {files.image}: slices ({spacing[2]:.2f} mm) are thinner than the in-plane spacing "
            f"{spacing[0]:.2f} x {spacing[1]:.2f} mm; expected an axial acquisition"
        )
    for w in warnings:
        log.warning(w)
    return ProstateCase(files.site, files.case_id, image, mask, spacing, canonical, files, tuple(warnings))


def to_display(volume: np.ndarray) -> np.ndarray:
    """[Z, H, W] axial slices in radiological view from a RAS+ [X, Y, Z] volume.

    Slice 0 is the most inferior (apex side); in each slice row 0 is anterior and column 0 the
    patient's right (shown on the viewer's left).
    """
    if volume.ndim != 3:
        raise ValueError(f"expected a 3-D volume, got shape {list(volume.shape)}")
    return np.ascontiguousarray(volume[::-1, ::-1, :].transpose(2, 1, 0))


def from_display(stack: np.ndarray) -> np.ndarray:
    """The RAS+ [X, Y, Z] volume of a [Z, H, W] radiological stack (inverse of to_display)."""
    if stack.ndim != 3:
        raise ValueError(f"expected a 3-D stack, got shape {list(stack.shape)}")
    return np.ascontiguousarray(stack.transpose(2, 1, 0)[::-1, ::-1, :])
