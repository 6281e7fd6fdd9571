"""The prostate task: multi-site T2 MRI segmentation (clients A-E = RUNMC, BMC, UCL, BIDMC, HK; I2CVB optional), one
package: `task.ProstateTask` (the task contract, with its job profiles), its data, and its data command line
(`python -m prrfl.tasks.prostate`).

`reader` lists, loads, checks and reorients the raw NIfTI layout; `synthetic` writes the same raw
layout from a seed (anatomy: `anatomy`, per-site scanners: `scanner`); `prepare` turns a raw
layout into per-site npz splits of axial slices read back by `store.load_split`;
`cache.ensure_synthetic_prostate` is the embedded default; `preview` draws PNGs to look at.
Names are imported lazily, so that reading the raw layout needs neither torch nor MONAI.
"""

from __future__ import annotations

from prrfl.data.lazy import lazy_exports

_EXPORTS = {
    "ProstateTask": "task",
    "SITES": "layout",
    "SITE_NAMES": "layout",
    "TABLE_SITES": "layout",
    "SPLITS": "layout",
    "ProstateSite": "layout",
    "ProstateDataError": "reader",
    "CaseFiles": "reader",
    "ProstateCase": "reader",
    "list_cases": "reader",
    "list_sites": "reader",
    "load_case": "reader",
    "present_sites": "reader",
    "to_display": "reader",
    "from_display": "reader",
    "patient_split": "splitting",
    "prepare_prostate": "prepare",
    "prepare_case": "prepare",
    "ProstateManifest": "prepare",
    "ProstateSplit": "store",
    "load_split": "store",
    "case_counts": "synthetic",
    "generate_synthetic_prostate": "synthetic",
    "plan_case": "synthetic",
    "synthesize_case": "synthetic",
    "SCANNER_PROFILES": "scanner",
    "ensure_synthetic_prostate": "cache",
    "write_previews": "preview",
}
__all__, __getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
