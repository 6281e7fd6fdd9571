"""MLflow tracking without a run: the config as params, the run names, where the default store goes
(the runs themselves: tests/test_e2e_simulator.py)."""

from __future__ import annotations

import dataclasses
import inspect
import json
from types import SimpleNamespace

from conftest import tiny_derm_config
from mlflow.utils.validation import MAX_ENTITY_KEY_LENGTH, MAX_PARAM_VAL_LENGTH

from prrfl.flare.mlflow_tracking import MLflowRunReceiver, flatten, mlflow_params, workflow_config
from prrfl.methods.fedavg import FedProx


def test_the_config_becomes_flat_params_within_mlflows_limits():
    assert flatten({"a": 1, "b": {"c": {"d": None}, "e": []}, "f": {}}) == {"a": 1, "b.c.d": None, "b.e": [], "f": {}}
    params = mlflow_params(tiny_derm_config(method_args={"det_enabled": False, "det_split": "train"}).to_dict())
    assert params["method_args.det_enabled"] == "false" and params["method_args.det_split"] == "train"
    assert (params["run_name"], params["num_rounds"], params["lr"], params["update_norm_max"]) == ("derm_prr", "2", "0.01", "null")
    assert params["data.synthetic_raw_size"] == "[96, 72]" and params["min_sites"] == "majority"
    assert mlflow_params(tiny_derm_config().to_dict())["method_args"] == "{}"  # nothing set: the method's defaults
    long = mlflow_params({"k" * 300: "v" * 7000})
    ((key, value),) = long.items()
    assert len(key) == MAX_ENTITY_KEY_LENGTH and len(value) == MAX_PARAM_VAL_LENGTH and value.endswith("...")


def context(root, job_id: str, workflow=None) -> SimpleNamespace:
    """The parts of a server FLContext the receiver reads: the workspace, the job id and the workflow."""
    engine = SimpleNamespace(
        get_workspace=lambda: SimpleNamespace(get_root_dir=lambda: str(root)),
        get_component=lambda cid: workflow if cid == "workflow" else None,
    )
    return SimpleNamespace(get_engine=lambda: engine, get_job_id=lambda: job_id)


def test_the_default_store_is_kept_where_a_rerun_does_not_delete_it(tmp_path):
    receiver = MLflowRunReceiver(kw_args={"experiment_name": "derm_prr"})
    # simulator: beside the workspace, next to the server's state folders (not in one: a new run moves those aside)
    sim = context(tmp_path / "ws" / "server", "simulate_job")
    assert receiver._get_tracking_uri(sim) == f"sqlite:///{tmp_path / 'ws.state/server/mlflow.db'}"
    assert receiver._get_artifact_location("artifacts", sim) == str(tmp_path / "ws.state/server/mlflow-artifacts")
    # deployment: in the server's workspace, beside prrfl/<run_name>/
    deployed = context(tmp_path / "server", "5f1d0c3a-job")
    assert receiver._get_tracking_uri(deployed) == f"sqlite:///{tmp_path / 'server/prrfl/mlflow.db'}"
    assert (tmp_path / "server/prrfl").is_dir()
    given = MLflowRunReceiver(tracking_uri="http://mlflow:5000", kw_args={"experiment_name": "derm_prr"})
    assert given._get_tracking_uri(deployed) == "http://mlflow:5000"


def test_runs_are_named_by_their_origin_and_the_config_is_the_workflows():
    receiver = MLflowRunReceiver(kw_args={"experiment_name": "derm_prr"})
    # FLARE's name would be "site-1-<job id>-derm_prr-FLARE FL Run"; the site's cohort is added when it is known
    assert receiver._get_run_name({}, "site-1", "1718000000", "derm_prr") == "site-1"
    cfg = tiny_derm_config()
    logged = workflow_config(context("/x", "j", SimpleNamespace(cfg=cfg)))
    mine = ("data", "method_args")
    assert {k: v for k, v in logged.items() if k not in mine} == {k: v for k, v in cfg.to_dict().items() if k not in mine}
    assert workflow_config(context("/x", "j", None)) is None
    # at the run's creation FLARE's id (not the time, as FLARE's receiver); the run's id replaces it once known
    assert receiver._get_job_id_tag(context("/x", "simulate_job")) == "simulate_job"


def test_the_method_options_are_logged_with_the_methods_defaults_filled_in():
    """A job that sets no method option logs what the method runs with (not `method_args: {}`); a set one wins."""
    from prrfl.flare.mlflow_tracking import method_arguments
    from prrfl.methods.prr import PRROptions

    defaults = PRROptions()
    args = method_arguments(tiny_derm_config())
    assert args["det_enabled"] is defaults.det_enabled and args["det_split"] == defaults.det_split
    assert set(args) == {f.name for f in dataclasses.fields(PRROptions)}
    assert method_arguments(tiny_derm_config(method_args={"det_split": "train"}))["det_split"] == "train"
    assert method_arguments(tiny_derm_config(method="fedprox"))["mu"] == inspect.signature(FedProx.__init__).parameters["mu"].default
    params = mlflow_params(workflow_config(context("/x", "j", SimpleNamespace(cfg=tiny_derm_config()))))
    assert params["method_args.det_enabled"] == json.dumps(defaults.det_enabled) and "method_args" not in params


def test_the_data_settings_are_logged_with_the_tasks_defaults_filled_in():
    """A job that sets no data option still logs the image size and scale it trains at (not `data: {}`)."""
    from prrfl.config import RunConfig
    from prrfl.tasks.derm.task import DEFAULT_DATA

    cfg = RunConfig(task="derm", method="prr")
    assert cfg.to_dict()["data"] == {}
    params = mlflow_params(workflow_config(context("/x", "j", SimpleNamespace(cfg=cfg))))
    assert params["data.image_size"] == str(DEFAULT_DATA["image_size"]) and "data.synthetic_scale" in params
    assert "data" not in params


class RecordingClient:
    """The MLflow client calls the receiver makes when a site's first record arrives."""

    def __init__(self):
        self.tags, self.names = {}, {}

    def set_tag(self, run_id, key, value):
        self.tags[key] = value

    def update_run(self, run_id, name):
        self.names[run_id] = name


def test_a_simulator_runs_job_id_tag_becomes_the_runs_id_and_a_deployments_stays_flares(monkeypatch):
    """In FLARE's simulator every job's id is "simulate_job": the MLflow run's job_id tag becomes prrfl's run id as the
    site's first record arrives (with the run's name and cohort); a deployment's job id is FLARE's own and is kept."""
    from nvflare.app_opt.tracking.mlflow.mlflow_receiver import MLflowReceiver

    from prrfl.flare.run_names import COHORTS_PROP, RUN_ID_PROP

    monkeypatch.setattr(MLflowReceiver, "save", lambda self, fl_ctx, shareable, record_origin: None)
    for job_id, expected in (("simulate_job", "0123456789ab"), ("5f0c2a4e-job", None)):
        receiver, client = MLflowRunReceiver(kw_args={"experiment_name": "derm_prr"}), RecordingClient()
        monkeypatch.setattr(receiver, "get_mlflow_client", lambda origin, c=client: c)
        monkeypatch.setattr(receiver, "get_run_id", lambda origin: "mlflow-run-1")
        props = {RUN_ID_PROP: "0123456789ab", COHORTS_PROP: {"site-1": "A"}}
        fl_ctx = SimpleNamespace(get_prop=props.get, get_job_id=lambda j=job_id: j)
        receiver.save(fl_ctx, None, "site-1")
        assert client.tags.get("job_id") == expected, job_id
        assert client.tags["prrfl_run_id"] == "0123456789ab" and client.tags["cohort"] == "A"
        assert client.names == {"mlflow-run-1": "site-1_A"} and client.tags["run_name"] == "site-1_A"
