"""Writes the example's data: synthetic dermoscopy images, one torchvision ImageFolder per site.

    <out>/site-1/train/{bkl,mel,nv}/*.png, <out>/site-1/valid/..., <out>/site-2/...

site-i holds cohort i of prrfl's synthetic federation (A, B, C, D: the HAM10000 and ISIC 2017 cohorts,
each with its own acquisition look), so the sites' images differ as real hospitals' do. The images are
rendered from a seed (the same files every time, whatever --sites) and written atomically: a folder is
complete or absent. `site_images` gives one site's images in memory: client.py trains on them when it is
given no --data_root.
"""

import argparse
from functools import lru_cache
from pathlib import Path

from PIL import Image

from prrfl.storage import publish_dir, temp_dir_beside
from prrfl.tasks.derm.layout import CLASS_NAMES, TRAIN_SITES
from prrfl.tasks.derm.plan import SynthImage, plan_federation
from prrfl.tasks.derm.synthetic import render_synthetic_image

SITES = tuple(f"site-{i}" for i in range(1, len(TRAIN_SITES) + 1))  # site-i: cohort TRAIN_SITES[i - 1]
CLASSES = tuple(sorted(CLASS_NAMES))  # ImageFolder's class order: bkl, mel, nv


@lru_cache(maxsize=2)
def _planned(seed: int) -> tuple[SynthImage, ...]:
    return tuple(plan_federation(0.01, seed, sites=TRAIN_SITES, distractors=False))


def site_images(
    site: str, train_per_class: int = 8, valid_per_class: int = 3, size: int = 32, seed: int = 0
) -> dict[str, list[tuple[str, str, Image.Image]]]:
    """The images of `site` (site-1 .. site-4), split -> [(class name, image id, RGB image)]: what
    write_site_folders writes for it."""
    if site not in SITES:
        raise ValueError(
            f"the example's images exist for {', '.join(SITES)}, not for {site!r}: give this site its own images with --data_root"
        )
    cohort = TRAIN_SITES[SITES.index(site)]
    out: dict[str, list[tuple[str, str, Image.Image]]] = {"train": [], "valid": []}
    for name in CLASS_NAMES:
        items = [item for item in _planned(seed) if item.site == cohort and item.dx == name][: train_per_class + valid_per_class]
        for j, item in enumerate(items):
            image = render_synthetic_image(item, 4 * size, 3 * size)  # 4:3, as the cohorts' photographs
            left = (image.width - image.height) // 2
            square = image.crop((left, 0, left + image.height, image.height)).resize((size, size))
            out["train" if j < train_per_class else "valid"].append((name, item.image_id, square))
    return out


def write_site_folders(
    out: Path, sites: int = 2, train_per_class: int = 8, valid_per_class: int = 3, size: int = 32, seed: int = 0
) -> Path:
    """Write <out>/site-1 .. site-<sites> (replacing an older <out>); returns `out`."""
    if not 1 <= sites <= len(SITES):
        raise ValueError(f"sites must lie in [1, {len(SITES)}], got {sites}")
    tmp = temp_dir_beside(out)
    for site in SITES[:sites]:
        for split, images in site_images(site, train_per_class, valid_per_class, size, seed).items():
            for name, image_id, image in images:
                folder = tmp / site / split / name
                folder.mkdir(parents=True, exist_ok=True)
                image.save(folder / f"{image_id}.png")
    return publish_dir(tmp, out, overwrite=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="/tmp/nvflare/fourier_pfa/data")
    parser.add_argument("--sites", type=int, default=2)
    parser.add_argument("--train_per_class", type=int, default=8)
    parser.add_argument("--valid_per_class", type=int, default=3)
    parser.add_argument("--size", type=int, default=32, help="image side in pixels")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    out = write_site_folders(Path(args.out), args.sites, args.train_per_class, args.valid_per_class, args.size, args.seed)
    print(f"wrote {args.sites} sites' images to {out}")


if __name__ == "__main__":
    main()
