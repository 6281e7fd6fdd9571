"""benchmarks/bench_seed_speed.py: a kept bench run trained again is compared with the kept one value by value, the
clock's fields left out. The simulator is replaced by writing the run's files, so that the comparison itself is
what is tested (the FLARE run it wraps is prrfl sweep's)."""

from __future__ import annotations

import importlib
import math
from pathlib import Path

import pytest

from prrfl import kept
from prrfl.storage import kept_members, save_json

ROOT = Path(__file__).resolve().parents[1]
KEPT = ROOT / "docs/results/heldout/isic2019/own/fca_s0.kept.json.gz"


@pytest.fixture
def script(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    return importlib.import_module("bench_seed_speed")


def test_the_clocks_fields_are_left_out_at_any_depth(script):
    value = {"run_id": "a1", "history": [{"round": 0, "timing": {"train": 3.2}, "seconds": 9.0, "f1": 50.0}], "simulator_seconds": 12}
    assert script.without_clock(value) == {"history": [{"round": 0, "f1": 50.0}]}
    saved = {"code_commit": "3c57ed1", "global_model": {"file": "/ws.state/server/global.pt", "round": 9}}  # where and with what
    assert script.without_clock(saved) == {"global_model": {"round": 9}}


def test_differences_name_the_path_and_both_values_and_take_nan_as_equal(script):
    old = {"a": [1.0, math.nan, {"b": 2}], "c": "x"}
    assert script.differences(old, {"a": [1.0, math.nan, {"b": 2}], "c": "x"}) == []
    assert script.differences(old, {"a": [1.0, math.nan, {"b": 3}], "c": "x"}) == [".a[2].b: 2 -> 3"]
    assert script.differences(old, {"a": [1.0], "c": "x", "d": 0}) == [".a: [1.0, nan, {'b': 2}] -> [1.0]", ".d: '<absent>' -> 0"]


def rerun_writing(stored, change=None):
    """A stand-in for the simulator: writes the kept run's files into the workspace it is given (one value changed
    by `change`), as a run with the same numbers and another clock would."""

    def run(command, log):
        workspace = Path(command[command.index("-w") + 1])
        for name in stored:
            if name != kept.DONE_MEMBER:
                data = kept.member(stored, name, KEPT)
                if isinstance(data, dict) and "run_id" in data:
                    data = {**data, "run_id": "another"}
                save_json(change(name, data) if change else data, workspace / name)
        save_json({}, kept.done_marker(workspace))
        return 0

    return run


def with_stand_ins(script, monkeypatch, runner):
    monkeypatch.setattr(script, "export_job", lambda name, folder, cfg: folder)
    monkeypatch.setattr(script, "build_task", lambda cfg: type("T", (), {"prepared_root": lambda self, root: None})())
    monkeypatch.setattr(script, "run_logged", runner)
    monkeypatch.setattr(script, "write_crosseval", lambda workspace: [])  # the stand-in's files hold its crosseval


def test_a_rerun_with_the_same_numbers_is_identical_and_its_speed_printed(script, monkeypatch, tmp_path, capsys):
    stored = kept_members(KEPT)
    with_stand_ins(script, monkeypatch, rerun_writing(stored))
    assert script.main([str(KEPT), "--workdir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    seconds = kept.member(stored, kept.DONE_MEMBER, KEPT)["simulator_seconds"]
    assert f"kept run:  {seconds:.0f} s simulator wall time" in out and "x faster)" in out
    assert f"numbers: identical ({len(stored) - 1} files" in out


def test_one_changed_value_is_named_and_fails(script, monkeypatch, tmp_path, capsys):
    stored = kept_members(KEPT)
    site = next(n for n in stored if n.startswith("site-1/") and n.endswith("results.json"))

    def change(name, data):
        return {**data, "rounds_completed": data["rounds_completed"] + 1} if name == site else data

    with_stand_ins(script, monkeypatch, rerun_writing(stored, change))
    assert script.main([str(KEPT), "--workdir", str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert "numbers: DIFFERENT (1 shown)" in out and f"{site}.rounds_completed: 10 -> 11" in out
