"""The dermoscopy task (nv / bkl / mel; sites A, B, C = HAM10000 cohorts, D = ISIC 2017 MSK, OOD = ViDIR legacy),
one package: `task.DermTask` (the task contract, with its job profiles), its data, and its data command line
(`python -m prrfl.tasks.derm`).

Raw layouts are read by `records` (HAM10000, ISIC 2017) and `author_splits` (the authors' per-client
files); `synthetic` writes the same raw layouts from a seed; `prepare` turns raw layouts into
per-site npz splits read back by `store.load_split`; `cache.ensure_synthetic_federation` is the
embedded default. Names are imported lazily so that image worker processes do not import torch.
"""

from __future__ import annotations

from prrfl.data.lazy import lazy_exports

_EXPORTS = {
    "DermTask": "task",
    "CLASS_NAMES": "layout",
    "SITES": "layout",
    "SITE_NAMES": "layout",
    "TRAIN_SITES": "layout",
    "SPLITS": "layout",
    "RawLayout": "layout",
    "DEFAULT_LAYOUT": "layout",
    "ImageRecord": "records",
    "read_ham10000": "records",
    "read_isic2017": "records",
    "read_sites": "records",
    "AuthorRow": "author_splits",
    "read_author_split_file": "author_splits",
    "read_author_splits": "author_splits",
    "author_split_counts": "author_splits",
    "table_counts": "plan",
    "plan_federation": "plan",
    "SynthImage": "plan",
    "generate_synthetic": "synthetic",
    "render_synthetic_image": "synthetic",
    "SITE_PROFILES": "acquisition",
    "LesionSpec": "lesions",
    "sample_lesion": "lesions",
    "stratified_assignment": "splitting",
    "load_square": "images",
    "prepare_dermoscopy": "prepare",
    "Manifest": "prepare",
    "DermSplit": "store",
    "load_split": "store",
    "class_counts": "store",
    "ensure_synthetic_federation": "cache",
}
__all__, __getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
