"""Experiment tracking a person can read: one run per site named by its site label, and one federation run.

The sites stream their scalars to the server (FLARE's Client API SummaryWriter + ConvertToFedEvent); the
server's receiver writes them. Without help FLARE names each run after the FLARE client ("site-1"), which
says nothing about the hospital. Here:

* a site's run is its site label, `<client>_<cohort>` (e.g. `site-2_B`: prrfl.naming, the name the results
  tables, the cross-site matrices and the reports give the site too), the cohort being what the site reported when
  it prepared its data; the workflow publishes the mapping (`publish_cohorts`) before any site trains;
* the server's own scalars (mean over the sites per round, the number of sites aggregated, the method's
  server-side values such as PFA's r) go to the run `federation`. They use the sites' tag names where
  they are the same quantity (`test/f1` is a site's test F1 in a site's run and the sites' mean in the
  federation run), so TensorBoard draws the mean in the same chart as the sites.

Two backends, both FLARE receivers: TensorBoard (`TensorBoardReceiver`, the default) and MLflow
(`prrfl.flare.mlflow_tracking.MLflowRunReceiver`, chosen with `tracking="mlflow"` when the job is built).
"""

from __future__ import annotations

import itertools
import os
import socket
import time
from typing import Any

from nvflare.apis.analytix import ANALYTIC_EVENT_TYPE, AnalyticsDataType
from nvflare.apis.fl_component import FLComponent
from nvflare.apis.fl_context import FLContext
from nvflare.apis.shareable import Shareable
from nvflare.apis.utils.analytix_utils import create_analytic_dxo, send_analytic_dxo
from nvflare.app_common.utils.file_utils import resolve_path_under_root
from nvflare.app_opt.tracking.tb.tb_event_writer import TensorBoardEventWriter
from nvflare.app_opt.tracking.tb.tb_receiver import TBAnalyticsReceiver
from tensorboard.compat.proto.event_pb2 import Event
from tensorboard.summary.writer.record_writer import RecordWriter

from prrfl.flare.run_names import COHORTS_PROP, EVENTS, FEDERATION_RUN, RUN_ID_PROP, cohorts_of, is_from_server, run_name

TRACKING = ("tensorboard", "mlflow")
RECEIVER_ID = "receiver"  # the receiver's id in every prrfl job (prrfl.flare.job_recipe)


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


_EVENT_FILES = itertools.count()


class EventFile:
    """A TensorBoard event file that writes each event at once, in the caller's thread, through one open file.
    (TensorBoard's own writer writes later, in a thread of its own, reopening the file by name each time: when
    the folder has been removed meanwhile, that thread dies with a traceback and every later event fails.)"""

    def __init__(self, log_dir: str):
        os.makedirs(log_dir, exist_ok=True)
        name = f"events.out.tfevents.{int(time.time()):010d}.{socket.gethostname()}.{os.getpid()}.{next(_EVENT_FILES)}"
        self._file = open(os.path.join(log_dir, name), "wb")  # open for the writer's lifetime
        self._records = RecordWriter(self._file)
        self.add_event(Event(wall_time=time.time(), file_version="brain.Event:2"))

    def add_event(self, event: Event) -> None:
        self._records.write(event.SerializeToString())
        self._file.flush()

    def removed(self) -> bool:
        """Whether the file was deleted (its folder removed) while open: what is written now is lost."""
        return not self._file.closed and os.fstat(self._file.fileno()).st_nlink == 0

    def flush(self) -> None:
        self._file.flush()

    def close(self) -> None:
        self._file.close()


class EventWriter(TensorBoardEventWriter):
    """FLARE's TensorBoard writer (add_scalar, add_text, add_image) on an `EventFile`."""

    def __init__(self, log_dir: str):  # FLARE's __init__ would start TensorBoard's threaded writer
        self.log_dir = log_dir
        self.writer = EventFile(log_dir)
        self.scalar_writers = {}


class TensorBoardReceiver(TBAnalyticsReceiver):
    """FLARE's TensorBoard receiver with readable run names: the site label `<client>_<cohort>` per site, `federation` for
    the server. Event files: <server run dir>/tb_events/<run name>/.

    Each event is written when it arrives, to an event file kept open (`EventWriter`). When the files are deleted
    meanwhile (a second `nvflare simulator` on the same workspace empties it), the receiver says so once and writes
    no more events, instead of failing on every event; `lost()` tells the workflow, which ends the job with an
    error naming the loss."""

    def __init__(self, tb_folder: str = "tb_events", events: list[str] | None = None):
        super().__init__(tb_folder=tb_folder, events=events or EVENTS)
        self._stopped = False

    def lost(self) -> bool:
        """Whether event files this job wrote were deleted while it ran."""
        return self._stopped or any(isinstance(w.writer, EventFile) and w.writer.removed() for w in list(self.writers_table.values()))

    def save(self, fl_ctx: FLContext, shareable: Shareable, record_origin: str) -> None:
        if self._stopped:
            return
        if self.lost():
            self._stop(fl_ctx, f"{self.root_log_dir} was emptied while the job ran: the TensorBoard events written there are lost")
            return
        try:
            if record_origin not in self.writers_table:
                folder = resolve_path_under_root(self.root_log_dir, record_origin, "record_origin")
                self.writers_table[record_origin] = EventWriter(folder)
            super().save(fl_ctx, shareable, record_origin)
        except OSError as e:
            self._stop(fl_ctx, f"cannot write TensorBoard events into {self.root_log_dir}: {e}")

    def _stop(self, fl_ctx: FLContext, why: str) -> None:
        """One error line; no more events."""
        self._stopped = True
        for writer in self.writers_table.values():
            try:
                writer.close()  # the file, open in a removed folder: nothing is kept
            except OSError:
                pass
        self.writers_table = {}
        self.log_error(fl_ctx, f"{why}; no more events are written there", fire_event=False)

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
