"""Realism checks of the synthetic Fed-ISIC2019 (the checks the other tasks' generators pass): the centre shows in the
image (a site shift a federated method must cope with), the class shows in the image (learnable), and no shortcut
gives the class away (a raw image's size depends on its centre only). Prints the figures.

    python benchmarks/isic2019_realism.py [--scale 0.08] [--size 64] [--shift 1.0]

Linear probes (scikit-learn logistic regression, 5-fold cross-validation) on an 8 x 8 RGB thumbnail of each prepared
image: the centre from the image (accuracy against the share of the largest centre), the class from the image
(balanced accuracy against 12.5 %), and the class from the centre alone (what a model gets from knowing the site).
"""

from __future__ import annotations

import argparse
import collections
import csv

import numpy as np
import torch.nn.functional as F
from PIL import Image
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import accuracy_score, balanced_accuracy_score
from sklearn.model_selection import cross_val_predict
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import OneHotEncoder, StandardScaler

from prrfl.config import RunConfig
from prrfl.registry import build_task
from prrfl.tasks.isic2019.layout import CENTRES, IMAGES_DIR, SPLIT_CSV
from prrfl.tasks.isic2019.store import load_split


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scale", type=float, default=0.08)
    ap.add_argument("--size", type=int, default=64)
    ap.add_argument("--shift", type=float, default=1.0)
    args = ap.parse_args()
    task = build_task(
        RunConfig.from_dict(
            {"task": "isic2019", "data": {"synthetic_scale": args.scale, "image_size": args.size, "synthetic_shift": args.shift}}
        )
    )
    root = task.prepared_root(None)
    thumbs, classes, centres = [], [], []
    for i, centre in enumerate(CENTRES):
        for split in ("train", "valid", "test"):
            s = load_split(root, centre, split)
            if len(s):
                thumbs.append(F.adaptive_avg_pool2d(s.images.float(), 8).flatten(1).numpy())
                classes += s.labels.tolist()
                centres += [i] * len(s)
    x, y, c = np.concatenate(thumbs), np.array(classes), np.array(centres)
    probe = make_pipeline(StandardScaler(), LogisticRegression(max_iter=2000))
    centre_acc = accuracy_score(c, cross_val_predict(probe, x, c, cv=5))
    class_bacc = balanced_accuracy_score(y, cross_val_predict(probe, x, y, cv=5))
    onehot = OneHotEncoder().fit_transform(c[:, None]).toarray()
    prior_bacc = balanced_accuracy_score(y, cross_val_predict(LogisticRegression(max_iter=2000), onehot, y, cv=5))
    print(f"synthetic Fed-ISIC2019 at scale {args.scale}, {args.size} px, shift {args.shift}: {len(y)} images ({root})")
    print(f"centre from the image: accuracy {100 * centre_acc:.1f} % (largest centre's share {100 * np.bincount(c).max() / len(c):.1f} %)")
    print(f"class from the image: balanced accuracy {100 * class_bacc:.1f} % (chance 12.5 %)")
    print(f"class from the centre alone: balanced accuracy {100 * prior_bacc:.1f} %")
    raw = root.parent / "raw"
    sizes: dict[tuple[str, str], set] = collections.defaultdict(set)
    with (raw / SPLIT_CSV).open() as f:
        for row in csv.DictReader(f):
            with Image.open(raw / IMAGES_DIR / f"{row['image']}.jpg") as im:
                sizes[(CENTRES[int(row["center"])], row["target"])].add(im.size)
    for centre in CENTRES:
        per_class = {t: s for (cc, t), s in sizes.items() if cc == centre}
        distinct = set().union(*per_class.values())
        print(
            f"raw size at {centre}: {sorted(distinct)} for every class ({len(per_class)} classes): {'no' if len(distinct) == 1 else 'A'} size shortcut"
        )


if __name__ == "__main__":
    main()
