"""docs/results stays small enough to clone with the repository: its runs kept as one file each
(benchmarks/keep_results.py), never as workspaces, and the whole folder under a limit."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "docs" / "results"
# under 3 MB as `du -sb docs/results` counts it in a checkout on ext4: the files, and 4096 bytes for each folder. The kept
# runs and the reports' text, the figures no command draws again from them (overlays, the calibration's montages, the
# stale runs' curves) and those the docs embed; the long tables and figures a report draws again from the kept runs
# (results_long.csv, retrogress.csv, retrogress.png, curves_<method>.png) are not in git (.gitignore)
LIMIT_BYTES = 3_000_000
FOLDER_BYTES = 4096
WORKSPACE_FILES = ("results.json", "results.json.gz", "crosseval.json", "crosseval.json.gz")


def tracked_files() -> list[Path]:
    """The files of docs/results in git (every file of the folder where this is not a git checkout)."""
    if shutil.which("git") and (ROOT / ".git").exists():
        done = subprocess.run(["git", "ls-files", "-z", "docs/results"], cwd=ROOT, capture_output=True, check=True)
        return [ROOT / name for name in done.stdout.decode().split("\0") if name]
    return [p for p in RESULTS.rglob("*") if p.is_file()]


def test_docs_results_stays_under_its_limit_with_every_run_kept_as_one_file():
    files = [p for p in tracked_files() if p.is_file()]
    assert files, f"no files found under {RESULTS}"
    workspace_files = [str(p.relative_to(RESULTS)) for p in files if p.name in WORKSPACE_FILES or p.name.endswith(".done.json")]
    assert not workspace_files, f"runs kept as workspaces (keep them with benchmarks/keep_results.py): {workspace_files[:5]}"
    folders = {folder for p in files for folder in p.relative_to(RESULTS).parents}  # "." is docs/results itself
    size = sum(p.stat().st_size for p in files) + FOLDER_BYTES * len(folders)
    assert size <= LIMIT_BYTES, (
        f"docs/results takes {size:,} bytes ({len(files)} files in {len(folders)} folders), over its limit of {LIMIT_BYTES:,}"
    )
