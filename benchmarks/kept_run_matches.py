"""Whether a kept run (its <method>_s<seed>.kept.json.gz, or the <method>_s<seed>.done.json marker of a run folder)
ran with the config a bench run would use now: the job's config under the bench profile with the overrides and the seed, each side's `data` completed with the task's
defaults (a calibration run names `data.synthetic_shift` where the bench leaves the default), by the rule `prrfl
sweep` itself skips a finished run by (prrfl.sweep.config_differences). Exit status 0 when they match, 1 when not
(the differing fields printed), 2 when its marker cannot be read.

    python benchmarks/kept_run_matches.py <kept run | done.json> <task> <method> <seed> [KEY=VALUE ...]

benchmarks/bench_sweep.sh skips a run only when this says so, so that a run of an earlier schedule or data is run
again instead of being read as the bench's.
"""

from __future__ import annotations

import sys
from pathlib import Path

from prrfl.kept import done_marker, is_kept
from prrfl.storage import load_json
from prrfl.sweep import config_differences, run_config


def main(argv: list[str]) -> int:
    if len(argv) < 4:
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        return 2
    run, task, method, seed, *overrides = argv
    marker = done_marker(run) if is_kept(run) else Path(run)
    try:
        kept = load_json(marker)["config"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        print(f"{marker}: no readable config ({e})", file=sys.stderr)
        return 2
    diff = config_differences(kept, run_config(method, int(seed), overrides, task, "bench"))
    if diff:
        print(f"{marker}: another config than the bench's now: " + "; ".join(diff))
    return 1 if diff else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
