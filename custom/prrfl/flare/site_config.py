"""Site-local settings: what each hospital decides for itself, never part of the job.

Read from <site workspace>/local/prrfl_site.json when present (the job runs with the site
workspace as its working directory), else from the entry script's arguments, else defaults.
  data_root   prepared data folder of this site (default: the embedded synthetic federation)
  cohort      which cohort this site is (default: derived from the FLARE site name)
  device      "cuda", "cuda:1", "cpu" (default: cuda when available)
  num_threads CPU threads for torch (default: CPU cores / sites, as simulator sites share a machine)
  state_dir   where the site keeps checkpoints and results (default: <workspace>/prrfl/<run_name>)
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass, fields
from pathlib import Path

LOCAL_CONFIG = Path("local") / "prrfl_site.json"


@dataclass
class SiteConfig:
    data_root: str | None = None
    cohort: str | None = None
    device: str | None = None
    num_threads: int | None = None
    state_dir: str | None = None

    @classmethod
    def load(cls, argv: list[str] | None = None, workspace: Path = Path(".")) -> "SiteConfig":
        parser = argparse.ArgumentParser(description="prrfl site")
        for f in fields(cls):
            parser.add_argument(f"--{f.name.replace('_', '-')}", type=int if f.name == "num_threads" else str)
        args = vars(parser.parse_args(argv))
        values = {k: v for k, v in args.items() if v is not None}
        path = workspace / LOCAL_CONFIG
        if path.exists():
            try:
                local = json.loads(path.read_text())
            except json.JSONDecodeError as e:
                raise ValueError(f"{path.resolve()} is not valid JSON: {e}") from e
            names = {f.name for f in fields(cls)}
            unknown = sorted(set(local) - names)
            if unknown:
                raise ValueError(f"{path.resolve()}: unknown field(s) {unknown}; expected some of {sorted(names)}")
            values.update(local)  # the hospital's own file wins over job arguments
        return cls(**values)
