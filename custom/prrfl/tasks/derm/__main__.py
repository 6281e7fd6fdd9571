"""Command line: `python -m prrfl.tasks.derm {synth,prepare,splits} ...`.

synth    write the synthetic raw layout (HAM10000 + ISIC 2017 files)
prepare  raw layout -> per-site npz splits + manifest.json, prints the class-count table
splits   check the authors' split files and print their class counts
"""

from __future__ import annotations

import argparse
import sys
import time

from prrfl.data.command_line import command_parser, print_prepared, run_main

from .layout import SITE_NAMES, SPLITS
from .splitting import HELDOUT_MIN_PER_CLASS


def _size(text: str) -> tuple[int, int]:
    try:
        w, h = (int(v) for v in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected WIDTHxHEIGHT, e.g. 600x450, got {text!r}") from None
    return w, h


def _parser() -> argparse.ArgumentParser:
    p, common, add = command_parser(__package__, __doc__)

    s = add("synth", parents=[common], help="write a synthetic raw layout")
    s.add_argument("--out", required=True, help="folder to create (must not exist unless --overwrite)")
    s.add_argument("--scale", type=float, default=1.0, help="fraction of the Table I sizes (1.0 = Table I)")
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--size", type=_size, default=(600, 450), help="image WIDTHxHEIGHT (HAM10000: 600x450)")
    s.add_argument("--workers", type=int, default=1)
    s.add_argument("--author-metadata", default=None, help="authors' split folder: use its ids, lesions and demographics")
    s.add_argument("--no-distractors", action="store_true", help="omit the rows the loaders must drop")
    s.add_argument(
        "--heldout-min-per-class",
        type=int,
        default=HELDOUT_MIN_PER_CLASS,
        metavar="M",
        help="per-class floor of the counts: M images per class for each split a site has",
    )
    s.add_argument("--overwrite", action="store_true")

    q = add("prepare", parents=[common], help="prepare per-site splits from a raw layout")
    q.add_argument("--raw", required=True, help="folder holding HAM10000_metadata.csv (and ISIC-2017/)")
    q.add_argument("--out", required=True)
    q.add_argument("--size", type=int, default=128)
    q.add_argument("--seed", type=int, default=0)
    q.add_argument("--split", type=float, nargs=3, default=(0.7, 0.1, 0.2), metavar=("TRAIN", "VALID", "TEST"))
    q.add_argument("--group-by", choices=("image", "lesion"), default="image")
    q.add_argument("--author-splits", default=None, help="use the authors' split files in this folder for sites A-D")
    q.add_argument("--allow-missing", action="store_true", help="with --author-splits: skip listed ids absent from the raw data")
    q.add_argument("--isic-root", default=None, help="folder holding ISIC-2017/ (default: --raw)")
    q.add_argument("--sites", nargs="+", default=list(SITE_NAMES), choices=SITE_NAMES)
    q.add_argument(
        "--heldout-min-per-class",
        type=int,
        default=HELDOUT_MIN_PER_CLASS,
        metavar="M",
        help="warn when valid or test holds fewer than M images of a class",
    )
    q.add_argument(
        "--enforce-heldout-min",
        action="store_true",
        help="stratified split: give valid and test at least M images of each class, taken from train",
    )
    q.add_argument("--workers", type=int, default=1)

    a = add("splits", parents=[common], help="validate the authors' split files and print their counts")
    a.add_argument("--dir", required=True)
    return p


def main(argv: list[str] | None = None) -> int:
    """Exit status and error format: prrfl.errors.EXIT_STATUS (the --help epilog)."""
    return run_main(_parser(), _run, argv)


def _run(args: argparse.Namespace) -> int:
    t0 = time.perf_counter()
    if args.cmd == "synth":
        from .synthetic import generate_synthetic

        info = generate_synthetic(
            args.out,
            scale=args.scale,
            seed=args.seed,
            image_size=args.size,
            workers=args.workers,
            metadata_dir=args.author_metadata,
            distractors=not args.no_distractors,
            heldout_min_per_class=args.heldout_min_per_class,
            overwrite=args.overwrite,
        )
        print(f"{'site':<5}{'nv':>7}{'bkl':>7}{'mel':>7}")
        for s, c in info["counts"].items():
            print(f"{s:<5}" + "".join(f"{v:>7}" for v in c.values()))
        dropped, secs = info["distractor_rows"], time.perf_counter() - t0
        print(f"{info['images']} images ({dropped} to be dropped by the loaders) in {args.out}, {secs:.1f} s")
    elif args.cmd == "prepare":
        from .prepare import prepare_dermoscopy

        m = prepare_dermoscopy(
            args.raw,
            args.out,
            size=args.size,
            seed=args.seed,
            split=args.split,
            group_by=args.group_by,
            author_splits_dir=args.author_splits,
            sites=args.sites,
            isic_root=args.isic_root,
            workers=args.workers,
            allow_missing=args.allow_missing,
            heldout_min_per_class=args.heldout_min_per_class,
            enforce_heldout_min=args.enforce_heldout_min,
        )
        print_prepared(m, args.out, t0)
    else:
        from .author_splits import author_split_counts, read_author_splits

        counts = author_split_counts(read_author_splits(args.dir))
        print(f"{'site':<5}" + "".join(f"{s:>22}" for s in SPLITS))
        for s, by in counts.items():
            print(f"{s:<5}" + "".join(f"{'/'.join(map(str, by[sp]))} = {sum(by[sp])}".rjust(22) for sp in SPLITS))
    return 0


if __name__ == "__main__":
    sys.exit(main())
