"""The report and the sweep on fabricated results files: numbers checked against hand computations
and scipy, figures written, the CLI end to end; the sweep with a fake simulator."""

from __future__ import annotations

import csv
import json
import statistics
import sys
from pathlib import Path

import matplotlib.image
import pytest
from scipy import stats

from prrfl.cli import main
from prrfl.report import (
    PairedTest,
    build_report,
    find_results,
    long_rows,
    method_order,
    retrogress_rows,
    retrogress_summary,
    shared_drop_tests,
    table_ii,
    table_x,
)
from prrfl.sweep import SweepError, sweep

DERM_METRICS = ("f1", "auc")

COHORTS = {"site-1": "A", "site-2": "B", "site-3": "C", "site-4": "D"}
# best-round test F1 at seed 0; seed s adds SHIFT[method] * s. AUC = F1 + 10. Site A scores the OOD
# cohort at 50 (prr) / 40 (fedavg) + SHIFT[method] * s, the other sites at 10.
PRR_F1 = {"A": 80.0, "B": 60.0, "C": 70.0, "D": 75.0}
FEDAVG_F1 = {"A": 71.0, "B": 57.0, "C": 63.0, "D": 74.5}
SHIFT = {"prr": 2.0, "fedavg": -1.0}
ROUNDS, EPOCHS = 3, 2


def best_f1(method: str, seed: int, cohort: str) -> float:
    return (PRR_F1 if method == "prr" else FEDAVG_F1)[cohort] + SHIFT[method] * seed


def drop(method: str, seed: int, site_index: int) -> float:
    """FedAvg loses 3..6 points (seed 0) or 5..8 (seed 1) at every download; PRR's P never does."""
    return 0.0 if method == "prr" else 3.0 + 2 * seed + site_index


def metrics(f1: float) -> dict[str, float]:
    return {"f1": f1, "auc": f1 + 10, "acc": f1 + 5, "bacc": f1 - 5}


def history(method: str, seed: int, site_index: int) -> list[dict]:
    """Per-epoch test F1 40 + 5 i + 10 r + 2 e (site i, round r, epoch e); the download of round r
    scores the last epoch of round r-1 minus the drop."""
    records = []
    for rnd in range(ROUNDS):
        if rnd >= 1:
            before = 40 + 5 * site_index + 10 * (rnd - 1) + 2 * EPOCHS
            f1 = before - drop(method, seed, site_index)
            records.append({"kind": "download", "round": rnd, "epochs_done": rnd * EPOCHS, "test": metrics(f1)})
        for e in range(1, EPOCHS + 1):
            records.append(
                {"kind": "epoch", "round": rnd, "epochs_done": rnd * EPOCHS + e, "test": metrics(40 + 5 * site_index + 10 * rnd + 2 * e)}
            )
        records.append(
            {
                "kind": "round",
                "round": rnd,
                "epochs_done": (rnd + 1) * EPOCHS,
                "valid": metrics(50),
                "test": metrics(60),
                "timing": {"round_seconds": 1.0, "train_seconds": 0.8, "train_images_per_second": 100.0},
            }
        )
    return records


def write_run(ws: Path, method: str, seed: int, run_name: str | None = None, run_id: str | None = None) -> None:
    """The four sites' results.json of one finished run, as prrfl.site.state writes them, plus the
    server's run summary (same folder layout, different content) that the report must skip."""
    run_name = run_name or f"derm_{method}_s{seed}"
    run_id = run_id or f"{method}{seed}"
    for i, (site, cohort) in enumerate(COHORTS.items()):
        f1 = best_f1(method, seed, cohort)
        ood = metrics((50.0 if method == "prr" else 40.0) + SHIFT[method] * seed) if cohort == "A" else metrics(10.0)
        records = history(method, seed, i)
        results = {
            "site": site,
            "cohort": cohort,
            "method": method,
            "run_name": run_name,
            "run_id": run_id,
            "seed": seed,
            "rounds_completed": ROUNDS,
            "num_train": 100,
            "class_counts": [60, 20, 20],
            "best": {"round": 2, "valid": metrics(f1 - 1), "test": metrics(f1)},
            "last": records[-1],
            "ood": ood,
            "history": records,
        }
        path = ws / site / "prrfl" / run_name / "results.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(results))
    server = ws / "server" / "prrfl" / run_name / "results.json"
    server.parent.mkdir(parents=True, exist_ok=True)
    server.write_text(json.dumps({"run_id": run_id, "config": {}, "sites": {}}))


@pytest.fixture
def workspaces(tmp_path) -> list[Path]:
    """2 methods x 2 seeds, one simulator workspace per run, as a sweep leaves them."""
    out = []
    for method in ("prr", "fedavg"):
        for seed in (0, 1):
            write_run(tmp_path / f"{method}_s{seed}", method, seed)
            out.append(tmp_path / f"{method}_s{seed}")
    return out


def cell(table: str, method: str) -> list[str]:
    row = next(line for line in table.splitlines() if line.startswith(f"| {method} |"))
    return [c.strip() for c in row.strip("|").split("|")]


def test_discovery_skips_server_summaries_and_counts_overlapping_workspaces_once(workspaces, tmp_path):
    results = find_results([*workspaces, tmp_path])  # tmp_path contains all four again
    assert len(results) == 2 * 2 * 4
    assert {(r.method, r.seed) for r in results} == {("prr", 0), ("prr", 1), ("fedavg", 0), ("fedavg", 1)}
    assert len(find_results(workspaces, methods=["fedavg"])) == 8


def test_two_runs_of_one_method_and_seed_are_refused(workspaces, tmp_path):
    write_run(tmp_path / "again", "prr", 0, run_name="derm_prr_rerun", run_id="other")
    with pytest.raises(ValueError, match="'prr' on task 'derm' has 2 runs with seed 0"):
        find_results([tmp_path])


def test_long_rows_are_one_per_method_seed_site_split_metric(workspaces):
    rows = long_rows(find_results(workspaces))
    assert len(rows) == 16 * 4 * 4  # 16 site files x (best_valid, best_test, last_test, ood) x 4 metrics
    row = next(
        r for r in rows if (r["method"], r["seed"], r["site"], r["split"], r["metric"]) == ("fedavg", 1, "site-3", "best_test", "f1")
    )
    assert row["cohort"] == "C" and row["value"] == 62.0 and row["run_id"] == "fedavg1"


def test_table_ii_mean_std_over_seeds_and_paired_p_value(workspaces):
    rows = long_rows(find_results(workspaces))
    table = table_ii(rows, ["prr", "fedavg"], "prr", DERM_METRICS)
    prr, fedavg = cell(table, "prr"), cell(table, "fedavg")
    # columns: method, seeds, site-1_A F1, site-1_A AUC, ..., site-4_D AUC, Avg F1, Avg AUC, Avg F1 last, p
    assert table.splitlines()[0].startswith("| method | seeds | site-1_A F1 | site-1_A AUC | site-2_B F1 |")  # the sites' labels
    assert prr[1] == "2"
    assert prr[2] == "81.00 ± 1.41"  # 80, 82: sample std sqrt(2)
    assert prr[3] == "91.00 ± 1.41"
    assert fedavg[6] == "62.50 ± 0.71"  # 63, 62
    assert prr[10] == "72.25 ± 1.41"  # site means 71.25 (seed 0), 73.25 (seed 1)
    assert fedavg[10] == "65.88 ± 0.71"  # 66.375, 65.375
    assert prr[12] == fedavg[12] == "60.00 ± 0.00"  # every site's last round tests at 60: the column beside the selected
    assert prr[13] == "–"
    keys = [(c, s) for c in "ABCD" for s in (0, 1)]  # 8 pairs: Wilcoxon
    expected = stats.wilcoxon([best_f1("fedavg", s, c) for c, s in keys], [best_f1("prr", s, c) for c, s in keys]).pvalue
    assert fedavg[13] == f"{expected:.3g} (Wilcoxon, n=8)"
    assert "Wilcoxon signed-rank when n ≥ 6 pairs, else paired t-test" in table


def test_one_seed_gives_bare_values_and_a_paired_t_test(tmp_path):
    for method in ("prr", "fedavg"):
        write_run(tmp_path, method, 0)
    table = table_ii(long_rows(find_results([tmp_path])), ["prr", "fedavg"], "prr", DERM_METRICS)
    assert cell(table, "prr")[2] == "80.00"
    expected = stats.ttest_rel([FEDAVG_F1[c] for c in "ABCD"], [PRR_F1[c] for c in "ABCD"]).pvalue
    assert cell(table, "fedavg")[13] == f"{expected:.3g} (t, n=4)"
    alone = long_rows(find_results([tmp_path], methods=["fedavg"]))
    assert cell(table_ii(alone, ["fedavg"], "prr", DERM_METRICS), "fedavg")[-1] == "–"  # no reference run


def test_table_x_is_site_a_model_on_the_ood_cohort(workspaces):
    table = table_x(long_rows(find_results(workspaces)), ["prr", "fedavg"], "A", DERM_METRICS)
    assert cell(table, "prr") == ["prr", "2", "51.00 ± 1.41", "61.00 ± 1.41"]  # 50, 52 (the other sites' 10 are ignored)
    assert cell(table, "fedavg") == ["fedavg", "2", "39.50 ± 0.71", "49.50 ± 0.71"]  # 40, 39


def test_retrogress_is_the_drop_from_the_last_epoch_before_communication_to_the_download(workspaces):
    drops = retrogress_rows(find_results(workspaces), "f1")
    assert len(drops) == 16 * (ROUNDS - 1)
    one = next(d for d in drops if (d["method"], d["seed"], d["site"], d["round"]) == ("fedavg", 1, "site-2", 2))
    assert (one["before"], one["after"], one["drop"]) == (59, 53, 6.0)  # 40 + 5 + 10 + 2*2 = 59; drop 3 + 2 + 1
    summary = retrogress_summary(drops, ["prr", "fedavg"])
    assert summary["prr"] == (0.0, 0.0, 16)
    fedavg = [3, 4, 5, 6, 5, 6, 7, 8] * 2  # sites x seeds, two rounds each
    assert summary["fedavg"] == pytest.approx((5.5, statistics.stdev(fedavg), 16))


def test_the_shared_models_retrogress_stands_beside_the_reported_ones_where_runs_recorded_it(workspaces, tmp_path):
    """PRR's deputy (the model PFA's output lands in) uploads 30 + r and scores 4 + i points less right after
    the next download; FedAvg's runs recorded no shared model (results of an older version): a dash."""
    for ws in workspaces[:2]:  # prr, seeds 0 and 1
        for i, path in enumerate(sorted(ws.glob("site-*/prrfl/*/results.json"))):
            results = json.loads(path.read_text())
            for h in results["history"]:
                if h["kind"] == "round":
                    h["shared_test"] = metrics(30.0 + h["round"])
                elif h["kind"] == "download":
                    h["shared_test"] = metrics(30.0 + h["round"] - 1 - (4 + i))
            path.write_text(json.dumps(results))
    shared = retrogress_rows(find_results(workspaces), "f1", model="shared")
    assert len(shared) == 8 * (ROUNDS - 1) and {row["method"] for row in shared} == {"prr"}
    one = next(d for d in shared if (d["seed"], d["site"], d["round"]) == (1, "site-3", 2))
    assert (one["before"], one["after"], one["drop"], one["model"]) == (31.0, 25.0, 6.0, "shared")
    report = build_report(workspaces, tmp_path / "report", methods=["prr", "fedavg"]).read_text()
    table = report.split("## Retrogress after communication")[1]
    assert "shared model's drop" in table
    # the model each row scores is named (runs that did not record it: "the method's")
    assert cell(table, "prr") == [
        "prr",
        "the method's",
        "0.00",
        "0.00",
        "16",
        "5.50",
        f"{statistics.stdev([4, 5, 6, 7] * 4):.2f}",
        "16",
        "–",
    ]
    assert cell(table, "fedavg")[5:] == ["–", "–", "–", "–"]
    with open(tmp_path / "report" / "retrogress.csv") as f:
        models = [row["model"] for row in csv.DictReader(f)]
    assert models.count("reported") == 32 and models.count("shared") == 16


def test_the_shared_models_drops_are_paired_by_site_seed_and_round_against_the_reference():
    """PRR without PFA loses 1..8 points more than PRR in 8 (site, seed, round) pairs, all one way: the exact
    two-sided Wilcoxon p is 2 / 2**8; a pair only one of them recorded is left out."""

    def row(method, cohort, seed, rnd, drop):
        return {"method": method, "cohort": cohort, "seed": seed, "round": rnd, "drop": drop}

    keys = [(c, s, r) for c in "AB" for s in (0, 1) for r in (1, 2)]
    rows = [row("prr", *k, 2.0) for k in keys] + [row("prr[pfa_enabled=false]", *k, 2.0 + i + 1) for i, k in enumerate(keys)]
    rows.append(row("prr[pfa_enabled=false]", "C", 0, 1, 50.0))  # PRR has no C: unpaired
    tests = shared_drop_tests(rows, ["prr", "prr[pfa_enabled=false]", "fedavg"], "prr")
    assert set(tests) == {"prr[pfa_enabled=false]"}
    assert tests["prr[pfa_enabled=false]"] == PairedTest(pytest.approx(2 / 2**8), "Wilcoxon", 8)


def test_ablations_rank_the_variants_against_the_full_method(workspaces, tmp_path):
    """A Table IV run: PRR without DET scores 3 points less at every site and seed (written by hand below)."""
    for seed in (0, 1):
        ws = tmp_path / f"no_det_s{seed}"
        write_run(ws, "prr", seed, run_id=f"nodet{seed}")
        for path in ws.glob("site-*/prrfl/*/results.json"):
            results = json.loads(path.read_text())
            results["method_args"] = {"det_enabled": False}
            results["best"]["test"] = metrics(results["best"]["test"]["f1"] - 3.0)
            path.write_text(json.dumps(results))
    report = build_report([*workspaces, tmp_path / "no_det_s0", tmp_path / "no_det_s1"], tmp_path / "report").read_text()
    table = report.split("## Ablations (the paper's Table IV layout)")[1].split("\n## ")[0]
    lines = [line for line in table.splitlines() if line.startswith("| prr")]
    assert [line.split(" | ")[0] for line in lines] == ["| prr", "| prr[det_enabled=false]"]  # best first
    # prr: Avg F1 (80 + 60 + 70 + 75) / 4 = 71.25 at seed 0, 73.25 at seed 1; AUC = F1 + 10
    assert cell(table, "prr") == ["prr", "2", "72.25 ± 1.41", "82.25 ± 1.41", "–", "–"]
    variant = cell(table, "prr[det_enabled=false]")
    assert variant[:5] == ["prr[det_enabled=false]", "2", "69.25 ± 1.41", "79.25 ± 1.41", "-3.00 ± 0.00"]
    assert variant[5].startswith("0.00781 (Wilcoxon, n=8)")  # 8 pairs, all the same sign: 2 / 2^8
    assert "fedavg" not in table  # another method is no ablation


def test_build_report_writes_tables_csv_and_figures(workspaces, tmp_path, caplog):
    out = tmp_path / "report"
    report = build_report(workspaces, out, methods=["prr", "fedavg", "fedbn"])
    assert "no results for method(s) fedbn" in caplog.text
    text = report.read_text()
    for heading in ("## Runs", "## Table II", "## Table X", "## Retrogress", "## Figures"):
        assert heading in text
    # the plots `prrfl report` draws again from the same files are linked, not embedded: a copy of the page without them
    figures = text.split("## Figures\n\n")[1]
    assert figures.startswith("Drawn by `prrfl report` from the results files into this report's folder: [retrogress.png](retrogress.png)")
    assert "[curves_prr.png](curves_prr.png), [curves_fedavg.png](curves_fedavg.png)" in figures and "![" not in figures
    assert "overlays" not in figures  # a dermoscopy site writes no examples; a segmentation report without them says so:
    from prrfl.report.build import _figures_section

    assert _figures_section([], None, "dice", examples=True).startswith("No overlays.jpg: these results hold no examples arrays")
    with open(out / "results_long.csv") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 256 and set(rows[0]) == {"method", "seed", "run_id", "site", "cohort", "split", "metric", "value"}
    for name in ("curves_prr.png", "curves_fedavg.png", "retrogress.png"):
        image = matplotlib.image.imread(out / name)
        assert image.shape[0] > 300 and image.shape[1] > 400 and image.std() > 0  # drawn, not blank
    assert len((out / "retrogress.csv").read_text().splitlines()) == 1 + 32


def test_cli_report_end_to_end(workspaces, tmp_path, capsys):
    out = tmp_path / "cli_report"
    assert main(["report", *map(str, workspaces), "--out", str(out), "--methods", "fedavg,prr", "--curves", "fedavg"]) == 0
    assert str(out / "report.md") in capsys.readouterr().out
    text = (out / "report.md").read_text()
    assert text.index("| fedavg |") < text.index("| prr |")  # the requested order
    assert (out / "curves_fedavg.png").stat().st_size > 0 and not (out / "curves_prr.png").exists()


def test_cli_report_without_results_fails_clearly(tmp_path, capsys):
    assert main(["report", str(tmp_path), "--out", str(tmp_path / "out")]) == 2  # refused input: nothing to report
    assert "no site results" in capsys.readouterr().err


# ----- sweep -------------------------------------------------------------------------------
class FakeSimulator:
    """Stands in for `nvflare simulator`: records the command, reads the exported job's config and
    writes the results files the sites would have written."""

    def __init__(self, fail: bool = False):
        self.commands: list[list[str]] = []
        self.configs: list[dict] = []
        self.fail = fail

    def __call__(self, command: list[str], log: Path) -> int:
        self.commands.append(command)
        log.write_text("simulator output\n")
        cfg = json.loads((Path(command[command.index("simulator") + 1]) / "app/config/config_fed_server.json").read_text())["workflows"][0][
            "args"
        ]["config"]
        self.configs.append(cfg)
        if self.fail:
            return 1
        ws = Path(command[command.index("-w") + 1])
        write_run(ws, cfg["method"], cfg["seed"], run_name=cfg["run_name"])
        for path in ws.glob("site-*/prrfl/*/results.json"):  # as the sites write it
            path.write_text(json.dumps({**json.loads(path.read_text()), "method_args": cfg["method_args"]}))
        return 0


def test_sweep_exports_each_run_runs_the_simulator_and_reports(tmp_path, capsys):
    fake = FakeSimulator()
    report = sweep(["prr"], [0, 1], tmp_path, sites=4, overrides=["num_rounds=3", "data.image_size=32"], runner=fake)
    command = fake.commands[0]
    assert command[:4] == [sys.executable, "-m", "nvflare.cli", "simulator"]
    assert command[4] == str(tmp_path / "jobs" / "prr_s0" / "derm_prr")
    assert command[5:] == ["-w", str(tmp_path / "prr_s0"), "-n", "4", "-t", "4"]
    assert [(c["seed"], c["run_name"], c["num_rounds"], c["data"]) for c in fake.configs] == [
        (0, "derm_prr_s0", 3, {"image_size": 32, "synthetic_scale": 0.04, "synthetic_raw_size": [160, 120]}),  # the quick profile's kept
        (1, "derm_prr_s1", 3, {"image_size": 32, "synthetic_scale": 0.04, "synthetic_raw_size": [160, 120]}),
    ]
    assert (tmp_path / "prr_s1.log").exists()
    assert report == tmp_path / "report" / "report.md" and "81.00 ± 1.41" in report.read_text()
    printed = capsys.readouterr().out
    assert "[1/2] prr_s0: done in" in printed and "[2/2] prr_s1" in printed


def test_sweep_runs_every_site_of_its_task_unless_told_otherwise(tmp_path):
    commands = []

    def failing(command, log):  # records the simulator's command line, then fails the run
        commands.append(command)
        return 1

    for task, sites in (("isic2019", "6"), ("prostate", "5"), ("derm", "4")):
        with pytest.raises(SweepError):
            sweep(["fedavg"], [0], tmp_path / task, task=task, runner=failing)
        assert commands[-1][-4:] == ["-n", sites, "-t", sites]
    with pytest.raises(SweepError):
        sweep(["fedavg"], [0], tmp_path / "three", sites=3, task="isic2019", runner=failing)
    assert commands[-1][-4:] == ["-n", "3", "-t", "3"]


def test_sweep_skips_runs_that_finished_with_the_same_config_and_reruns_a_changed_one(tmp_path, capsys):
    first = FakeSimulator()
    sweep(["prr"], [0, 1], tmp_path, sites=4, overrides=["num_rounds=3"], runner=first)
    assert len(first.commands) == 2 and (tmp_path / "prr_s0.done.json").exists()
    marker = json.loads((tmp_path / "prr_s0.done.json").read_text())
    assert marker["config"]["seed"] == 0 and marker["sites"] == 4 and marker["simulator_seconds"] >= 0
    again = FakeSimulator()
    sweep(["prr"], [0, 1, 2], tmp_path, sites=4, overrides=["num_rounds=3"], runner=again)
    assert [c["seed"] for c in again.configs] == [2]  # seeds 0 and 1 are done
    assert "prr_s0: finished before with the same config (prr_s0.done.json); skipped" in capsys.readouterr().out
    changed = FakeSimulator()
    sweep(["prr"], [0], tmp_path, sites=4, overrides=["num_rounds=3", "lr=0.5"], runner=changed)
    assert [c["lr"] for c in changed.configs] == [0.5]  # another config: run again
    failing = FakeSimulator(fail=True)
    with pytest.raises(SweepError):
        sweep(["prr"], [1], tmp_path, sites=4, overrides=["num_rounds=3", "lr=0.5"], runner=failing)
    assert not (tmp_path / "prr_s1.done.json").exists()  # a run that failed is not marked done


def test_a_run_naming_a_data_default_is_the_same_run_as_one_leaving_it_out(tmp_path):
    """The sweep and the bench (benchmarks/kept_run_matches.py) skip a finished run by one rule: data completed
    with the task's defaults on both sides; another value of the same setting, or an unreadable record, differs."""
    from prrfl.sweep import config_differences, run_config
    from prrfl.tasks.derm.task import DEFAULT_DATA

    shift = DEFAULT_DATA["synthetic_shift"]
    sweep(["fedavg"], [0], tmp_path, sites=4, overrides=["num_rounds=3", f"data.synthetic_shift={shift}"], runner=FakeSimulator())
    again = FakeSimulator()
    sweep(["fedavg"], [0], tmp_path, sites=4, overrides=["num_rounds=3"], runner=again)
    assert again.configs == []  # the default named or left out: one run
    kept = run_config("fedavg", 0, ["num_rounds=3", f"data.synthetic_shift={shift}"]).to_dict()
    assert config_differences(kept, run_config("fedavg", 0, ["num_rounds=3"])) == []
    assert config_differences(kept, run_config("fedavg", 0, ["num_rounds=4", "data.synthetic_shift=2"])) == [
        f"data.synthetic_shift: {shift!r} -> 2",
        "num_rounds: 3 -> 4",
    ]
    assert config_differences({"method": "nope"}, run_config("fedavg", 0))[0].startswith("config: not a valid config")
    assert config_differences(None, run_config("fedavg", 0))[0].startswith("config: not a valid config")


def test_an_ablation_sweep_reports_its_runs_under_the_options_it_set(tmp_path):
    fake = FakeSimulator()
    report = sweep(["prr"], [0], tmp_path, sites=4, overrides=[f"num_rounds={ROUNDS}", "method_args.det_enabled=false"], runner=fake)
    assert fake.configs[0]["method_args"] == {"det_enabled": False}
    assert "| prr[det_enabled=false] | 1 |" in report.read_text()


def test_profiles_set_every_job_of_a_task_and_set_overrides_apply_on_top(tmp_path):
    from prrfl.cli import PROFILE_NAMES
    from prrfl.flare.jobs import PROFILES, job_config
    from prrfl.tasks.derm.task import BENCH as DERM_BENCH
    from prrfl.tasks.prostate.task import BENCH as PROSTATE_BENCH
    from prrfl.tasks.prostate.task import QUICK as PROSTATE_QUICK

    assert PROFILE_NAMES == tuple(sorted(PROFILES))
    assert job_config("derm_fedavg", "quick") == job_config("derm_fedavg")
    bench = job_config("derm_fedbn", "bench")
    assert (bench.method, bench.num_rounds, bench.local_epochs, bench.data) == ("fedbn", 12, 5, DERM_BENCH["data"])
    prostate = job_config("prostate_fedavg", "bench")
    assert (prostate.optimizer, prostate.lr_step_epochs, prostate.data["image_size"]) == ("adam", PROSTATE_QUICK["lr_step_epochs"], 128)
    # the paper's E = 5 for every method, as many rounds as FedAvg's global model needs (docs/calibration.md)
    assert (prostate.num_rounds, prostate.local_epochs) == (6, 5)
    assert prostate.data == PROSTATE_BENCH["data"]
    assert job_config("derm_prr", "paper").num_rounds == 50
    with pytest.raises(ValueError, match="unknown profile 'huge'; available: \\['bench', 'paper', 'quick'\\]"):
        job_config("derm_prr", "huge")
    fake = FakeSimulator()
    sweep(["fedavg"], [0], tmp_path, sites=4, overrides=[f"num_rounds={ROUNDS}", "data.image_size=32"], runner=fake, profile="bench")
    assert (fake.configs[0]["local_epochs"], fake.configs[0]["data"]) == (5, {"synthetic_scale": 0.25, "image_size": 32})


def test_sweep_names_the_log_of_a_failed_run(tmp_path):
    with pytest.raises(SweepError, match=r"prr_s0 failed \(exit status 1\); see .*prr_s0\.log"):
        sweep(["prr"], [0], tmp_path, runner=FakeSimulator(fail=True))


def test_sweep_fails_when_sites_did_not_finish(tmp_path):
    def silent(command: list[str], log: Path) -> int:  # exit 0 but no results: a job the server aborted
        log.write_text("")
        return 0

    with pytest.raises(SweepError, match=r"only 0 of 4 sites finished all 5 rounds; see .*prr_s0\.log"):
        sweep(["prr"], [0], tmp_path, runner=silent)


def test_sweep_checks_every_job_before_running_any(tmp_path):
    fake = FakeSimulator()
    with pytest.raises(ValueError, match="unknown job 'derm_nosuchmethod'"):
        sweep(["prr", "nosuchmethod"], [0], tmp_path, runner=fake)
    assert fake.commands == []


def test_cli_sweep_passes_its_options_and_reports_a_failure_with_status_1(tmp_path, monkeypatch, capsys):
    calls = []

    def failing_sweep(*args, **kwargs):
        calls.append((args, kwargs))
        raise SweepError("run prr_s0 failed (exit status 1); see prr_s0.log")

    monkeypatch.setattr("prrfl.sweep.sweep", failing_sweep)
    argv = ["sweep", "--methods", "prr,fedavg", "--seeds", "0,1", "--workspace", str(tmp_path), "--sites", "2", "--set", "num_rounds=2"]
    assert main(argv) == 1
    assert calls == [((["prr", "fedavg"], [0, 1], str(tmp_path), 2, ["num_rounds=2"]), {"task": "derm", "profile": "quick"})]
    assert "prr_s0.log" in capsys.readouterr().err


def test_a_report_covers_one_task(workspaces, tmp_path):
    other = tmp_path / "prostate_ws"
    write_run(other, "prr", 0, run_name="prostate_prr_s0", run_id="p0")
    for path in other.glob("*/prrfl/*/results.json"):
        data = json.loads(path.read_text())
        path.write_text(json.dumps({**data, "task": "prostate"}))
    with pytest.raises(ValueError, match=r"results of the tasks \['derm', 'prostate'\]: report one of them"):
        build_report([*workspaces, other], tmp_path / "out")
    report = build_report([*workspaces, other], tmp_path / "out", task="derm").read_text()
    assert "## Table II: per-site test F1 and AUC" in report and "## Table X" in report


def test_minority_recall_names_the_most_imbalanced_site_and_averages_each_sites_rarest_class():
    from prrfl.report import SiteResult, minority_recall_table

    def site(method, seed, cohort, counts, recalls):
        test = {"f1": 50.0, **{f"recall_{k}": v for k, v in zip(("nv", "bkl", "mel"), recalls)}}
        site = f"site-{'ABC'.index(cohort) + 1}"  # the label names a site by its client and its cohort: site-1_A
        return SiteResult(Path("x"), "derm", method, seed, "r", site, cohort, 2, {"test": test}, None, None, [], counts)

    # site A: 90/9/1 (ratio 90, rarest mel); site B: 50/30/20 (ratio 2.5, rarest mel); site C has no bkl: 40/0/10 (rarest mel)
    results = [
        site("prr", 0, "A", [90, 9, 1], [95.0, 40.0, 20.0]),
        site("prr", 0, "B", [50, 30, 20], [80.0, 60.0, 40.0]),
        site("prr", 1, "A", [90, 9, 1], [95.0, 40.0, 40.0]),
        site("prr", 1, "B", [50, 30, 20], [80.0, 60.0, 60.0]),
        site("fedavg", 0, "A", [90, 9, 1], [99.0, 10.0, 0.0]),
        site("fedavg", 0, "B", [50, 30, 20], [90.0, 50.0, 30.0]),
    ]
    table = minority_recall_table(results, ["prr", "fedavg"], ("nv", "bkl", "mel"))
    lines = table.splitlines()
    assert lines[0] == "| method | seeds | site-1_A: recall of mel | mean over sites of the rarest class's recall |"
    assert lines[2] == "| prr | 2 | 30.00 ± 14.14 | 40.00 ± 14.14 |"  # A: 20, 40; per seed (20+40)/2=30, (40+60)/2=50
    assert lines[3].startswith("| fedavg | 1 | 0.00") and "15.00" in lines[3]
    # against prr: the pairs (A, 0) 0 vs 20 and (B, 0) 30 vs 40; differences -20, -10: t = -15 / (7.071 / sqrt 2) = -3
    # with 1 degree of freedom, two-sided p = 1 - 2 atan(3) / pi = 0.2048
    lines = minority_recall_table(results, ["prr", "fedavg"], ("nv", "bkl", "mel"), reference="prr").splitlines()
    assert lines[0].endswith("| p (vs prr) |")
    assert lines[2].endswith("| 40.00 ± 14.14 | – |") and lines[3].endswith("| 15.00 | 0.205 (t, n=2) |")
    assert "site-1_A is the most imbalanced (90 nv, 9 bkl, 1 mel training images)" in table
    assert minority_recall_table([site("prr", 0, "A", [90, 9, 1], [])], ["prr"], ("nv", "bkl", "mel")) is None  # no recall kept


def test_a_run_with_options_set_is_reported_apart_under_its_options(workspaces, tmp_path):
    from prrfl.report import variant_label

    assert variant_label("prr", {}) == "prr"
    assert variant_label("prr", {"det_enabled": False, "cpa_global": False}) == "prr[cpa_global=false,det_enabled=false]"
    ablation = tmp_path / "ablation_s0"
    write_run(ablation, "prr", 0, run_name="derm_prr_s0", run_id="nodet0")
    for path in ablation.glob("site-*/prrfl/*/results.json"):
        path.write_text(json.dumps({**json.loads(path.read_text()), "method_args": {"det_enabled": False}}))
    report = build_report([*workspaces, ablation], tmp_path / "out", methods=["prr", "prr[det_enabled=false]", "fedavg"])
    text = report.read_text()
    table_ii = text[text.index("## Table II") :]
    assert cell(table_ii, "prr")[1] == "2" and cell(table_ii, "prr[det_enabled=false]")[1] == "1"  # seeds: apart, not pooled
    assert (tmp_path / "out" / "curves_prr_det_enabled_false_.png").exists()


def test_a_run_that_reports_its_global_model_also_gets_rows_for_the_model_after_the_local_epochs(tmp_path):
    """FedAvg reports the global model as received (download records, best and last from them); the report adds
    the site's model after its local epochs as 'fedavg/trained', selected on the round records by the same rule."""
    write_run(tmp_path / "fedavg_s0", "fedavg", 0)
    for path in (tmp_path / "fedavg_s0").glob("site-*/prrfl/*/results.json"):
        results = json.loads(path.read_text())
        results["reported_at"] = "download"
        for h in results["history"]:
            if h["kind"] == "round":  # after the local epochs: validates 70, 90, 90 (rounds 0, 1, 2), tests 20 + round
                h["valid"], h["test"] = metrics([70.0, 90.0, 90.0][h["round"]]), metrics(20.0 + h["round"])
        path.write_text(json.dumps(results))
    results = find_results([tmp_path])
    reported = [r for r in results if r.method == "fedavg"]
    trained = [r for r in results if r.method == "fedavg/trained"]
    assert len(trained) == 4 and all(r.reported_at == "round" and r.reported_model == r0.reported_model for r, r0 in zip(trained, reported))
    assert {(r.best["round"], r.best["test"]["f1"], r.last["test"]["f1"]) for r in trained} == {(1, 21.0, 22.0)}
    assert [(r.best, r.last) for r in reported] == [
        (json.loads(r.path.read_text())["best"], json.loads(r.path.read_text())["last"]) for r in reported
    ]
    assert method_order(results, None, "fedavg") == ["fedavg", "fedavg/trained"]


def test_the_other_model_of_a_run_gets_rows_of_its_own_selected_by_the_same_rule(tmp_path):
    """PRR records D's valid/test beside P's every round: the report scores D as 'prr/deputy', its best round
    chosen on D's own validation score (the first strict maximum), its last round beside it."""
    write_run(tmp_path / "prr_s0", "prr", 0)
    for path in (tmp_path / "prr_s0").glob("site-*/prrfl/*/results.json"):
        results = json.loads(path.read_text())
        results["reported_model"] = "personal"
        for h in results["history"]:
            if h["kind"] == "round":  # D validates 70, 90, 90 (rounds 0, 1, 2) and tests 10 + round
                h["other_models"] = {"deputy": {"valid": metrics([70.0, 90.0, 90.0][h["round"]]), "test": metrics(10.0 + h["round"])}}
        path.write_text(json.dumps(results))
    results = find_results([tmp_path])
    deputy = [r for r in results if r.method == "prr/deputy"]
    assert len(deputy) == 4 and all(r.reported_model == "deputy" for r in deputy)
    assert {(r.best["round"], r.best["test"]["f1"], r.last["test"]["f1"]) for r in deputy} == {(1, 11.0, 12.0)}
    assert method_order(results, ["prr"], "prr") == method_order(results, None, "prr") == ["prr", "prr/deputy"]
    table = table_ii(long_rows(results), ["prr", "prr/deputy"], "prr", DERM_METRICS)
    assert cell(table, "prr/deputy")[10] == "11.00" and cell(table, "prr/deputy")[12] == "12.00"
    report = build_report([tmp_path], tmp_path / "report").read_text()
    assert "prr: its reported model (personal)" in report
    assert "| prr/deputy | deputy | 0 |" in report  # the runs table names the model


def test_the_retrogress_legend_names_exactly_the_bars_drawn():
    """One legend entry per series of bars drawn, in its colour: the reported models' bars alone, or with the
    shared models' beside them; no entry names a colour that no bar has (PRR's reported bar is 0 high)."""
    import matplotlib.colors
    import matplotlib.pyplot as plt

    from prrfl.report.figures import retrogress_figure

    summary = {"prr": (0.0, 0.0, 8), "fedavg": (5.5, 1.2, 8), "fedbn": (3.0, 2.0, 8)}
    for shared in (None, {"prr": (28.3, 30.9, 8), "fedavg": (5.5, 1.2, 8)}):
        fig = retrogress_figure(summary, "prr", "f1", shared)
        ax = fig.axes[0]
        bars = [c for c in ax.containers if isinstance(c, matplotlib.container.BarContainer)]
        legend = ax.get_legend()
        assert [t.get_text() for t in legend.get_texts()] == [c.get_label() for c in bars]
        assert len(bars) == (2 if shared else 1) and [len(c) for c in bars] == [3, 2][: len(bars)]
        for handle, series in zip(legend.legend_handles, bars):
            colours = {matplotlib.colors.to_hex(patch.get_facecolor()) for patch in series}
            assert colours == {matplotlib.colors.to_hex(handle.get_facecolor())}  # one colour a series, the legend's
        assert "reference: prr" in ax.get_xlabel() and "green" not in ax.get_xlabel()
        plt.close(fig)


def test_the_overlays_title_and_colour_legend_stand_clear_of_the_slices(workspaces, tmp_path):
    """Each run's examples drawn as contours in the colour-blind-safe pair the title and the legend name; the
    title above every slice and its column heading, the legend below them, also with as many rows as the held-out
    bench has (a tall figure is where a title laid out by tight_layout fell onto the first row); only the reported
    model's rows (the examples are its own): no 'prr/deputy' row although PRR's runs scored D."""
    import matplotlib.colors
    import matplotlib.pyplot as plt
    import numpy as np

    from prrfl.report.figures import PREDICTION_COLOUR, TRUTH_COLOUR, overlays_figure, plot_overlays

    variants = []
    for k in range(14):  # 16 rows in all: FedAvg under 14 option settings beside PRR and FedAvg
        ws = tmp_path / f"variant_{k}"
        write_run(ws, "fedavg", 0, run_id=f"variant{k}")
        for path in ws.glob("site-*/prrfl/*/results.json"):
            path.write_text(json.dumps({**json.loads(path.read_text()), "method_args": {"mu": k}}))
        variants.append(ws)
    truth = np.zeros((1, 32, 32), dtype=np.uint8)
    truth[0, 8:20, 8:20] = 1
    for ws in [*workspaces, *variants]:
        for path in ws.glob("site-*/prrfl/*/results.json"):
            image = np.full((1, 32, 32), 100, dtype=np.uint8)
            np.savez_compressed(path.parent / "examples.npz", image=image, truth=truth, prediction=np.roll(truth, 3, axis=2))
            if ws.name.startswith("prr_"):
                results = json.loads(path.read_text())
                for h in results["history"]:
                    if h["kind"] == "round":
                        h["other_models"] = {"deputy": {"valid": metrics(50.0), "test": metrics(60.0)}}
                path.write_text(json.dumps(results))
    results = find_results([*workspaces, *variants])
    order = method_order(results, None, "prr")
    assert "prr/deputy" in order
    fig = overlays_figure(results, order, ["A", "B", "C", "D"])
    assert [ax.get_ylabel() for ax in fig.axes if ax.get_ylabel()] == [m for m in order if m != "prr/deputy"]
    assert len(order) == 17
    assert [ax.get_title() for ax in fig.axes if ax.get_title()] == ["site-1_A", "site-2_B", "site-3_C", "site-4_D"]
    colours = {matplotlib.colors.to_hex(c) for ax in fig.axes for cs in ax.collections for c in cs.get_edgecolor()}
    assert colours == {matplotlib.colors.to_hex(TRUTH_COLOUR), matplotlib.colors.to_hex(PREDICTION_COLOUR)}
    [legend] = fig.legends
    assert [t.get_text() for t in legend.get_texts()] == ["ground truth (sky blue)", "prediction (orange)"]
    assert [matplotlib.colors.to_hex(h.get_color()) for h in legend.legend_handles] == [
        matplotlib.colors.to_hex(TRUTH_COLOUR),
        matplotlib.colors.to_hex(PREDICTION_COLOUR),
    ]
    assert "sky blue" in fig.get_suptitle() and "orange" in fig.get_suptitle()
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    slices = [ax.get_tightbbox(renderer) for ax in fig.axes]  # each slice with its column heading and row label
    assert fig._suptitle.get_window_extent(renderer).y0 >= max(b.y1 for b in slices)
    assert legend.get_window_extent(renderer).y1 <= min(b.y0 for b in slices)
    plt.close(fig)
    written = plot_overlays(results, order, tmp_path / "overlays.jpg", ["A", "B", "C", "D"])
    assert written == tmp_path / "overlays.jpg" and matplotlib.image.imread(written).shape[2] == 3
