"""MLflow as the tracking backend, through FLARE's MLflowReceiver (imported only when a job asks for it).

FLARE's receiver makes one MLflow run per client when the job starts, before the sites report their
cohorts; this one adds the `federation` run for the server's own scalars and renames each site's run to
carry its cohort (and tags it `cohort`) once the workflow has published the mapping (prrfl.flare.tracking).
`tracking_uri`: any MLflow tracking URI (a server, or a local store such as file:///path/mlruns); FLARE's
default when none is given is an SQLite file in the job's result folder.
"""

from __future__ import annotations

from typing import Any

from nvflare.apis.fl_context import FLContext
from nvflare.apis.shareable import Shareable
from nvflare.app_opt.tracking.mlflow.mlflow_receiver import MLflowReceiver

from prrfl.flare.tracking import EVENTS, FEDERATION_RUN, cohorts_of, is_from_server, run_name


class MLflowRunReceiver(MLflowReceiver):
    def __init__(self, tracking_uri: str | None = None, kw_args: dict[str, Any] | None = None, events: list[str] | None = None):
        super().__init__(tracking_uri=tracking_uri, kw_args=kw_args, events=events or EVENTS)
        self._named: set[str] = set()  # sites whose run already carries the cohort

    def initialize(self, fl_ctx: FLContext) -> None:
        super().initialize(fl_ctx)
        art_full_path = self._get_artifact_location(self.artifact_location, fl_ctx)
        experiment = self.kw_args.get("experiment_name", "FLARE FL Experiment")
        self._mlflow_setup(art_full_path, experiment, self._get_tags("experiment_tags", self.kw_args), [FEDERATION_RUN], fl_ctx)
        self._init_buffer([FEDERATION_RUN])

    def _get_record_origin(self, fl_ctx: FLContext, data: Shareable) -> str | None:
        return FEDERATION_RUN if is_from_server(fl_ctx) else super()._get_record_origin(fl_ctx, data)

    def save(self, fl_ctx: FLContext, shareable: Shareable, record_origin: str) -> None:
        if record_origin not in self._named:
            cohort = cohorts_of(fl_ctx).get(record_origin)
            client, run_id = self.get_mlflow_client(record_origin), self.get_run_id(record_origin)
            if cohort and client and run_id:
                name = client.get_run(run_id).info.run_name
                client.update_run(run_id, name=name.replace(record_origin, run_name(record_origin, {record_origin: cohort}), 1))
                client.set_tag(run_id, "cohort", cohort)
                self._named.add(record_origin)
        super().save(fl_ctx, shareable, record_origin)
