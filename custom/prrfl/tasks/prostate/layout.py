"""The facts of the prostate task in one place: sites, Table I, on-disk file names, prepared names.

Multi-site T2-weighted prostate MRI (the set used by MS-Net, SAML, FedDG and HarmoFL): one
folder per site, `CaseNN.nii.gz` volumes with binary whole-gland masks. Clients A-E of the
paper's Table I are RUNMC, BMC, UCL, BIDMC and HK; I2CVB is an optional sixth site that Table I
does not list.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from prrfl.data.manifest import MANIFEST_NAME  # noqa: F401 - re-exported (prepared layout)

SPLITS: tuple[str, ...] = ("train", "valid", "test")


@dataclass(frozen=True)
class ProstateSite:
    """One site of the federation and its Table I row."""

    name: str
    client: str  # Table I client letter ('' for a site outside Table I)
    cases: int  # number of cases (Table I; I2CVB: the public set)
    vendor: str
    prostate_share: float | None  # Table I V_P: prostate voxels / all voxels (None where Table I has no value)
    endorectal_coil: bool = False
    in_table: bool = True


SITES: dict[str, ProstateSite] = {
    s.name: s
    for s in (
        ProstateSite("RUNMC", "A", 30, "Siemens", 0.0265),
        ProstateSite("BMC", "B", 30, "Philips", 0.0176, endorectal_coil=True),
        ProstateSite("UCL", "C", 13, "Siemens", 0.0145),
        ProstateSite("BIDMC", "D", 12, "GE", 0.0216, endorectal_coil=True),
        ProstateSite("HK", "E", 12, "Siemens", 0.0139, endorectal_coil=True),
        ProstateSite("I2CVB", "", 19, "Siemens", None, in_table=False),
    )
}
SITE_NAMES: tuple[str, ...] = tuple(SITES)
TABLE_SITES: tuple[str, ...] = tuple(n for n, s in SITES.items() if s.in_table)  # clients A-E
OPTIONAL_SITES: tuple[str, ...] = tuple(n for n, s in SITES.items() if not s.in_table)

# Raw layout: <raw_root>/<SITE>/<case>.nii.gz with <case>_segmentation.nii.gz or <case>_Segmentation.nii.gz
NIFTI_SUFFIXES: tuple[str, ...] = (".nii.gz", ".nii")
MASK_TAGS: tuple[str, ...] = ("_segmentation", "_Segmentation")
CASE_ID_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")

# Prepared layout: <out_root>/<site>/<split>.npz and <out_root>/manifest.json
SYNTHETIC_MARKER = "synthetic.json"  # written by the generator at the raw root


def site(name: str) -> ProstateSite:
    """The ProstateSite called `name`, with an error listing the valid names."""
    try:
        return SITES[name]
    except KeyError:
        raise ValueError(f"unknown prostate site {name!r}; expected one of {list(SITES)}") from None


def nifti_stem(filename: str) -> str | None:
    """`Case00` for `Case00.nii.gz` / `Case00.nii`; None for a file that is not NIfTI by its name."""
    for suffix in NIFTI_SUFFIXES:
        if filename.endswith(suffix) and len(filename) > len(suffix):
            return filename[: -len(suffix)]
    return None
