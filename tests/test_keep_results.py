"""What docs/results keeps of a sweep (benchmarks/keep_results.py): one file per finished run (prrfl.kept), read by
`prrfl report` and `prrfl results` as the run's workspace, giving the same tables byte for byte; no arrays, models,
workspaces or the sweep's own report."""

from __future__ import annotations

import gzip
import importlib.util
import json
import math
import random
from pathlib import Path

import pytest

from prrfl import kept
from prrfl.report import RESULTS_GLOB, build_report, find_runs
from prrfl.storage import existing_json, find_json, kept_members, load_json

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "keep_results.py"
METRICS = ("f1", "auc", "acc", "bacc", "recall_nv", "recall_bkl", "recall_mel")  # what a dermoscopy evaluation returns
COHORTS = {"site-1": "A", "site-2": "B", "site-3": "C", "site-4": "D"}
ROUNDS, EPOCHS = 3, 2


def keep_results():
    spec = importlib.util.spec_from_file_location("keep_results", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def write(path: Path, data) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(data if isinstance(data, str) else json.dumps(data, sort_keys=True, indent=2))
    return path


def scores(rng: random.Random) -> dict[str, float]:
    """Every metric at full float precision, one class's recall undefined (NaN) now and then."""
    values = {m: rng.uniform(0, 100) for m in METRICS}
    return values | ({"recall_bkl": math.nan} if rng.random() < 0.2 else {})


def site_results(rng: random.Random, method: str, seed: int, site: str) -> dict:
    """A site's results.json as prrfl.site.state writes it: PRR records its deputy and the shared model beside P;
    FedAvg reports its global model as received (every aggregate scored on validation), and its trained one per round."""
    history = []
    for rnd in range(ROUNDS):
        if rnd:
            download = {"kind": "download", "round": rnd, "epochs_done": rnd * EPOCHS, "test": scores(rng), "shared_test": scores(rng)}
            history.append(download | ({"global_round": rnd - 1, "valid": scores(rng)} if method == "fedavg" else {}))
        for epoch in range(1, EPOCHS + 1):
            history.append({"kind": "epoch", "round": rnd, "epochs_done": rnd * EPOCHS + epoch, "test": scores(rng)})
        record = {"kind": "round", "round": rnd, "epochs_done": (rnd + 1) * EPOCHS, "valid": scores(rng), "test": scores(rng)}
        record |= {"shared_test": scores(rng), "timing": {"round_seconds": rng.uniform(1, 9), "train_seconds": rng.uniform(1, 9)}}
        history.append(record | ({"other_models": {"deputy": {"valid": scores(rng), "test": scores(rng)}}} if method == "prr" else {}))
    rounds = [h for h in history if h["kind"] == "round"]
    best = max(rounds, key=lambda h: h["valid"]["f1"])
    return {
        "site": site,
        "cohort": COHORTS[site],
        "task": "derm",
        "method": method,
        "method_args": {},
        "run_name": f"derm_{method}_s{seed}",
        "run_id": f"{method}{seed}",
        "seed": seed,
        "rounds_completed": ROUNDS,
        "rounds_missed": [],
        "data_root": None,
        "state_dir": f"/scratch/{method}_s{seed}.state/{site}",
        "num_train": 120,
        "class_counts": [70, 30 + seed, 20],
        "reported_model": "personal" if method == "prr" else "global",
        "reported_at": "round" if method == "prr" else "download",
        "select_from_round": 0,
        "code_commit": "0123456789abcdef0123456789abcdef01234567",
        "best": {"round": best["round"], "valid": best["valid"], "test": best["test"]},
        "last": rounds[-1],
        "ood": scores(rng),
        "history": history,
    }


def crosseval(rng: random.Random, method: str, seed: int, flare: bool) -> dict:
    """The run's crosseval.json (prrfl.crosseval.evaluate_run), or with `flare` the one of FLARE's cross-site evaluation."""
    protocol = {m: rng.uniform(0, 100) for m in ("bacc", "auc")}
    common = {"run_id": f"{method}{seed}", "run_name": f"derm_{method}_s{seed}", "task": "derm", "method": method, "seed": seed}
    common |= {"metrics": ["bacc", "auc"], "cohorts": COHORTS, "specialization": {"values": protocol, "per_site": {}}}
    common |= {"cross_site": {m: {t: scores(rng) for t in COHORTS} for m in COHORTS}}
    if flare:
        models = {
            s: {"cohort": c, "role": "personal", "round": 1, "weights_sha256": f"{rng.getrandbits(256):064x}"} for s, c in COHORTS.items()
        }
        return common | {"evaluated_by": "FLARE cross-site evaluation", "models": models, "errors": {}, "generalization": None}
    other = {"deputy": {"round": "last", "generalization": {"values": protocol}, "specialization": {"values": protocol}}}
    general = {"model": "sites", "round": None, "per_site": {}, "values": {m: rng.uniform(0, 100) for m in ("bacc", "auc")}}
    return common | {
        "reported_model": "personal",
        "pooled_test_samples": 90,
        "generalization": general,
        "other_models": other if method == "prr" else {},
    }


def write_run(sweep: Path, method: str, seed: int) -> Path:
    """One finished run of `prrfl sweep` in the simulator: its workspace folder and its done marker beside it."""
    rng = random.Random(f"{method}{seed}")
    ws, run_name = sweep / f"{method}_s{seed}", f"derm_{method}_s{seed}"
    sites = {site: site_results(rng, method, seed, site) for site in COHORTS}
    for site, results in sites.items():
        write(ws / site / "prrfl" / run_name / "results.json", results)
    summaries = {s: {k: r[k] for k in ("best", "last", "ood", "cohort")} for s, r in sites.items()}
    participation = {"rounds": ROUNDS, "aggregated": list(range(ROUNDS)), "missed": [], "stale": False}
    summaries = {s: summary | {"download_drop": 1.5, "participation": participation} for s, summary in summaries.items()}
    config = {"task": "derm", "method": method, "seed": seed, "run_name": run_name, "num_rounds": ROUNDS}
    write(
        ws / "server/simulate_job/results.json", {"run_id": f"{method}{seed}", "config": config, "sites": summaries, "global_model": None}
    )
    write(ws / "server/simulate_job/crosseval.json", crosseval(rng, method, seed, flare=True))
    write(ws / "prrfl" / run_name / "crosseval.json", crosseval(rng, method, seed, flare=False))
    write(sweep / f"{method}_s{seed}.done.json", {"config": config, "sites": len(COHORTS), "simulator_seconds": 321.5})
    return ws


@pytest.fixture
def sweep(tmp_path) -> Path:
    """PRR and FedAvg at seeds 0 and 1, as a sweep leaves them, with its jobs, its report and a state folder."""
    folder = tmp_path / "sweep"
    for method in ("prr", "fedavg"):
        for seed in (0, 1):
            write_run(folder, method, seed)
    write(folder / "prr_s0.state/site-1/derm_prr_s0/results.json", {"site": "site-1"})
    write(folder / "report/report.md", "# the sweep's own report")
    write(folder / "jobs/prr_s0/derm_prr/meta.json", {})
    return folder


def files(folder: Path) -> list[str]:
    return sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file())


def test_a_report_from_kept_runs_is_the_report_from_their_workspaces_byte_for_byte(sweep, tmp_path):
    kept_folder = tmp_path / "kept"
    assert keep_results().keep(sweep, kept_folder) == 4
    runs = sorted(kept_folder.glob("*_s[0-9]" + kept.KEPT_SUFFIX))
    assert [p.name for p in runs] == [f"{m}_s{s}.kept.json.gz" for m in ("fedavg", "prr") for s in (0, 1)]
    build_report(sorted(sweep.glob("*_s[0-9]")), tmp_path / "from_workspaces")
    build_report(runs, tmp_path / "from_kept")
    built = {p.name: p.read_bytes() for p in (tmp_path / "from_workspaces").iterdir()}
    assert {p.name: p.read_bytes() for p in (tmp_path / "from_kept").iterdir()} == built
    assert {"report.md", "results_long.csv", "retrogress.csv", "retrogress.png", "curves_prr.png"} <= set(built)
    report = built["report.md"].decode()
    for part in ("| prr/deputy |", "| fedavg/trained |", "Table X", "Generalization and specialization", "Cross-site matrix"):
        assert part in report  # every part of a run the report reads came through
    # `prrfl results`: the same table of every run, read from the server's results and FLARE's crosseval.json
    from_sweep, from_kept = (find_runs(folder)[0] for folder in (sweep, kept_folder))
    assert [r.table() for r in from_kept] == [r.table() for r in from_sweep] and len(from_kept) == 4
    assert "Cross-site evaluation" in from_kept[0].table()
    assert from_kept[0].source == str(kept_folder / "fedavg_s0.kept.json.gz/server/simulate_job/results.json")


def test_a_kept_run_leaves_out_what_no_report_reads_and_keeps_every_number_it_reads(sweep, tmp_path):
    keep_results().keep(sweep, tmp_path / "kept")
    run = tmp_path / "kept/prr_s0.kept.json.gz"
    name = "site-2/prrfl/derm_prr_s0/results.json"
    site, original = load_json(run / name), load_json(sweep / "prr_s0" / name)
    assert {"data_root", "state_dir", "num_train", "rounds_missed"} & set(site) == set()
    assert site["last"] == {"test": original["last"]["test"]} and site["best"] == original["best"]
    assert [h["kind"] for h in site["history"]] == [h["kind"] for h in original["history"]]
    rounds = [(h, o) for h, o in zip(site["history"], original["history"], strict=True) if h["kind"] == "round"]
    for mine, theirs in zip(site["history"], original["history"], strict=True):
        assert "timing" not in mine
        if mine["kind"] != "round":  # the curves and the retrogress read the primary metric (F1) of the per-epoch records
            assert mine["test"] == {"f1": theirs["test"]["f1"]} and mine["epochs_done"] == theirs["epochs_done"]
    # P's own round metrics: none (its best and last are the site's, whole; its test curve the per-epoch records'); the
    # shared model's: F1; the deputy's: whole where a report can take its best or last round, F1 elsewhere
    for mine, theirs in rounds:
        assert "valid" not in mine and "test" not in mine and mine["shared_test"] == {"f1": theirs["shared_test"]["f1"]}
    cut = assert_whole_where_selectable([(h["other_models"]["deputy"], o["other_models"]["deputy"]) for h, o in rounds])
    # a site that reports the global model as received: its trained model's round metrics, by the same rule (its
    # `/trained` rows); of the global model's validation scores the table's first metric (F1)
    fedavg = load_json(tmp_path / "kept/fedavg_s0.kept.json.gz/site-1/prrfl/derm_fedavg_s0/results.json")
    theirs = load_json(sweep / "fedavg_s0/site-1/prrfl/derm_fedavg_s0/results.json")
    pairs = list(zip(fedavg["history"], theirs["history"], strict=True))
    cut += assert_whole_where_selectable([(h, o) for h, o in pairs if h["kind"] == "round"])
    assert cut > 0  # the rule was tried on a round it cuts
    assert [h["valid"] for h, _ in pairs if h["kind"] == "download"] == [
        {"f1": o["valid"]["f1"]} for _, o in pairs if o["kind"] == "download"
    ]
    server = load_json(run / "server/simulate_job/results.json")
    assert set(server["sites"]["site-1"]) == {"best", "cohort", "participation"}
    flare, own = load_json(run / "server/simulate_job/crosseval.json"), load_json(run / "prrfl/derm_prr_s0/crosseval.json")
    assert "models" not in flare and "evaluated_by" not in flare
    for matrix in (flare["cross_site"], own["cross_site"]):  # the primary metric, the one every matrix shows
        assert {k for row in matrix.values() for values in row.values() for k in values} == {"f1"}
    assert "per_site" not in own["generalization"] and "per_site" not in own["other_models"]["deputy"]["generalization"]
    original = load_json(sweep / "prr_s0/prrfl/derm_prr_s0/crosseval.json")  # what FCA's Table 4's paired tests pair
    assert own["specialization"]["per_site"] == original["specialization"]["per_site"]
    assert load_json(kept.done_marker(run)) == load_json(sweep / "prr_s0.done.json")


def assert_whole_where_selectable(rounds: list[tuple[dict, dict]]) -> int:
    """(kept, original) metrics of one model over its rounds: whole at its last round and wherever its validation F1
    is at least every one before it (a round the selection could take), F1 alone elsewhere; returns how many rounds
    were cut to F1."""
    best, whole = None, []
    for i, (_, theirs) in enumerate(rounds):
        if best is None or theirs["valid"]["f1"] >= best:
            best = theirs["valid"]["f1"]
            whole.append(i)
    whole = {*whole, len(rounds) - 1}
    for i, (mine, theirs) in enumerate(rounds):
        expected = theirs if i in whole else {k: {"f1": theirs[k]["f1"]} for k in ("valid", "test")}
        assert {k: mine[k] for k in ("valid", "test")} == {k: expected[k] for k in ("valid", "test")}
    return len(rounds) - len(whole)


def test_keep_writes_one_reproducible_file_per_finished_run_and_nothing_heavier(sweep, tmp_path):
    kept_folder = tmp_path / "kept"
    write(sweep / "derm_shift2/fml_s1/site-1/prrfl/r/results.json", {"site": "site-1"})  # stopped: no marker
    write(sweep / "prr_s0/site-1/prrfl/derm_prr_s0/examples.npz", "arrays")
    write(sweep / "prr_s0/site-1/prrfl/derm_prr_s0/best_personal.pt", "model")
    module = keep_results()
    assert module.keep(sweep, kept_folder) == 4
    assert files(kept_folder) == [f"{m}_s{s}.kept.json.gz" for m in ("fedavg", "prr") for s in (0, 1)]
    run = kept_folder / "prr_s0.kept.json.gz"
    assert find_json(run, RESULTS_GLOB) == [run / f"{s}/prrfl/derm_prr_s0/results.json" for s in COHORTS]
    assert len(find_json(kept_folder, RESULTS_GLOB)) == 16
    assert find_json(run, "crosseval.json", recursive=True) == [
        run / "prrfl/derm_prr_s0/crosseval.json",
        run / "server/simulate_job/crosseval.json",
    ]
    assert existing_json(run / "site-1/prrfl/derm_prr_s0/results.json") == run / "site-1/prrfl/derm_prr_s0/results.json"
    assert existing_json(run / "site-9/prrfl/derm_prr_s0/results.json") is None
    first = run.read_bytes()
    assert gzip.decompress(first)[:1] == b"{" and first[4:8] == b"\0\0\0\0"  # gzip's mtime field: 0
    module.keep(sweep, kept_folder)  # the same sweep kept again: the same bytes
    assert run.read_bytes() == first


def test_a_kept_run_unpacked_into_a_sweep_folder_is_kept_again_as_the_same_bytes(sweep, tmp_path):
    module = keep_results()
    module.keep(sweep, tmp_path / "kept")
    assert module.unpack(tmp_path / "kept", tmp_path / "again") == 4
    again = tmp_path / "again"
    assert (again / "prr_s0.done.json").is_file() and (again / "prr_s0/site-3/prrfl/derm_prr_s0/results.json").is_file()
    assert load_json(again / "prr_s0/site-3/prrfl/derm_prr_s0/results.json")["rounds_completed"] == ROUNDS  # what `prrfl sweep` checks
    assert module.keep(again, tmp_path / "kept2") == 4
    assert {p: (tmp_path / "kept2" / p).read_bytes() for p in files(tmp_path / "kept2")} == {
        p: (tmp_path / "kept" / p).read_bytes() for p in files(tmp_path / "kept")
    }


def test_compact_turns_runs_kept_as_folders_into_kept_runs_in_place(sweep, tmp_path):
    """A folder kept before (the gzip-compressed files of each run, its marker; a run kept before markers were
    written) becomes one kept run per run, the same tables read from it."""
    module = keep_results()
    old = tmp_path / "old"
    for path in [p for p in sweep.rglob("*") if p.is_file() and p.suffix == ".json" and not module.in_sweep_extras(p.relative_to(sweep))]:
        target = old / path.relative_to(sweep)
        target.parent.mkdir(parents=True, exist_ok=True)
        if path.name.endswith(".done.json"):
            target.write_bytes(path.read_bytes())
        else:
            target.with_name(path.name + ".gz").write_bytes(gzip.compress(path.read_bytes()))
    (old / "fedavg_s1.done.json").unlink()
    write(old / "prr_s0/site-1/prrfl/derm_prr_s0/examples.npz", "arrays")
    write(old / "README.md", "# what these runs are")
    tables = [r.table() for r in find_runs(old)[0]]
    assert module.compact(old) == 4
    assert files(old) == ["README.md"] + [f"{m}_s{s}.kept.json.gz" for m in ("fedavg", "prr") for s in (0, 1)]
    assert [r.table() for r in find_runs(old)[0]] == tables
    assert kept.DONE_MEMBER not in kept_members(old / "fedavg_s1.kept.json.gz")
    assert module.compact(old) == 0  # nothing left to convert


def test_compact_packs_a_run_kept_by_older_rules_again_with_the_same_tables(sweep, tmp_path):
    """A run kept when the rules left out less (here: nothing) is packed again by today's, once; its report and
    `prrfl results` table do not change."""
    module = keep_results()
    folder = tmp_path / "kept"
    module.keep(sweep, folder)
    runs = sorted(folder.glob("*" + kept.KEPT_SUFFIX))
    today = (folder / "prr_s0.kept.json.gz").read_bytes()
    (folder / "prr_s0.kept.json.gz").write_bytes(kept.encode(module.members(sweep / "prr_s0")))  # every number of the run
    assert len((folder / "prr_s0.kept.json.gz").read_bytes()) > len(today)
    build_report(runs, tmp_path / "before")
    tables = [r.table() for r in find_runs(folder)[0]]
    assert module.compact(folder) == 1 and module.compact(folder) == 0  # packed again once, then left as it is
    assert (folder / "prr_s0.kept.json.gz").read_bytes() == today
    build_report(runs, tmp_path / "after")
    assert {p.name: p.read_bytes() for p in (tmp_path / "after").iterdir()} == {
        p.name: p.read_bytes() for p in (tmp_path / "before").iterdir()
    }
    assert [r.table() for r in find_runs(folder)[0]] == tables


def test_a_history_stored_column_wise_reads_back_as_it_was():
    history = [
        {"kind": "epoch", "round": 0, "test": {"f1": 0.1 + 0.2}},
        {"kind": "round", "round": 0, "other_models": {}, "valid": {"f1": math.inf, "acc": None}, "sites": [1, 2]},
        {"kind": "epoch", "round": 1, "test": {"f1": 1e-300}},
        {},
        "not a record",
    ]
    tables = kept.columns(history)
    assert len(tables["keys"]) == 3 and tables["order"] == [0, 1, 0, 2, 2]  # one table per shape
    assert json.dumps(kept.records(json.loads(json.dumps(tables))), sort_keys=True) == json.dumps(history, sort_keys=True)


BROKEN = {"keys": [[["test"], ["test", "f1"]]], "values": [[[1.0], [2.0]]], "order": [0]}  # "test" both a value and a dict


@pytest.mark.parametrize(
    "content, expected",
    [
        (b"not gzip at all", "expected gzip-compressed JSON"),
        (gzip.compress(b'{"format": "prrfl kept run", "version": 1, "members": {}}')[:-9], "expected gzip-compressed JSON"),
        (gzip.compress(b'{"members": {}}'), "format 'prrfl kept run'"),
        (gzip.compress(b'{"format": "prrfl kept run", "version": 9, "members": {}}'), "version 9"),
        (
            gzip.compress(b'{"format": "prrfl kept run", "version": 1, "members": {"a/results.json": {"history": {"keys": []}}}}'),
            "column-wise",
        ),
        (
            gzip.compress(
                json.dumps({"format": "prrfl kept run", "version": 1, "members": {"a/results.json": {"history": BROKEN}}}).encode()
            ),
            "column-wise",
        ),
    ],
)
def test_a_corrupt_kept_run_names_itself_and_what_was_expected(tmp_path, content, expected):
    run = tmp_path / "runs/prr_s0.kept.json.gz"
    run.parent.mkdir()
    run.write_bytes(content)
    with pytest.raises(ValueError, match=expected) as failure:
        load_json(run / "a/results.json")
    assert str(run) in str(failure.value)


def test_a_file_a_kept_run_does_not_hold_is_named_with_what_it_holds(sweep, tmp_path):
    keep_results().keep(sweep, tmp_path / "kept")
    run = tmp_path / "kept/prr_s0.kept.json.gz"
    with pytest.raises(FileNotFoundError, match="has no site-9/results.json .it holds done.json, prrfl/"):
        load_json(run / "site-9/results.json")
