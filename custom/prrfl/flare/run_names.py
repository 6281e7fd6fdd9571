"""What both tracking backends (prrfl.flare.tracking, prrfl.flare.mlflow_tracking) share: the names of
the runs and the events their receivers take."""

from __future__ import annotations

from nvflare.apis.analytix import ANALYTIC_EVENT_TYPE
from nvflare.apis.fl_constant import EventScope, FLContextKey
from nvflare.apis.fl_context import FLContext

from prrfl.naming import site_label

FEDERATION_RUN = "federation"
COHORTS_PROP = "prrfl.cohorts"  # sticky FLContext property: FLARE client name -> cohort
RUN_ID_PROP = "prrfl.run_id"  # sticky FLContext property: the run's id
# the server's own scalars are local events; the sites' arrive as federated events
EVENTS = [ANALYTIC_EVENT_TYPE, "fed." + ANALYTIC_EVENT_TYPE]


def run_name(origin: str, cohorts: dict[str, str] | None) -> str:
    """The run of the FLARE client `origin`: its site label (prrfl.naming: `site-2_B`), the client name while its
    cohort is not known."""
    return site_label(origin, (cohorts or {}).get(origin))


def is_from_server(fl_ctx: FLContext) -> bool:
    """A local event on the server: the workflow's own scalars (the sites' arrive with federation scope)."""
    return fl_ctx.get_prop(FLContextKey.EVENT_SCOPE) != EventScope.FEDERATION


def cohorts_of(fl_ctx: FLContext) -> dict[str, str]:
    return fl_ctx.get_prop(COHORTS_PROP) or {}
