"""Command line: `python -m prrfl.tasks.prostate {synth,prepare,preview} ...`.

synth    write the synthetic raw layout (one folder per site, CaseNN.nii.gz + masks)
prepare  raw layout -> per-site npz splits of axial slices + manifest.json; prints the split table
preview  one PNG per site: axial slices of a few cases with the prostate mask outlined
"""

from __future__ import annotations

import argparse
import sys
import time

from prrfl.data.command_line import command_parser, print_prepared, run_main

from .layout import SITE_NAMES, TABLE_SITES
from .splitting import MIN_VALID_CASES


def _parser() -> argparse.ArgumentParser:
    p, common, add = command_parser(__package__, __doc__)

    s = add("synth", parents=[common], help="write a synthetic raw layout")
    s.add_argument("--out", required=True, help="folder to create (must not exist unless --overwrite)")
    s.add_argument("--scale", type=float, default=1.0, help="fraction of the Table I case counts (1.0 = Table I)")
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--matrix", type=int, default=None, help="largest in-plane matrix (px); default: the site's protocol, 256-512")
    s.add_argument("--matrix-scale", type=float, default=1.0, help="factor on each site's in-plane matrix")
    s.add_argument("--sites", nargs="+", default=list(TABLE_SITES), choices=SITE_NAMES)
    s.add_argument("--workers", type=int, default=1, help="processes rendering cases (full-size sets)")
    s.add_argument("--overwrite", action="store_true")

    q = add("prepare", parents=[common], help="prepare per-site splits from a raw layout")
    q.add_argument("--raw", required=True, help="folder holding one folder per site")
    q.add_argument("--out", required=True)
    q.add_argument("--size", type=int, default=256, help="slice side in pixels after resizing")
    q.add_argument("--seed", type=int, default=0, help="split seed")
    q.add_argument("--split", type=float, nargs=3, default=(0.7, 0.1, 0.2), metavar=("TRAIN", "VALID", "TEST"))
    q.add_argument("--sites", nargs="+", default=None, choices=SITE_NAMES, help="default: Table I sites (+ I2CVB if present)")
    q.add_argument(
        "--min-valid-cases",
        type=int,
        default=MIN_VALID_CASES,
        help="validation cases a site gets at least, wherever its training split keeps 3 (1: the plain 7:1:2 rounding)",
    )

    v = add("preview", parents=[common], help="write a PNG per site to look at")
    v.add_argument("--raw", required=True)
    v.add_argument("--out", required=True, help="folder for <site>.png")
    v.add_argument("--cases", type=int, default=2, help="cases per site (rows)")
    v.add_argument("--columns", type=int, default=5, choices=range(1, 6), help="slices per case")
    v.add_argument("--sites", nargs="+", default=None, choices=SITE_NAMES, help="default: every site folder present")
    return p


def main(argv: list[str] | None = None) -> int:
    """Exit status and error format: prrfl.errors.EXIT_STATUS (the --help epilog)."""
    return run_main(_parser(), _run, argv)


def _run(args: argparse.Namespace) -> int:
    t0 = time.perf_counter()
    if args.cmd == "synth":
        from .synthetic import generate_synthetic_prostate

        info = generate_synthetic_prostate(
            args.out,
            scale=args.scale,
            seed=args.seed,
            sites=args.sites,
            matrix_scale=args.matrix_scale,
            max_matrix=args.matrix,
            overwrite=args.overwrite,
            workers=args.workers,
        )
        print(f"{'site':<7}{'cases':>6}{'matrix':>10}{'slices':>10}{'V_P':>8}")
        for s, rows in info["cases"].items():
            matrices = sorted({r["matrix"] for r in rows})
            slices = [r["slices"] for r in rows]
            share = sum(r["prostate_share"] for r in rows) / len(rows)
            m = f"{matrices[0]}" if len(matrices) == 1 else f"{matrices[0]}-{matrices[-1]}"
            print(f"{s:<7}{len(rows):>6}{m:>10}{f'{min(slices)}-{max(slices)}':>10}{share:>8.2%}")
        print(f"{sum(info['counts'].values())} cases in {args.out}, {time.perf_counter() - t0:.1f} s")
    elif args.cmd == "prepare":
        from .prepare import prepare_prostate

        m = prepare_prostate(
            args.raw, args.out, size=args.size, seed=args.seed, split=args.split, sites=args.sites, min_valid_cases=args.min_valid_cases
        )
        print_prepared(m, args.out, t0)
    else:
        from .preview import write_previews

        for path in write_previews(args.raw, args.out, sites=args.sites, cases=args.cases, columns=args.columns):
            print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
