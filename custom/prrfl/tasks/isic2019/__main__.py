"""Command line: `python -m prrfl.tasks.isic2019 {synth,prepare} ...`.

synth    write a synthetic Fed-ISIC2019 in FLamby's layout (images folder + train_test_split CSV)
prepare  FLamby's layout -> per-centre npz splits (train, valid carved from FLamby's train fold, test) + manifest.json
"""

from __future__ import annotations

import argparse
import sys
import time

from prrfl.data.command_line import command_parser, print_prepared, run_main

from .layout import CENTRES, CLASS_NAMES, SHORT_SIDE
from .prepare import VALID_FRACTION


def _parser() -> argparse.ArgumentParser:
    p, common, add = command_parser(__package__, __doc__)
    s = add("synth", parents=[common], help="write a synthetic Fed-ISIC2019 in FLamby's layout")
    s.add_argument("--out", required=True, help="folder to create (must not exist unless --overwrite)")
    s.add_argument("--scale", type=float, default=1.0, help="fraction of FLamby's counts (1.0 = 23,247 images)")
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--shift", type=float, default=1.0, help="how much the centres' acquisitions differ (0: alike)")
    s.add_argument("--workers", type=int, default=1)
    s.add_argument("--overwrite", action="store_true")

    q = add("prepare", parents=[common], help="prepare per-centre splits from FLamby's layout")
    q.add_argument("--raw", required=True, help="folder holding ISIC_2019_Training_Input_preprocessed/ (and train_test_split)")
    q.add_argument("--split-csv", default=None, help="FLamby's train_test_split file (default: <raw>/train_test_split)")
    q.add_argument("--out", required=True)
    q.add_argument("--size", type=int, default=224)
    q.add_argument("--seed", type=int, default=0, help="seed of the validation split")
    q.add_argument("--valid-fraction", type=float, default=VALID_FRACTION, help="of each class's training-fold images")
    q.add_argument("--centres", nargs="+", default=list(CENTRES), choices=CENTRES)
    q.add_argument("--any-size", action="store_true", help=f"accept images whose shorter side is not {SHORT_SIDE} px")
    return p


def main(argv: list[str] | None = None) -> int:
    """Exit status and error format: prrfl.errors.EXIT_STATUS (the --help epilog)."""
    return run_main(_parser(), _run, argv)


def _run(args: argparse.Namespace) -> int:
    t0 = time.perf_counter()
    if args.cmd == "synth":
        from .synthetic import generate_synthetic_isic2019

        info = generate_synthetic_isic2019(
            args.out, scale=args.scale, seed=args.seed, shift=args.shift, workers=args.workers, overwrite=args.overwrite
        )
        print(f"| centre | fold | {' | '.join(CLASS_NAMES)} |")
        for centre, folds in info["counts"].items():
            for fold, counts in folds.items():
                print(f"| {centre} | {fold} | " + " | ".join(str(n) for n in counts.values()) + " |")
        print(f"{info['images']} images in {args.out}, {time.perf_counter() - t0:.1f} s")
    else:
        from .prepare import prepare_isic2019

        m = prepare_isic2019(
            args.raw,
            args.out,
            size=args.size,
            seed=args.seed,
            valid_fraction=args.valid_fraction,
            centres=args.centres,
            split_csv=args.split_csv,
            short_side=None if args.any_size else SHORT_SIDE,
        )
        print_prepared(m, args.out, t0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
