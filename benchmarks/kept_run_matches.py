"""Whether a kept run (its <method>_s<seed>.done.json) ran with the config a bench run would use now: the job's
config under the bench profile with the overrides and the seed, each side's `data` completed with the task's
defaults (a calibration run names `data.synthetic_shift` where the bench leaves the default). Exit status 0 when
they match, 1 when not (the differing fields printed), 2 when the marker cannot be read.

    python benchmarks/kept_run_matches.py <done.json> <task> <method> <seed> [KEY=VALUE ...]

benchmarks/bench_sweep.sh skips a run only when this says so, so that a run of an earlier schedule or data is run
again instead of being read as the bench's.
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from typing import Any

from prrfl.storage import load_json
from prrfl.sweep import run_config


def normalized(config: dict[str, Any], task: str) -> dict[str, Any]:
    """The config without its run name, its data completed with the task's defaults."""
    defaults = importlib.import_module(f"prrfl.tasks.{task}").DEFAULT_DATA
    return {**{k: v for k, v in config.items() if k != "run_name"}, "data": {**defaults, **config.get("data", {})}}


def differences(kept: dict[str, Any], wanted: dict[str, Any]) -> list[str]:
    """'field: kept -> wanted' for each field (data's one by one) that differs."""
    out = []
    for key in sorted(set(kept) | set(wanted)):
        a, b = kept.get(key), wanted.get(key)
        if key == "data" and isinstance(a, dict) and isinstance(b, dict):
            out += [f"data.{k}: {a.get(k)!r} -> {b.get(k)!r}" for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)]
        elif a != b:
            out.append(f"{key}: {a!r} -> {b!r}")
    return out


def main(argv: list[str]) -> int:
    if len(argv) < 4:
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        return 2
    marker, task, method, seed, *overrides = argv
    try:
        kept = load_json(Path(marker))["config"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        print(f"{marker}: no readable config ({e})", file=sys.stderr)
        return 2
    wanted = run_config(method, int(seed), overrides, task, "bench").to_dict()
    diff = differences(normalized(kept, task), normalized(wanted, task))
    if diff:
        print(f"{marker}: another config than the bench's now: " + "; ".join(diff))
    return 1 if diff else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
