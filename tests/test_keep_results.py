"""What docs/results keeps of a sweep (benchmarks/keep_results.py): the per-run histories gzip-compressed, read
back by prrfl's loaders as the plain files; no arrays, models, workspaces or the sweep's own report."""

from __future__ import annotations

import gzip
import importlib.util
import json
from pathlib import Path

from prrfl.storage import existing_json, find_json, load_json

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "keep_results.py"


def keep_results():
    spec = importlib.util.spec_from_file_location("keep_results", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def write(path: Path, text: str = "{}") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_a_kept_sweep_holds_compressed_histories_and_nothing_heavier(tmp_path):
    sweep, kept = tmp_path / "sweep", tmp_path / "kept"
    history = json.dumps({"site": "site-1", "best": {"round": 3}, "history": [{"round": 0, "test": {"dice": 71.25}}]})
    write(sweep / "prr_s0/site-1/prrfl/prostate_prr_s0/results.json", history)
    write(sweep / "prr_s0/site-1/prrfl/prostate_prr_s0/examples.npz", "arrays")
    write(sweep / "prr_s0/prrfl/prostate_prr_s0/crosseval.json", '{"run_id": "r1"}')
    write(sweep / "prr_s0/site-1/prrfl/prostate_prr_s0/best_personal.pt", "model")
    write(sweep / "prr_s0.done.json", '{"ok": true}')
    write(sweep / "report/report.md", "# the sweep's own report")
    write(sweep / "jobs/prostate_prr_s0/meta.json")
    module = keep_results()
    assert module.keep(sweep, kept) == 3
    files = sorted(str(p.relative_to(kept)) for p in kept.rglob("*") if p.is_file())
    assert files == [
        "prr_s0.done.json",
        "prr_s0/prrfl/prostate_prr_s0/crosseval.json.gz",
        "prr_s0/site-1/prrfl/prostate_prr_s0/results.json.gz",
    ]
    site = kept / "prr_s0/site-1/prrfl/prostate_prr_s0/results.json"
    assert existing_json(site) == site.with_name("results.json.gz") and load_json(existing_json(site)) == json.loads(history)
    assert find_json(kept, "**/prrfl/*/results.json") == [site.with_name("results.json.gz")]
    first = site.with_name("results.json.gz").read_bytes()
    module.keep(sweep, kept)  # the same sweep kept again: the same bytes (no timestamp in the gzip header)
    assert site.with_name("results.json.gz").read_bytes() == first
    module.keep(kept, tmp_path / "again")  # kept results copied on (back into a sweep folder) stay compressed
    assert gzip.decompress((tmp_path / "again/prr_s0/site-1/prrfl/prostate_prr_s0/results.json.gz").read_bytes()) == history.encode()


def test_only_finished_runs_are_kept(tmp_path):
    """A run stopped or failed part-way (no .done.json beside its folder) leaves its partial histories behind, at
    any depth: a report built from the kept folder never reads 4 of 5 sites as a whole run."""
    sweep, kept = tmp_path / "sweep", tmp_path / "kept"
    for run in ("derm_shift2/fedavg_s0", "derm_shift2/fedbn_s0", "fml_s1"):
        write(sweep / run / "site-1/prrfl/r/results.json", '{"a": 1}')
    write(sweep / "derm_shift2/fedavg_s0.done.json")
    write(sweep / "fml_s1/prrfl/r/crosseval.json")
    assert keep_results().keep(sweep, kept) == 2
    files = sorted(str(p.relative_to(kept)) for p in kept.rglob("*") if p.is_file())
    assert files == ["derm_shift2/fedavg_s0.done.json", "derm_shift2/fedavg_s0/site-1/prrfl/r/results.json.gz"]


def test_slim_compresses_in_place_and_a_plain_file_wins_over_its_compressed_copy(tmp_path):
    write(tmp_path / "run/site-1/prrfl/r/results.json", '{"a": 1}')
    write(tmp_path / "run/site-1/prrfl/r/examples.npz", "arrays")
    assert keep_results().slim(tmp_path) == (1, 1)
    assert sorted(p.name for p in (tmp_path / "run/site-1/prrfl/r").iterdir()) == ["results.json.gz"]
    write(tmp_path / "run/site-1/prrfl/r/results.json", '{"a": 2}')  # a newer plain file beside the compressed one
    (found,) = find_json(tmp_path, "**/prrfl/*/results.json")
    assert found.name == "results.json" and load_json(found) == {"a": 2}
