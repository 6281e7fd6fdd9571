"""MLflow as the tracking backend, through FLARE's MLflowReceiver (imported only when a job asks for it).

Run names: FLARE names a site's run `<client>-<job id>-<job name>-FLARE FL Run` and tags it `run_name` with
that string. Here the runs are named as in TensorBoard (prrfl.flare.tracking), since the job is already the
experiment and its id the `job_id` tag: `federation` for the server's own scalars (a run added here), the
FLARE client for a site until the workflow publishes its cohort, then its site label `<client>_<cohort>`
(prrfl.naming; tagged `cohort`).
The `run_name` tag is renamed with the run, so it always equals the name the UI shows (`mlflow.runName`).

Params: every run carries the run's config (`mlflow_params`), read from the job's workflow when the job
starts, so a hand-edited job folder logs the config it actually runs; its `data` settings are those the task
uses and its `method_args` those the method runs with, their defaults filled in (image size, scale, seeds; DET's
and CPA's settings), not only the ones the job sets.

Tags: `prrfl_run_id` is the run's id (results.json, the server log), set once the workflow has started or
resumed the run. `job_id` is FLARE's id of the job in a deployment; in the simulator, where every job is
"simulate_job" (FLARE's own receiver puts the time there), it becomes the run's id as soon as that is known, so
that runs of one simulator workspace are told apart by the same id as their results.

Store: `tracking_uri` when given (a tracking server, or a local store such as file:///path/mlruns). Otherwise
an SQLite file `mlflow.db` where a re-run does not delete it (FLARE's default, the job's result folder, is
wiped by the next simulator run): beside the simulator workspace, `<ws>.state/server/mlflow.db`, or in a
deployed server's workspace, `<server workspace>/prrfl/mlflow.db` (prrfl.flare.places). One store serves
every job run there, an experiment per job; it is not inside a run's own state folder (`.../<run_name>/`),
which a new run moves aside while this store is open. The server log names the store.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from mlflow.entities import Param
from mlflow.utils.validation import MAX_ENTITY_KEY_LENGTH, MAX_PARAM_VAL_LENGTH, MAX_PARAMS_TAGS_PER_BATCH
from nvflare.apis.fl_context import FLContext
from nvflare.apis.shareable import Shareable
from nvflare.app_opt.tracking.mlflow.mlflow_receiver import MLflowReceiver

from prrfl.config import RunConfig
from prrfl.flare import places
from prrfl.flare.run_names import EVENTS, FEDERATION_RUN, RUN_ID_PROP, cohorts_of, is_from_server, run_name
from prrfl.registry import build_task, method_class

STORE_FILE = "mlflow.db"
ARTIFACTS_DIR = "mlflow-artifacts"  # beside the default store
WORKFLOW_ID = "workflow"  # the component id of the workflow in every prrfl job (prrfl.flare.job_recipe)
RUN_NAME_TAG = "run_name"  # FLARE's tag holding the run's name
SIMULATOR_JOB_ID = "simulate_job"  # FLARE's simulator gives every job this id


def flatten(values: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested dicts as dotted keys ({"method_args": {"det_enabled": True}} -> {"method_args.det_enabled": True}).
    An empty dict stays a key of its own: the param then says that nothing was set (the defaults apply)."""
    flat: dict[str, Any] = {}
    for key, value in values.items():
        if isinstance(value, dict) and value:
            flat.update(flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def clip(text: str, limit: int) -> str:
    """`text` cut to `limit` characters, marked with '...' where it was cut (MLflow rejects longer keys and values)."""
    return text if len(text) <= limit else text[: limit - 3] + "..."


def mlflow_params(config: dict[str, Any]) -> dict[str, str]:
    """A run's config as MLflow params: flattened keys; values as `--set KEY=VALUE` takes them (a string as it
    is, anything else as JSON: true, null, [96, 72]); keys and values within MLflow's length limits."""
    return {
        clip(key, MAX_ENTITY_KEY_LENGTH): clip(value if isinstance(value, str) else json.dumps(value), MAX_PARAM_VAL_LENGTH)
        for key, value in flatten(config).items()
    }


def method_arguments(cfg: RunConfig) -> dict[str, Any]:
    """The options the run's method runs with: its constructor's defaults (`Method.option_parameters`), the job's
    `method_args` over them."""
    defaults = {name: p.default for name, p in method_class(cfg.method).option_parameters().items() if p.default is not p.empty}
    return {**defaults, **cfg.method_args}


def workflow_config(fl_ctx: FLContext) -> dict[str, Any] | None:
    """The validated config of the job's workflow, its data settings as the task resolves them and its method's
    options as the method runs with them (defaults included); None in a job without a prrfl workflow."""
    cfg = getattr(fl_ctx.get_engine().get_component(WORKFLOW_ID), "cfg", None)
    if not isinstance(cfg, RunConfig):
        return None
    return {**cfg.to_dict(), "method_args": method_arguments(cfg), "data": dict(build_task(cfg).data_cfg)}


class MLflowRunReceiver(MLflowReceiver):
    def __init__(self, tracking_uri: str | None = None, kw_args: dict[str, Any] | None = None, events: list[str] | None = None):
        super().__init__(tracking_uri=tracking_uri, kw_args=kw_args, events=events or EVENTS)
        self._named: set[str] = set()  # sites whose run already carries the cohort
        self._run_tagged: set[str] = set()  # runs that already carry the prrfl run id

    @property
    def experiment(self) -> str:
        return self.kw_args.get("experiment_name", "FLARE FL Experiment")

    def store_dir(self, fl_ctx: FLContext) -> Path:
        """The folder of the default store: the parent of the server's state folder of this job."""
        root = Path(fl_ctx.get_engine().get_workspace().get_root_dir())
        folder = places.default_state_dir(root, "server", self.experiment, fl_ctx.get_job_id()).parent
        folder.mkdir(parents=True, exist_ok=True)
        return folder

    def _get_tracking_uri(self, fl_ctx: FLContext) -> str:
        return self.tracking_uri or f"sqlite:///{self.store_dir(fl_ctx) / STORE_FILE}"

    def _get_artifact_location(self, relative_path: str, fl_ctx: FLContext) -> str:
        """Beside the default store, which outlives the run folder FLARE would put them in."""
        if self.tracking_uri:
            return super()._get_artifact_location(relative_path, fl_ctx)
        return str(self.store_dir(fl_ctx) / ARTIFACTS_DIR)

    def _get_run_name(self, kwargs: dict, site_name: str, job_id_tag: str, job_name: str) -> str:
        return site_name

    def _get_job_id_tag(self, fl_ctx: FLContext) -> str:
        return fl_ctx.get_job_id()

    def initialize(self, fl_ctx: FLContext) -> None:
        super().initialize(fl_ctx)
        art_full_path = self._get_artifact_location(self.artifact_location, fl_ctx)
        self._mlflow_setup(art_full_path, self.experiment, self._get_tags("experiment_tags", self.kw_args), [FEDERATION_RUN], fl_ctx)
        self._init_buffer([FEDERATION_RUN])
        config = workflow_config(fl_ctx)
        if config is None:
            self.log_warning(fl_ctx, f"no prrfl workflow (component '{WORKFLOW_ID}') in this job: its config is not logged as params")
        params = [Param(key, value) for key, value in mlflow_params(config or {}).items()]
        for origin, run_id in self.run_ids.items():
            for start in range(0, len(params), MAX_PARAMS_TAGS_PER_BATCH):
                self.mlflow_clients[origin].log_batch(run_id, params=params[start : start + MAX_PARAMS_TAGS_PER_BATCH])
        self.log_info(
            fl_ctx,
            f"MLflow store {self._get_tracking_uri(fl_ctx)}: experiment '{self.experiment}', runs {sorted(self.run_ids)} "
            f"with {len(params)} params of the run's config",
        )

    def _get_record_origin(self, fl_ctx: FLContext, data: Shareable) -> str | None:
        return FEDERATION_RUN if is_from_server(fl_ctx) else super()._get_record_origin(fl_ctx, data)

    def save(self, fl_ctx: FLContext, shareable: Shareable, record_origin: str) -> None:
        if record_origin not in self._named:
            cohort = cohorts_of(fl_ctx).get(record_origin)
            client, run_id = self.get_mlflow_client(record_origin), self.get_run_id(record_origin)
            if cohort and client and run_id:
                name = run_name(record_origin, {record_origin: cohort})
                client.update_run(run_id, name=name)  # MLflow's own mlflow.runName tag follows
                client.set_tag(run_id, RUN_NAME_TAG, name)
                client.set_tag(run_id, "cohort", cohort)
                self._named.add(record_origin)
        prrfl_run = fl_ctx.get_prop(RUN_ID_PROP)
        if prrfl_run and record_origin not in self._run_tagged:
            client, run_id = self.get_mlflow_client(record_origin), self.get_run_id(record_origin)
            if client and run_id:
                client.set_tag(run_id, "prrfl_run_id", prrfl_run)
                if fl_ctx.get_job_id() == SIMULATOR_JOB_ID:
                    client.set_tag(run_id, "job_id", prrfl_run)
                self._run_tagged.add(record_origin)
        super().save(fl_ctx, shareable, record_origin)
