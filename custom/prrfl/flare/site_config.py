"""Site-local settings: what each hospital decides for itself, never part of the job.

A site reads the first of these files that exists in its FLARE workspace (the job runs with the site
workspace as its working directory), else the entry script's arguments, else the defaults:
  local/prrfl_site.<site name>.json   one file per site: the way to set sites apart in the simulator,
                                       which copies <simulator workspace>/local/ into every site
  local/prrfl_site.json                a provisioned site's own file (its startup kit is its own)
Fields:
  data_root   prepared data folder of this site (default: the embedded synthetic federation)
  cohort      which cohort this site is (default: derived from the FLARE site name)
  device      "cuda", "cuda:1", "cpu" (default: cuda when available)
  num_threads CPU threads for torch (default: CPU cores / sites, as simulator sites share a machine)
  state_dir   where the site keeps checkpoints and results (default: prrfl.flare.places.default_state_dir)
  eval_batch_size  samples per evaluation chunk, what bounds evaluation memory (default: the task's)

What the site found is reported to the server with its first answer (`SettingsReport`), so the server
log says which file each site used, and which files exist but are not read.
"""

from __future__ import annotations

import argparse
import json
import re
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

LOCAL = Path("local")
GENERIC_NAME = "prrfl_site.json"
PER_SITE = re.compile(r"^prrfl_site\.(?P<site>.+)\.json$")
INTEGER_FIELDS = ("num_threads", "eval_batch_size")  # positive integers; every other field is a string


def per_site_name(site: str) -> str:
    return f"prrfl_site.{site}.json"


@dataclass
class SettingsReport:
    """Where a site's settings came from, sent to the server with the prepare answer."""

    used: str | None = None  # the file read, None: no file (job arguments and defaults)
    per_site_files: list[str] = field(default_factory=list)  # site names of every local/prrfl_site.<name>.json seen
    notes: list[str] = field(default_factory=list)  # files that exist but are not read, and why

    def to_meta(self) -> dict[str, Any]:
        return asdict(self)


def device_problem(value: str) -> str | None:
    """Why torch cannot use the device `value` on this machine (None: it can)."""
    import torch

    try:
        device = torch.device(value)
    except (RuntimeError, ValueError):
        return f'must be "cpu", "cuda" or "cuda:N" (a torch device), got {value!r}'
    if device.type == "cuda":
        if not torch.cuda.is_available():
            return f'is {value!r} but this machine has no usable CUDA device: set it to "cpu" (or leave it out: CUDA when there is one)'
        if device.index is not None and device.index >= torch.cuda.device_count():
            return f"is {value!r} but this machine has {torch.cuda.device_count()} CUDA device(s): cuda:0..cuda:{torch.cuda.device_count() - 1}"
    return None


@dataclass
class SiteConfig:
    data_root: str | None = None
    cohort: str | None = None
    device: str | None = None
    num_threads: int | None = None
    state_dir: str | None = None
    eval_batch_size: int | None = None
    sources: dict[str, str] = field(default_factory=dict, repr=False)  # field -> where its value came from

    def origin(self, name: str) -> str:
        """Where the value of field `name` was set, for messages: a file's field, a job argument, a default."""
        return self.sources.get(name, f"default {name}")

    @classmethod
    def load(cls, site: str, argv: list[str] | None = None, workspace: Path = Path(".")) -> tuple[SiteConfig, SettingsReport]:
        """The settings of `site`; raises ValueError naming the file for bad JSON, an unknown field or a
        value of the wrong type."""
        parser = argparse.ArgumentParser(description="prrfl site")
        for f in fields(cls)[:-1]:  # not sources
            parser.add_argument(f"--{f.name.replace('_', '-')}", type=int if f.name in INTEGER_FIELDS else str)
        values = {k: v for k, v in vars(parser.parse_args(argv)).items() if v is not None}
        sources = {k: f"the site script's argument --{k.replace('_', '-')}" for k in values}
        report = SettingsReport()
        local = workspace / LOCAL
        if local.is_dir():
            report.per_site_files = sorted(m["site"] for p in local.iterdir() if (m := PER_SITE.match(p.name)))
        own, generic = local / per_site_name(site), local / GENERIC_NAME
        chosen = own if own.is_file() else generic if generic.is_file() else None
        if chosen == own and generic.is_file():
            report.notes.append(f"{generic.resolve()} is not read: {own.resolve()} takes precedence for site {site}")
        for stray in (workspace / GENERIC_NAME, workspace / "startup" / GENERIC_NAME, workspace / per_site_name(site)):
            if stray.is_file():
                report.notes.append(f"{stray.resolve()} is not read: site settings are read from {local.resolve()}/")
        parent = workspace.resolve().parent  # the simulator's workspace, above its sites' own
        for stray in (parent / GENERIC_NAME, parent / per_site_name(site)):
            if stray.is_file():
                report.notes.append(
                    f"{stray} is not read: site settings are read from {local.resolve()}/; in the simulator, put them in "
                    f"{parent / LOCAL}/, which it copies into every site"
                )
        if chosen is not None:
            report.used = str(chosen.resolve())
            read = cls._read(chosen)
            values.update(read)  # the hospital's own file wins over job arguments
            sources.update({k: f"field '{k}' of {report.used}" for k in read})
        if values.get("device") and (problem := device_problem(values["device"])):
            raise ValueError(f"{sources['device']} {problem}")
        return cls(**values, sources=sources), report

    @classmethod
    def _read(cls, path: Path) -> dict[str, Any]:
        try:
            local = json.loads(path.read_text())
        except json.JSONDecodeError as e:
            raise ValueError(f"{path.resolve()} is not valid JSON: {e}") from e
        if not isinstance(local, dict):
            raise ValueError(f"{path.resolve()} must hold a JSON object, got {type(local).__name__}")
        names = {f.name for f in fields(cls)} - {"sources"}
        unknown = sorted(set(local) - names)
        if unknown:
            raise ValueError(f"{path.resolve()}: unknown field(s) {unknown}; expected some of {sorted(names)}")
        for key, value in local.items():
            expected = int if key in INTEGER_FIELDS else str
            wrong = not isinstance(value, expected) or isinstance(value, bool) or (expected is int and value < 1)
            if value is not None and wrong:
                kind = "a positive integer" if expected is int else "a string"
                raise ValueError(f"{path.resolve()}: field '{key}' must be {kind} or null, got {value!r}")
        return local
