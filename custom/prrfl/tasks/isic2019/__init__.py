"""The Fed-ISIC2019 task (FLamby's six centres, eight classes, FCA's benchmark), one package: `task.Isic2019Task`
(the task contract, with its job profiles), FLamby's layout (`layout`, read by `records`), the preparation
(`prepare`, read back by `store`), the synthetic Fed-ISIC2019 in that layout (`synthetic`, pixels by `render`),
the embedded default (`cache`) and the data command line (`python -m prrfl.tasks.isic2019`). Names are imported
lazily, so that rendering workers do not import torch.
"""

from __future__ import annotations

from prrfl.data.lazy import lazy_exports

_EXPORTS = {
    "Isic2019Task": "task",
    "CLASS_NAMES": "layout",
    "CENTRES": "layout",
    "COUNTS": "layout",
    "IsicRecord": "records",
    "read_flamby": "records",
    "prepare_isic2019": "prepare",
    "load_split": "store",
    "generate_synthetic_isic2019": "synthetic",
    "ensure_synthetic_isic2019": "cache",
}
__all__, __getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
