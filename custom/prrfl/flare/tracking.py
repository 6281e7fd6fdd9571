"""Experiment tracking a person can read: one run per site named by its cohort, and one federation run.

The sites stream their scalars to the server (FLARE's Client API SummaryWriter + ConvertToFedEvent); the
server's receiver writes them. Without help FLARE names each run after the FLARE client ("site-1"), which
says nothing about the hospital. Here:

* a site's run is `<client>_<cohort>` (e.g. `site-2_B`), the cohort being what the site reported when it
  prepared its data; the workflow publishes the mapping (`publish_cohorts`) before any site trains;
* the server's own scalars (mean over the sites per round, the number of sites aggregated, the method's
  server-side values such as PFA's r) go to the run `federation`. They use the sites' tag names where
  they are the same quantity (`test/f1` is a site's test F1 in a site's run and the sites' mean in the
  federation run), so TensorBoard draws the mean in the same chart as the sites.

Two backends, both FLARE receivers: TensorBoard (`TensorBoardReceiver`, the default) and MLflow
(`prrfl.flare.mlflow_tracking.MLflowRunReceiver`, chosen with `tracking="mlflow"` when the job is built).
"""

from __future__ import annotations

from typing import Any

from nvflare.apis.analytix import ANALYTIC_EVENT_TYPE, AnalyticsDataType
from nvflare.apis.fl_component import FLComponent
from nvflare.apis.fl_context import FLContext
from nvflare.apis.utils.analytix_utils import create_analytic_dxo, send_analytic_dxo
from nvflare.app_opt.tracking.tb.tb_receiver import TBAnalyticsReceiver

from prrfl.flare.run_names import COHORTS_PROP, EVENTS, FEDERATION_RUN, RUN_ID_PROP, cohorts_of, is_from_server, run_name

TRACKING = ("tensorboard", "mlflow")


def publish_cohorts(fl_ctx: FLContext, cohorts: dict[str, str], run_id: str | None = None) -> None:
    """Make the client -> cohort mapping, and the run's id, visible to the receivers (every later FLContext of the job)."""
    fl_ctx.set_prop(COHORTS_PROP, dict(cohorts), private=False, sticky=True)
    if run_id:
        fl_ctx.set_prop(RUN_ID_PROP, run_id, private=False, sticky=True)


def send_scalars(component: FLComponent, fl_ctx: FLContext, scalars: dict[str, float], step: int) -> None:
    """The server's scalars, as analytics events its receiver writes to the federation run."""
    for tag, value in scalars.items():
        dxo = create_analytic_dxo(tag=tag, value=float(value), data_type=AnalyticsDataType.SCALAR, global_step=int(step))
        send_analytic_dxo(component, dxo=dxo, fl_ctx=fl_ctx, event_type=ANALYTIC_EVENT_TYPE)


class TensorBoardReceiver(TBAnalyticsReceiver):
    """FLARE's TensorBoard receiver with readable run names: `<client>_<cohort>` per site, `federation` for
    the server. Event files: <server run dir>/tb_events/<run name>/."""

    def __init__(self, tb_folder: str = "tb_events", events: list[str] | None = None):
        super().__init__(tb_folder=tb_folder, events=events or EVENTS)

    def _get_record_origin(self, fl_ctx: FLContext, data: Any) -> str | None:
        if is_from_server(fl_ctx):
            return FEDERATION_RUN
        return run_name(super()._get_record_origin(fl_ctx, data), cohorts_of(fl_ctx))


def receiver(tracking: str = "tensorboard", tracking_uri: str | None = None, experiment: str = "prr-flare") -> FLComponent:
    """The server's receiver for a tracking backend (the MLflow one is imported only when asked for);
    `experiment`: the MLflow experiment the runs go to (the job's run_name)."""
    if tracking == "tensorboard":
        if tracking_uri:
            raise ValueError("tracking_uri is for tracking='mlflow'; TensorBoard writes into the job's run folder")
        return TensorBoardReceiver()
    if tracking == "mlflow":
        from prrfl.flare.mlflow_tracking import MLflowRunReceiver

        return MLflowRunReceiver(tracking_uri=tracking_uri, kw_args={"experiment_name": experiment})
    raise ValueError(f"unknown tracking backend {tracking!r}; available: {list(TRACKING)}")
