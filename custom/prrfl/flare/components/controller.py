"""The controller FLARE's FedAvg lacks: every client gets a model of its own.

`PerClientController` is a FLARE `ModelController` whose `send_each` sends one task per client, each with
that client's own model (`send_model(..., targets=[client])`), and waits until every client answered, a
deadline passed, or only clients that are gone are left: FLARE's dead-client report in a deployment, the
end of a client's process in the simulator (`prrfl.flare.liveness.WorkerWatch`, which FLARE's simulator
does not report). A client that failed, did not answer in time or is gone is named in `Answers.missing`
with the reason; the caller decides whether the round can go on.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from nvflare.app_common.abstract.fl_model import FLModel
from nvflare.app_common.workflows.model_controller import ModelController

from prrfl.flare import places
from prrfl.flare.liveness import WorkerWatch, release_lost_workers


@dataclass
class Answers:
    """What came back for one task sent to several clients."""

    results: dict[str, FLModel] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)  # send -> result, per client that answered
    missing: dict[str, str] = field(default_factory=dict)  # client -> why nothing came back


class PerClientController(ModelController):
    """Base of the per-client workflows: `send_each` and the bookkeeping of lost clients.

    `lost` maps a client that missed a round in this job to that round; it is sent its task again but
    not waited for beyond the others until it answers. `release_lost()` (call it when the job ends) ends
    the simulator processes of lost clients, so that a frozen client cannot keep the simulator running.
    """

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("ignore_result_error", True)  # a failed client must not end the job
        super().__init__(*args, **kwargs)
        self.lost: dict[str, int] = {}

    def in_simulator(self) -> bool:
        return places.in_simulator(self.fl_ctx.get_job_id() if self.fl_ctx else None)

    def send_each(self, task_name: str, models: dict[str, FLModel], deadline: float | None, round_idx: int | None) -> Answers:
        """One task per client (each gets its own model). Waits until every client answered, the deadline
        (seconds, None = none) passed, or only clients that FLARE reports dead or that were lost earlier in
        this job are left: those get their task and count if they answer while the others work, but are not
        waited for (unless every client was lost). `round_idx` (None for a task outside the rounds): a client
        that does not answer is recorded as lost in that round."""
        answers = Answers()
        sent = time.time()

        def collect(result: FLModel) -> None:
            client = result.meta["client_name"]
            answers.results[client] = result
            answers.seconds[client] = time.time() - sent

        # the clients waited for: all but those lost earlier, unless every client was lost
        expected = (set(models) - set(self.lost)) or set(models)
        watch = WorkerWatch() if self.in_simulator() else None
        ended: set[str] = set()  # simulator clients whose process ended without an answer
        for client, model in models.items():
            self.send_model(task_name, model, targets=[client], callback=collect)
        while self.get_num_standing_tasks() and not self.abort_signal.triggered:
            if watch is not None:
                ended = watch.gone(set(models) - set(answers.results))
            waiting = {c for c in expected - set(answers.results) - ended if not self.get_client_disconnect_time(c)}
            if not waiting or (deadline is not None and time.time() - sent > deadline):
                break
            time.sleep(0.2)
        if self.get_num_standing_tasks():
            self.cancel_all_tasks()  # late results are dropped by FLARE
        elapsed = time.time() - sent
        for client in sorted(set(models) - set(answers.results)):
            if client in ended:
                answers.missing[client] = "its simulator process ended without an answer (killed or crashed)"
            elif self.get_client_disconnect_time(client):
                answers.missing[client] = "FLARE reports it disconnected (its job process or its heartbeat is gone)"
            elif client in self.lost:
                answers.missing[client] = f"silent since round {self.lost[client]}, not waited for beyond the others"
            else:
                answers.missing[client] = f"no result within the deadline ({elapsed:.0f} s)"
            if round_idx is not None:
                self.lost.setdefault(client, round_idx)
        for client in answers.results:
            if self.lost.pop(client, None) is not None:
                self.info(f"{client} answers again")
        return answers

    def release_lost(self) -> None:
        """At the job's end, in the simulator: end the processes of the clients lost during the job."""
        if self.in_simulator() and self.lost:
            for line in release_lost_workers(self.lost):
                self.warning(line)
