"""`prrfl results` on the folders each way of running writes, built here file by file as FLARE 2.9 and the
workflow lay them out (the real runs: tests/test_e2e_simulator.py, tests/test_recipe.py, tests/test_deploy_poc.py)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from conftest import tiny_derm_config

from prrfl import cli

RUN_ID, JOB_ID = "eddd42994953", "24c2dec7-167d-479f-9738-b9eeb089ea18"
SCORES = [("A", 61.25, 82.5), ("B", 40.0, 71.0)]  # the first and second site's cohort, test F1, test AUC
SITES = ["site-1", "site-2"]  # FLARE's client names in the simulator and in FLARE's POC
HOSPITALS = ["vidir-modern", "vidir-molemax"]  # in `prrfl deploy poc` (workspace_templates/poc/project.yml)


def table(clients: list[str]) -> list[str]:
    """What every layout prints for that run, with the server's participation: each site by its label, the client
    name and the cohort (`site-1_A`; a POC's hospital `vidir-modern_A`)."""
    first, second = clients
    return [
        "| site | best round | rounds | test F1 | test AUC |",
        "|---|---|---|---|---|",
        f"| {first}_A | 1 | 2/2 | 61.25 | 82.50 |",
        f"| {second}_B | 1 | 2/2 | 40.00 | 71.00 |",
        "| **mean** | | | **50.62** | **76.75** |",
    ]


def site_results(site: str, cohort: str, f1: float, auc: float, run_id: str = RUN_ID, run_name: str = "derm_prr") -> dict:
    """A site's results.json (prrfl.site.state.SiteRuntime.results) after 2 rounds, best at round 1."""
    metrics = {
        "valid": {"f1": f1 - 5, "auc": auc - 5, "acc": 60.0, "bacc": 50.0},
        "test": {"f1": f1, "auc": auc, "acc": 60.0, "bacc": 50.0},
    }
    return {
        "site": site,
        "cohort": cohort,
        "task": "derm",
        "method": "prr",
        "run_name": run_name,
        "run_id": run_id,
        "seed": 0,
        "rounds_completed": 2,
        "rounds_missed": [],
        "data_root": None,
        "state_dir": f"/somewhere/{site}/prrfl/{run_name}",
        "num_train": 43,
        "class_counts": [26, 7, 10],
        "best": {"round": 1, **metrics},
        "last": {"kind": "round", "round": 1, "epochs_done": 2, **metrics},
        "ood": {"f1": 30.0, "auc": 70.0, "acc": 70.0, "bacc": 40.0},
        "history": [],
    }


def server_results(sites: dict[str, dict], run_id: str = RUN_ID, run_name: str = "derm_prr") -> dict:
    """The workflow's results.json (PersonalizedWorkflow._finish): what each site reported, and its participation."""
    summaries = {
        s: {**{k: r[k] for k in ("best", "last", "ood", "cohort")}, "download_drop": 0.0, "participation": participation()}
        for s, r in sites.items()
    }
    return {"run_id": run_id, "config": tiny_derm_config(run_name=run_name).to_dict(), "sites": summaries, "global_model": None}


def participation() -> dict:
    return {"rounds": 2, "aggregated": [0, 1], "missed": [], "stale": False}


def write(path: Path, data) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(data if isinstance(data, str) else json.dumps(data))


def write_run(server_files: list[Path], site_files: dict[str, list[Path]], run_id: str = RUN_ID, run_name: str = "derm_prr") -> None:
    """The server's results.json at each of server_files, each site's at each of its paths (scored as in SCORES)."""
    sites = {s: site_results(s, *scores, run_id=run_id, run_name=run_name) for s, scores in zip(site_files, SCORES)}
    for path in server_files:
        write(path, server_results(sites, run_id, run_name))
    for site, paths in site_files.items():
        for path in paths:
            write(path, sites[site])


def simulator(root: Path) -> Path:
    """`nvflare simulator -w ws` or `python job.py`: the workspace, and the state beside it (not searched)."""
    ws = root / "ws"
    write_run([ws / "server/simulate_job/results.json"], {s: [ws / s / "prrfl/derm_prr/results.json"] for s in SITES})
    write_run([root / "ws.state/server/derm_prr/results.json"], {s: [root / "ws.state" / s / "derm_prr/results.json"] for s in SITES})
    write(ws / "site-1/simulate_job/app_site-1/custom/results.json", {"accuracy": 0.9})  # not ours: skipped
    return ws


def prrfl_run(root: Path) -> Path:
    """`prrfl run derm_prr --workspace W` (SimEnv): W/<job>/ is the simulator workspace, W/<job>.state/ its state."""
    write_run(
        [root / "W/derm_prr/server/simulate_job/results.json", root / "W/derm_prr.state/server/derm_prr/results.json"],
        {
            s: [root / "W/derm_prr" / s / "prrfl/derm_prr/results.json", root / "W/derm_prr.state" / s / "derm_prr/results.json"]
            for s in SITES
        },
    )
    return root / "W"


def poc_env(root: Path) -> Path:
    """`prrfl run --env poc` (PocEnv): FLARE's POC workspace, its participants under example_project/prod_00/,
    the job's server workspace downloaded into the admin's transfer/<job id>/workspace/."""
    prod = root / "poc/example_project/prod_00"
    write_run(
        [prod / "server/prrfl/derm_prr/results.json", prod / f"admin@nvidia.com/transfer/{JOB_ID}/workspace/results.json"],
        {s: [prod / s / "prrfl/derm_prr/results.json"] for s in SITES},
    )
    write(prod / f"admin@nvidia.com/transfer/{JOB_ID}/meta.json", {"job_id": JOB_ID, "status": "FINISHED:COMPLETED"})
    return root / "poc"


def deploy_poc(root: Path) -> Path:
    """`prrfl deploy poc --workdir D`: the provisioned kits (server `localhost`, the hospitals, the admin with its
    download), and result/, the download's copy."""
    prod = root / "D/provision/prr_consortium/prod_00"
    download = prod / f"admin@coordinator.org/transfer/{JOB_ID}/workspace/results.json"
    write_run(
        [prod / "localhost/prrfl/derm_prr/results.json", download, root / "D/result/workspace/results.json"],
        {s: [prod / s / "prrfl/derm_prr/results.json"] for s in HOSPITALS},
    )
    return root / "D"


@pytest.mark.parametrize("layout", [simulator, prrfl_run, poc_env, deploy_poc])
def test_every_workspace_kind_prints_its_runs_table_once(layout, tmp_path, capsys):
    folder = layout(tmp_path)
    assert cli.main(["results", str(folder)]) == 0
    out, err = capsys.readouterr()
    (title,) = [line for line in out.splitlines() if line.startswith("## ")]  # the copies are one run
    assert title.startswith(f"## derm_prr (run {RUN_ID}, task derm): {folder}") and title.endswith("results.json")
    assert out.splitlines()[2:7] == table(HOSPITALS if layout is deploy_poc else SITES)
    if layout is simulator:
        assert (
            err
            == f"note: {folder}/site-1/simulate_job/app_site-1/custom/results.json: skipped, not a prrfl results file (neither the server's 'sites' and 'config' nor a site's 'site' and 'best')\n"
        )


def test_the_results_file_itself_and_a_sites_own_workspace_without_the_servers_file(tmp_path, capsys):
    poc_env(tmp_path)
    download = tmp_path / f"poc/example_project/prod_00/admin@nvidia.com/transfer/{JOB_ID}/workspace/results.json"
    assert cli.main(["results", str(download)]) == 0
    assert capsys.readouterr().out.splitlines()[2:7] == table(SITES)
    # a hospital's own kit holds only its site's file: its row, from that file, without the server's participation
    kit = tmp_path / "poc/example_project/prod_00/site-2"
    assert cli.main(["results", str(kit)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == f"## derm_prr (run {RUN_ID}, task derm): the sites' results.json under {kit}/prrfl/derm_prr (no server results.json)"
    assert lines[2:6] == [
        "| site | best round | test F1 | test AUC |",
        "|---|---|---|---|",
        "| site-2_B | 1 | 40.00 | 71.00 |",
        "| **mean** | | **40.00** | **71.00** |",
    ]


def test_several_runs_in_one_folder_give_one_named_table_each(tmp_path, capsys):
    prrfl_run(tmp_path)
    # another job in the same workspace root, and the previous run of derm_prr that a new run set aside
    write_run(
        [tmp_path / "W/derm_fedbn/server/simulate_job/results.json"],
        {"site-1": [tmp_path / "W/derm_fedbn/site-1/prrfl/derm_fedbn/results.json"]},
        "0123456789ab",
        "derm_fedbn",
    )
    old = tmp_path / "W/derm_prr.state/server/derm_prr.replaced-20250101-120000/results.json"
    write_run([old], {}, run_id="ffffffffffff")
    os.utime(old, (1e9, 1e9))  # finished before the run that replaced it
    assert cli.main(["results", str(tmp_path / "W")]) == 0
    titles = [line for line in capsys.readouterr().out.splitlines() if line.startswith("## ")]
    assert titles == [
        f"## derm_fedbn (run 0123456789ab, task derm): {tmp_path}/W/derm_fedbn/server/simulate_job/results.json",
        f"## derm_prr (run ffffffffffff, task derm): {old}",
        f"## derm_prr (run {RUN_ID}, task derm): {tmp_path}/W/derm_prr/server/simulate_job/results.json",
    ]


def test_nothing_to_show_is_one_line_naming_the_folder_and_foreign_files_are_skipped(tmp_path, capsys):
    assert cli.main(["results", str(tmp_path)]) == 2
    assert capsys.readouterr().err == f"prrfl: error: {tmp_path}: no results.json found\n"
    write(tmp_path / "a/results.json", [1, 2])
    write(tmp_path / "b/results.json", {"site": "x"})  # a 'site' but no results of one
    write(tmp_path / "c/results.json", "{truncated")
    write(tmp_path / "d/results.json", {"sites": {"site-1": 0.5}, "config": {}})
    assert cli.main(["results", str(tmp_path)]) == 2
    err = capsys.readouterr().err.splitlines()
    assert [line.split(": skipped")[0] for line in err[:4]] == [f"note: {tmp_path}/{d}/results.json" for d in "abcd"]
    assert "not readable as JSON" in err[2] and "not a prrfl results file" in err[3]
    assert err[4:] == [f"prrfl: error: {tmp_path}: no results.json of a prrfl run (4 other file(s) skipped) found"]


def printed_tables(folder: Path, capsys) -> dict[str, str]:
    """What `prrfl results <folder>` prints, run in this process: each run's title and its table
    (for the end-to-end tests, on the folders their runs wrote)."""
    capsys.readouterr()
    assert cli.main(["results", str(folder)]) == 0, capsys.readouterr().err
    blocks = capsys.readouterr().out.strip().removeprefix("## ").split("\n\n## ")
    return dict(block.split("\n\n", 1) for block in blocks)


def test_a_run_that_has_not_completed_its_rounds_says_so_in_its_title():
    """An interrupted (or still running) run's sites' files: the table is of the rounds so far, and its title says
    so; a finished run's, and files written before they recorded the run's rounds, say nothing."""
    from prrfl.report.listing import RunResults

    def run(**site) -> RunResults:
        return RunResults("derm_prr", "r1", "derm", "the sites' results.json under /ws", {"site-1": {"best": {}, **site}})

    assert run(rounds_completed=2, num_rounds=5).title() == (
        "derm_prr (run r1, task derm): the sites' results.json under /ws. NOT FINISHED: 2 of 5 rounds done "
        "(interrupted, or still running); the numbers so far, not the run's results"
    )
    assert run(rounds_completed=5, num_rounds=5).title() == "derm_prr (run r1, task derm): the sites' results.json under /ws"
    assert run(rounds_completed=2).title() == "derm_prr (run r1, task derm): the sites' results.json under /ws"
