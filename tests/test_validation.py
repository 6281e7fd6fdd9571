"""A bad job is refused before any site trains, and the command lines say why in one line.

Whole-config validation (RunConfig fields, task and method names, method options read from the
constructors' signatures, the task's data options), min_sites, empty raw or prepared data, and the
exit status and stderr of `prrfl` and `python -m prrfl.tasks.derm`.
"""

from __future__ import annotations

import json
import subprocess
import sys
import typing
from pathlib import Path

import numpy as np
import pytest
import torch

from prrfl import cli
from prrfl.algorithms import class_prototypes, det, pfa
from prrfl.config import ConfigError, RunConfig, describe, matches
from prrfl.errors import CommandFailed, run_command
from prrfl.flare.jobs import JOBS, job_config
from prrfl.methods.prr import PHASE_NAMES
from prrfl.registry import method_class, method_names, validate_config
from prrfl.server import aggregation
from prrfl.sweep import sweep
from prrfl.tasks.derm import __main__ as data_cli
from prrfl.tasks.derm.author_splits import read_author_split_file
from prrfl.tasks.derm.layout import DEFAULT_LAYOUT as L
from prrfl.tasks.derm.layout import HAM_COLUMNS, ISIC_COLUMNS
from prrfl.tasks.derm.prepare import prepare_dermoscopy
from prrfl.tasks.derm.records import read_ham10000, read_isic2017
from prrfl.tasks.derm.store import save_split
from prrfl.tasks.derm.task import DEFAULT_DATA, DermData, DermTask


def refused(values: dict) -> str:
    """The message validate_config refuses `values` with."""
    with pytest.raises(ConfigError) as e:
        validate_config(values)
    return str(e.value)


# ----- RunConfig fields --------------------------------------------------------------------------------
@pytest.mark.parametrize("value", ["flase", "true", 0, 1, None])
def test_a_boolean_field_takes_only_true_or_false(value):
    with pytest.raises(ConfigError) as e:
        RunConfig(eval_test_every_epoch=value)
    assert str(e.value) == f"config field 'eval_test_every_epoch' must be true or false, got {value!r}"
    assert RunConfig(eval_test_every_epoch=False).eval_test_every_epoch is False


def test_numbers_integers_and_dicts_are_checked_by_name():
    assert str(pytest.raises(ConfigError, RunConfig, lr="abc").value) == "config field 'lr' must be a number, got 'abc'"
    assert issubclass(ConfigError, ValueError)
    assert RunConfig(lr=1).lr == 1  # an integer is a number
    for bad in (True, "0.1", [0.1]):
        with pytest.raises(ConfigError, match="config field 'lr' must be a number"):
            RunConfig(lr=bad)
    for bad in (2.0, True, "3"):
        with pytest.raises(ConfigError, match="config field 'num_rounds' must be an integer"):
            RunConfig(num_rounds=bad)
    with pytest.raises(ConfigError, match="config field 'method_args' must be a dict, got"):
        RunConfig(method_args=["det_enabled"])
    with pytest.raises(ConfigError, match="config field 'run_name' must be a string, got 3"):
        RunConfig(run_name=3)


@pytest.mark.parametrize(
    "field, value, expected",
    [
        ("num_rounds", 0, "a positive integer"),
        ("lr", -1.0, "> 0"),
        ("lr_gamma", 0, "> 0"),
        ("momentum", -0.1, ">= 0"),
        ("weight_decay", -1e-6, ">= 0"),
        ("select_from_round", 5, r"in \[0, num_rounds=5\)"),
        ("run_name", "../elsewhere", "a folder name of letters, digits, '.', '_' and '-'"),
        ("run_name", "", "a folder name of letters"),
    ],
)
def test_ranges_are_checked_by_name(field, value, expected):
    with pytest.raises(ConfigError, match=f"config field '{field}' must be {expected}.*, got"):
        RunConfig(**{field: value})


def test_unknown_fields_are_named_with_a_suggestion():
    with pytest.raises(ConfigError, match=r"unknown config field\(s\) \['epochs'\] \(did you mean 'local_epochs'\?\)"):
        RunConfig.from_dict({"epochs": 3})
    with pytest.raises(ConfigError, match="a run configuration must be a dict"):
        RunConfig.from_dict([("lr", 0.1)])


# ----- min_sites ---------------------------------------------------------------------------------------
def test_min_sites_defaults_to_a_strict_majority_of_the_sites():
    cfg = RunConfig()
    assert cfg.min_sites == "majority"
    assert [cfg.required_sites(n) for n in (1, 2, 3, 4, 5)] == [1, 2, 2, 3, 3]
    assert cfg.required_sites(0) == 1  # never go on without any site


def test_min_sites_all_and_a_number():
    assert RunConfig(min_sites="all").required_sites(4) == 4
    assert RunConfig(min_sites="all").required_sites(0) == 1
    assert RunConfig(min_sites=2).required_sites(4) == 2
    assert RunConfig(min_sites=4).required_sites(4) == 4
    with pytest.raises(ConfigError, match="config field 'min_sites' asks for 5 sites, but there are only 4"):
        RunConfig(min_sites=5).required_sites(4)


@pytest.mark.parametrize("value", [0, -1, "most", True, 2.0])
def test_min_sites_refuses_other_values(value):
    with pytest.raises(ConfigError, match="config field 'min_sites' must be"):
        RunConfig(min_sites=value)


# ----- task and method names, method options -----------------------------------------------------------------
def test_task_and_method_names_come_from_the_registry():
    assert refused({"method": "fedavgg"}).endswith("got 'fedavgg' (did you mean 'fedavg'?)")
    assert refused({"method": "fedavgg"}).startswith(
        "config field 'method' must be one of ['apfl', 'balancefl', 'creff', 'fca', 'fedavg', 'fedbabu', 'fedbn', 'fedeamc', 'fedfocal',"
        " 'fedlc', 'fedproto', 'fedprox', 'fedrep', 'fedrs', 'fml', 'harmofl', 'ida', 'local', 'moon',"
    )
    assert refused({"task": "skin"}) == "config field 'task' must be one of ['derm', 'isic2019', 'prostate'], got 'skin'"


def test_a_boolean_option_typo_is_refused_with_its_path():
    assert refused({"method": "prr", "method_args": {"det_enabled": "flase"}}) == (
        "method 'prr' option 'det_enabled' must be true or false, got 'flase' (config field 'method_args.det_enabled')"
    )
    cfg = validate_config({"method": "prr", "method_args": {"det_enabled": False}})
    assert cfg.method_args == {"det_enabled": False}


def test_an_unknown_option_lists_the_known_ones_with_a_suggestion():
    message = refused({"method": "prr", "method_args": {"det_enable": False}})
    assert message.startswith("unknown method 'prr' option(s) ['det_enable'] in config field 'method_args' (did you mean 'det_enabled'?)")
    known = sorted(method_class("prr").option_parameters())
    assert message.endswith(f"; expected some of {known}")
    assert refused({"method": "fedprox", "method_args": {"muu": 0.1}}).endswith("expected some of ['mu', 'weighting']")


@pytest.mark.parametrize(
    "method, option, value, allowed",
    [
        ("prr", "r_schedule", "paperr", ["paper", "authors"]),
        ("prr", "pfa_components", "phase", ["amplitude_phase", "amplitude"]),
        ("prr", "conv_layout", "torch", ["paper", "authors"]),
        ("prr", "site_weights", "size", ["samples", "uniform"]),
        ("prr", "det_split", "test", ["valid", "train"]),
        ("prr", "proto_std", "sample", ["biased", "unbiased"]),
        ("fedavg", "weighting", "size", ["samples", "uniform"]),
        ("ida", "weighting", "inverse", ["samples", "uniform"]),
        ("fedeamc", "counts", "all", ["global", "local"]),
    ],
)
def test_names_from_known_lists_are_checked(method, option, value, allowed):
    assert refused({"method": method, "method_args": {option: value}}) == (
        f"method '{method}' option '{option}' must be one of {allowed}, got {value!r} (config field 'method_args.{option}')"
    )
    validate_config({"method": method, "method_args": {option: allowed[-1]}})


def test_sequences_are_checked_item_by_item():
    message = refused({"method": "prr", "method_args": {"det_phases": ["recover", "recovery"]}})
    assert "option 'det_phases' must be a list of values from ['recover', 'exchange', 'sublimate']" in message
    assert "(config field 'method_args.det_phases')" in message
    with pytest.raises(ConfigError, match="det_phases' must be a list"):
        validate_config({"method": "prr", "method_args": {"det_phases": "recover"}})  # a string is not a list
    validate_config({"method": "prr", "method_args": {"det_phases": ["exchange"]}})


def test_optional_options_take_null_or_their_type():
    validate_config({"method": "fedfocal", "method_args": {"alpha": None, "gamma": 0}})
    validate_config({"method": "fedfocal", "method_args": {"alpha": [1, 0.5, 2.0]}})
    with pytest.raises(ConfigError, match=r"option 'alpha' must be a list of numbers or null, got \['a'\]"):
        validate_config({"method": "fedfocal", "method_args": {"alpha": ["a"]}})


def test_options_follow_the_forwarding_of_the_constructors():
    methods = {name: method_class(name) for name in method_names()}
    assert set(methods["fedprox"].option_parameters()) == {"mu", "weighting"}  # FedProx -> FedAvg
    assert set(methods["fedbn"].option_parameters()) == {"weighting"}  # no constructor of its own
    assert methods["ida"].option_parameters()["weighting"].default == "uniform"  # the subclass's parameter wins
    assert methods["prrfl"].option_parameters().keys() == methods["prr"].option_parameters().keys()  # PRRFL -> PRR
    prr = set(methods["prr"].option_parameters())
    assert set(methods["fedeamc"].option_parameters()) == {"counts", "power"} | prr  # via _PRRWithLoss
    assert set(methods["fedproto"].option_parameters()) == {"lam"}  # Method takes no option of its own


@pytest.mark.parametrize("name", method_names())
def test_every_option_is_annotated_and_its_default_fits(name):
    for option, p in method_class(name).option_parameters().items():
        assert p.annotation is not typing.Any, f"{name}.{option} has no annotation"
        describe(p.annotation)  # raises TypeError for an annotation the checker cannot check
        assert matches(p.default, p.annotation), f"{name}.{option}: default {p.default!r} vs {p.annotation}"
    validate_config({"method": name})


def test_the_literal_annotations_list_the_values_the_code_accepts():
    assert typing.get_args(det.PhaseName) == PHASE_NAMES
    assert typing.get_args(det.MetricSplit) == det.DET_METRIC_SPLITS
    assert typing.get_args(aggregation.Weighting) == aggregation.WEIGHTINGS
    assert typing.get_args(pfa.Components) == pfa.COMPONENTS
    assert typing.get_args(pfa.ConvLayout) == pfa.CONV_LAYOUTS
    assert typing.get_args(pfa.Schedule) == pfa.SCHEDULES
    assert typing.get_args(class_prototypes.StdKind) == class_prototypes.STD_KINDS


def test_the_methods_own_rules_are_config_errors_too():
    message = refused({"method": "prr", "method_args": {"l1": 0.95}})
    assert message.startswith("config field 'method_args' of method 'prr': PRR options need 0 < l1 <= l2 <= 1")
    # checked when the job starts, not at the server's first aggregation or a site's first epoch
    assert "r0 must lie in [0, 0.5], got 0.7" in refused({"method": "prr", "method_args": {"r0": 0.7}})
    assert "tau > 0" in refused({"method": "prr", "method_args": {"tau": 0}})
    assert "options ['cpa_local'] do not apply" in refused({"method": "fedeamc", "method_args": {"cpa_local": True}})
    assert "mu must be >= 0" in refused({"method": "fedprox", "method_args": {"mu": -1}})


# ----- task data options --------------------------------------------------------------------------------
def test_data_options_are_checked_with_their_path():
    assert refused({"data": {"image_size": "big"}}) == (
        "derm data option 'image_size' must be an integer, got 'big' (config field 'data.image_size')"
    )
    assert "must be an integer >= 8, got 4" in refused({"data": {"image_size": 4}})
    assert "option 'synthetic_scale' must be a number > 0, got 0" in refused({"data": {"synthetic_scale": 0}})
    assert "must be a list of 2 integers, got [300]" in refused({"data": {"synthetic_raw_size": [300]}})
    assert "must be a list of 2 integers, got [300, 22.5]" in refused({"data": {"synthetic_raw_size": [300, 22.5]}})
    assert "must be an integer, got 1.5" in refused({"data": {"split_seed": 1.5}})
    assert "must be one of ['image', 'lesion'], got 'lesions'" in refused({"data": {"group_by": "lesions"}})
    assert refused({"data": {"heldout_min_per_class": 0}}) == (
        "derm data option 'heldout_min_per_class' must be an integer >= 1, got 0 (config field 'data.heldout_min_per_class')"
    )
    assert "must be an integer, got 2.5 (config field 'data.heldout_min_per_class')" in refused({"data": {"heldout_min_per_class": 2.5}})
    assert "(did you mean 'image_size'?)" in refused({"data": {"img_size": 32}})
    assert validate_config({"data": {"synthetic_raw_size": [96, 72], "synthetic_scale": 1}}).data["synthetic_scale"] == 1


def test_the_data_defaults_fit_their_annotations():
    types = typing.get_type_hints(DermData)
    assert types.keys() == DEFAULT_DATA.keys()
    assert all(matches(DEFAULT_DATA[k], t) for k, t in types.items())


# ----- the entry point ---------------------------------------------------------------------------------
def test_validate_config_takes_a_dict_or_a_run_config():
    cfg = job_config("derm_prr")
    assert validate_config(cfg) is cfg
    assert validate_config(cfg.to_dict()) == cfg
    cfg.lr = "abc"  # a dataclass can be changed after it was checked: check it again
    with pytest.raises(ConfigError, match="config field 'lr' must be a number"):
        validate_config(cfg)


@pytest.mark.parametrize("name", sorted(JOBS))
def test_every_committed_job_config_validates(name):
    assert validate_config(job_config(name).to_dict()) == job_config(name)


# ----- `prrfl` command line ----------------------------------------------------------------------------
def export(tmp_path, *options: str) -> int:
    return cli.main(["jobs", "export", "derm_prr", "--out", str(tmp_path / "jobs"), *options])


def one_error_line(err: str) -> str:
    assert "Traceback" not in err
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("prrfl: error: ")
    return lines[0].removeprefix("prrfl: error: ")


@pytest.mark.parametrize(
    "assignment, message",
    [
        ("lr=abc", "job 'derm_prr': config field 'lr' must be a number, got 'abc'"),
        (
            "method_args.det_enabled=flase",
            "job 'derm_prr': method 'prr' option 'det_enabled' must be true or false, got 'flase' (config field 'method_args.det_enabled')",
        ),
        ("lr", "--set expects KEY=VALUE, got 'lr'"),
        ("lr.x=1", "--set lr.x=1: config field 'lr' holds no fields"),
    ],
)
def test_export_with_a_bad_set_exits_2_with_one_line_and_writes_nothing(tmp_path, capsys, assignment, message):
    assert export(tmp_path, "--set", assignment) == 2
    assert one_error_line(capsys.readouterr().err) == message
    assert not (tmp_path / "jobs").exists()


def test_export_checks_every_job_before_writing_the_first(tmp_path, capsys):
    status = cli.main(["jobs", "export", "--out", str(tmp_path / "jobs"), "--set", "method_args.det_enabled=false"])
    assert status == 2
    message = one_error_line(capsys.readouterr().err)
    assert message.startswith("job 'derm_apfl': unknown method 'apfl' option(s) ['det_enabled']")
    assert not (tmp_path / "jobs").exists()  # not even derm_prr, which the option fits


def test_export_with_a_good_set_writes_the_value(tmp_path, capsys):
    assert export(tmp_path, "--set", "method_args.det_enabled=false") == 0
    server = json.loads((tmp_path / "jobs/derm_prr/app/config/config_fed_server.json").read_text())
    assert server["workflows"][0]["args"]["config"]["method_args"] == {"det_enabled": False}


def test_traceback_on_request(tmp_path, capsys, monkeypatch):
    assert cli.main(["--traceback", "jobs", "export", "derm_prr", "--out", str(tmp_path), "--set", "lr=abc"]) == 2
    err = capsys.readouterr().err
    assert "Traceback (most recent call last)" in err and "ConfigError" in err
    assert err.splitlines()[-1] == "prrfl: error: job 'derm_prr': config field 'lr' must be a number, got 'abc'"
    assert export(tmp_path, "--set", "lr=abc", "--traceback") == 2  # also after the command
    assert "Traceback" in capsys.readouterr().err
    monkeypatch.setenv("PRRFL_TRACEBACK", "1")
    assert export(tmp_path, "--set", "lr=abc") == 2
    assert "Traceback" in capsys.readouterr().err


def test_a_sweep_checks_every_run_before_writing_or_running_any(tmp_path):
    commands: list[list[str]] = []

    def runner(command: list[str], log: Path) -> int:
        commands.append(command)
        return 0

    with pytest.raises(ConfigError, match=r"job 'derm_fedavg': unknown method 'fedavg' option\(s\) \['det_enabled'\]"):
        sweep(["prr", "fedavg"], [0], tmp_path / "sweep", overrides=["method_args.det_enabled=false"], runner=runner)
    assert commands == [] and not (tmp_path / "sweep").exists()


def test_the_real_exit_status_of_a_bad_export(tmp_path):
    cmd = [sys.executable, "-m", "prrfl.cli", "jobs", "export", "derm_prr", "--out", str(tmp_path / "jobs")]
    proc = subprocess.run([*cmd, "--set", "lr=abc"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2
    assert proc.stderr == "prrfl: error: job 'derm_prr': config field 'lr' must be a number, got 'abc'\n"
    assert not (tmp_path / "jobs").exists()


def test_missing_results_interrupts_and_failed_runs(tmp_path, capsys, monkeypatch):
    assert cli.main(["results", str(tmp_path)]) == 2
    assert one_error_line(capsys.readouterr().err) == f"{tmp_path}: no results.json found"

    def interrupted(args):
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "_results", interrupted)
    assert cli.main(["results", str(tmp_path)]) == 130
    assert capsys.readouterr().err == "prrfl: interrupted\n"
    with pytest.raises(SystemExit) as e:  # argparse refuses a bad option value itself, with status 2
        cli.main(["sweep", "--methods", "prr", "--seeds", "0,x", "--workspace", str(tmp_path)])
    assert e.value.code == 2 and "expected comma-separated integers" in capsys.readouterr().err


def raising(error: BaseException):
    def command() -> int:
        raise error

    return command


def test_which_errors_are_one_line_and_their_status(capsys):
    assert run_command(raising(CommandFailed("run prr_s0 failed; see prr_s0.log"))) == 1
    assert one_error_line(capsys.readouterr().err) == "run prr_s0 failed; see prr_s0.log"
    assert run_command(raising(PermissionError(13, "Permission denied", "/data/site"))) == 2
    assert one_error_line(capsys.readouterr().err) == "/data/site: Permission denied"
    assert run_command(raising(FileExistsError("/data/raw already exists (pass overwrite=True to replace it)"))) == 2
    assert one_error_line(capsys.readouterr().err) == "/data/raw already exists (pass overwrite=True to replace it)"
    assert run_command(raising(KeyError("site C: no upload for the round"))) == 2
    assert one_error_line(capsys.readouterr().err) == "site C: no upload for the round"  # no repr quotes
    assert run_command(raising(ValueError("two\nlines"))) == 2
    assert one_error_line(capsys.readouterr().err) == "two lines"
    with pytest.raises(KeyError):  # a bare missing key is a bug: its traceback stays
        run_command(raising(KeyError("global_params")))
    with pytest.raises(TypeError):
        run_command(raising(TypeError("unsupported operand")))


# ----- raw data: empty input is refused, naming the file ---------------------------------------------------------
def write_csv(path: Path, header: tuple[str, ...], rows: list[dict[str, str]]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = [",".join(header)] + [",".join(row.get(c, "") for c in header) for row in rows]
    path.write_text("\n".join(lines) + "\n")
    return path


def ham_row(image_id: str, dataset: str, dx: str = "nv") -> dict[str, str]:
    return {"lesion_id": f"HAM_{image_id}", "image_id": image_id, "dx": dx, "dataset": dataset}


def test_the_data_cli_refuses_a_header_only_metadata_file(tmp_path, capsys):
    csv_path = write_csv(tmp_path / "raw" / L.ham_csv, HAM_COLUMNS, [])
    argv = ["prepare", "--raw", str(tmp_path / "raw"), "--out", str(tmp_path / "prepared"), "--sites", "A"]
    assert data_cli.main(argv) == 2
    assert one_error_line(capsys.readouterr().err) == f"{csv_path}: no rows after the header"
    assert not (tmp_path / "prepared").exists()
    csv_path.write_text("")
    assert data_cli.main(argv) == 2
    assert one_error_line(capsys.readouterr().err).startswith(f"{csv_path}: empty file")
    assert data_cli.main(["--traceback", *argv]) == 2
    assert "Traceback (most recent call last)" in capsys.readouterr().err


def test_header_only_isic_and_author_split_files_are_refused(tmp_path):
    isic_csv = write_csv(tmp_path / L.isic_dir / L.isic_csv, ISIC_COLUMNS, [])
    with pytest.raises(ValueError, match=f"{isic_csv}: no rows after the header"):
        read_isic2017(tmp_path)
    split = write_csv(tmp_path / "splits" / "clientA" / "train_clientA.csv", ("image_id", "label"), [])
    with pytest.raises(ValueError, match=f"{split}: no rows after the header"):
        read_author_split_file(split, "A")


def test_a_cohort_without_images_is_refused_naming_file_and_cohort(tmp_path):
    rows = [ham_row("ISIC_1", "vidir_modern"), ham_row("ISIC_2", "rosendahl", "bcc")]
    csv_path = write_csv(tmp_path / L.ham_csv, HAM_COLUMNS, rows)
    assert len(read_ham10000(tmp_path, ["vidir_modern"])["A"]) == 1
    with pytest.raises(ValueError) as e:  # rosendahl's only row is a diagnosis outside the task
        read_ham10000(tmp_path, ["vidir_modern", "rosendahl"])
    assert str(e.value) == f"{csv_path}: no nv/bkl/mel image of site C (cohort 'rosendahl')"
    isic_row = {"image_id": "ISIC_3", "melanoma": "0", "seborrheic_keratosis": "0"}
    write_csv(tmp_path / L.isic_dir / L.isic_csv, ISIC_COLUMNS, [isic_row])
    ids = tmp_path / L.isic_dir / L.msk_ids
    ids.write_text("ISIC_4\n")
    with pytest.raises(ValueError, match=f"no image of site D .* is listed in {ids}"):
        read_isic2017(tmp_path)


def test_author_splits_without_a_training_image_in_the_raw_data_are_refused(tmp_path):
    raw = tmp_path / "raw"
    write_csv(raw / L.ham_csv, HAM_COLUMNS, [ham_row(f"ISIC_{i}", "vidir_modern") for i in range(3)])
    splits = tmp_path / "splits" / "clientA"
    train = write_csv(splits / "train_clientA.csv", ("image_id", "label"), [{"image_id": "ISIC_99", "label": "0"}])
    write_csv(splits / "valid_clientA.csv", ("image_id", "label"), [{"image_id": "ISIC_1", "label": "0"}])
    write_csv(splits / "test_clientA.csv", ("image_id", "label"), [{"image_id": "ISIC_2", "label": "0"}])
    with pytest.raises(ValueError) as e:
        prepare_dermoscopy(raw, tmp_path / "p", sites=("A",), author_splits_dir=tmp_path / "splits", allow_missing=True)
    assert str(e.value) == f"{train}: no listed image is in the raw data of site A (vidir_modern): nothing to train on"
    assert not (tmp_path / "p" / "manifest.json").exists()


# ----- prepared data: a site with nothing to train on ---------------------------------------------------------
def write_prepared_site(root: Path, site: str, counts: dict[str, int], size: int = 16) -> None:
    for split, n in counts.items():
        images = np.zeros((n, 3, size, size), np.uint8)
        save_split(root / site / f"{split}.npz", images, np.zeros(n, np.int64), [f"{site}{i}" for i in range(n)], [""] * n)


def test_loading_a_site_without_training_images_names_the_file(tmp_path):
    (tmp_path / "manifest.json").write_text("{}")
    write_prepared_site(tmp_path, "A", {"train": 0, "valid": 2, "test": 2})
    write_prepared_site(tmp_path, "OOD", {"train": 0, "valid": 0, "test": 3})
    task = DermTask({"image_size": 16})
    with pytest.raises(ValueError) as e:
        task.load_site("A", torch.device("cpu"), str(tmp_path))
    assert str(e.value) == f"{tmp_path / 'A' / 'train.npz'} holds no image: site A has nothing to train on"
    ood = task.load_site("OOD", torch.device("cpu"), str(tmp_path))  # test-only: empty train and valid are fine
    assert (len(ood.train), len(ood.valid), len(ood.test)) == (0, 0, 3)


def test_ctrl_c_that_ends_the_simulator_is_an_interruption_with_the_line_to_resume(tmp_path, capsys, monkeypatch):
    """Ctrl-C during `prrfl run` on SimEnv: FLARE's SimEnv reports the killed simulator as a RuntimeError ("Simulation
    failed with return code -9"); prrfl says it was interrupted and how to go on, with status 130."""
    import os
    import signal

    from prrfl.flare.job_recipe import PersonalizedRecipe

    def ctrl_c_then_failure(self, env, **kwargs):
        os.kill(os.getpid(), signal.SIGINT)  # what the terminal sends; Python raises KeyboardInterrupt here ...
        raise RuntimeError("Simulation failed with return code -9")  # ... which FLARE's SimEnv turns into this

    def caught_by_flare(self, env, **kwargs):
        try:
            ctrl_c_then_failure(self, env)
        except KeyboardInterrupt:
            raise RuntimeError("Simulation failed with return code -9") from None

    monkeypatch.setattr(PersonalizedRecipe, "run", caught_by_flare)
    assert cli.main(["run", "derm_prr", "--workspace", str(tmp_path)]) == 130
    err = capsys.readouterr().err
    assert err == "prrfl: interrupted; run the same command with --resume auto to continue from the last completed round\n", err

    def plain_failure(self, env, **kwargs):
        raise RuntimeError("Simulation failed with return code 1")

    monkeypatch.setattr(PersonalizedRecipe, "run", plain_failure)
    assert cli.main(["run", "derm_prr", "--workspace", str(tmp_path)]) == 1
    assert "job derm_prr: Simulation failed with return code 1" in capsys.readouterr().err
