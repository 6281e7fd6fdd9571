"""The controller FLARE's FedAvg lacks: every client gets a model of its own.

`PerClientController` is a FLARE `ModelController` whose `send_each` sends one task per client, each with
that client's own model (`send_model(..., targets=[client])`), and waits until every client answered, a
deadline passed, or only clients that are gone are left: FLARE's dead-client report in a deployment, the
end of a client's process in the simulator (`prrfl.flare.liveness.WorkerWatch`, which FLARE's simulator
does not report). A client that failed (its task ended with an error code: the script raised, the task
was aborted), did not answer in time or is gone is named in `Answers.missing` with the reason; the caller
decides whether the round can go on.

Its rounds fire FLARE's round events as FLARE's `FedAvg` fires them (`round_started`, `before_aggregation`,
`after_aggregation`, `round_done`), with `AppConstants.CURRENT_ROUND` and `NUM_ROUNDS` in the context, so
FLARE widgets that listen for them work with the per-client controllers too. The aggregation result of
`AFTER_AGGREGATION` is the round's outputs, client -> FLModel.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from nvflare.apis.controller_spec import ClientTask
from nvflare.apis.fl_constant import ReturnCode
from nvflare.apis.fl_context import FLContext
from nvflare.apis.shareable import Shareable
from nvflare.app_common.abstract.fl_model import FLModel
from nvflare.app_common.app_constant import AppConstants
from nvflare.app_common.app_event_type import AppEventType
from nvflare.app_common.workflows.model_controller import ModelController

from prrfl.flare import places
from prrfl.flare.console import quiet_flare_console
from prrfl.flare.liveness import WorkerWatch, end_simulator_with_its_command, release_lost_workers
from prrfl.progress import time_left

RESEND_LIMIT = 5  # a client that fetches the same task this many times without answering cannot read it

UNREADABLE = (
    "asked for its task {count} times without taking it: its Client API cannot read the model the server sent "
    "(torch tensors). Give the clients' ScriptRunner server_expected_format=ExchangeFormat.PYTORCH "
    "(nvflare.client.config), as the components exchange torch tensors"
)


@dataclass
class Answers:
    """What came back for one task sent to several clients."""

    results: dict[str, FLModel] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)  # send -> result, per client that answered
    missing: dict[str, str] = field(default_factory=dict)  # client -> why nothing came back
    unreadable: list[str] = field(default_factory=list)  # clients that cannot read what was sent: the job cannot go on


class PerClientController(ModelController):
    """The one round loop of every per-client workflow (`run_rounds`): `send_each`, FLARE's round events, the
    bookkeeping of lost and failed clients. A workflow fills in what its rounds send and how it aggregates
    (`round_clients`, `round_models`, `round_deadline`, `aggregate_round`, `end_round`): `PersonalizedFedAvg`
    with a per-client aggregator, prrfl's own workflow with its method, its saved state and its tracking.

    `lost` maps a client that missed a round in this job to that round; it is sent its task again but
    not waited for beyond the others until it answers. `release_lost()` (call it when the job ends) ends
    the simulator processes of lost clients, so that a frozen client cannot keep the simulator running.
    """

    client_noun = "clients"  # what the round's log line calls them

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("ignore_result_error", True)  # a failed client must not end the job
        super().__init__(*args, **kwargs)
        quiet_flare_console()  # FLARE's INFO plumbing off the server's console (PRRFL_FLARE_LOG=full keeps it)
        self.lost: dict[str, int] = {}
        self._orphan_watch = None  # the thread that ends the simulator when its command is gone
        self.failed: dict[str, str] = {}  # client -> the error code its task of the current send_each ended with
        self.sends: dict[str, int] = {}  # client -> times its task of the current send_each was fetched

    # ----- the round loop ------------------------------------------------------------------------------
    def run_rounds(self, first: int, num_rounds: int, task_name: str) -> bool:
        """Rounds `first` .. num_rounds - 1: each sends every client of `round_clients` its model of
        `round_models`, waits (`send_each`, `round_deadline`), aggregates the answers (`aggregate_round`) and
        ends the round (`end_round`), firing FLARE's round events around them. A client that cannot read its
        task stops the job (one error naming the fix). False when the job stopped (aborted, or a hook said so).
        In FLARE's simulator, the job ends when the command that started it is gone (kill -9 of `nvflare
        simulator`): this process and the sites' end within seconds rather than run on headless."""
        if not self._orphan_watch and places.in_simulator(self.fl_ctx.get_job_id() if self.fl_ctx else None):
            self._orphan_watch = end_simulator_with_its_command()
        started = time.monotonic()
        for round_idx in range(first, num_rounds):
            if self.abort_signal.triggered:
                return False
            clients = self.round_clients(round_idx)
            self.round_started(round_idx, num_rounds)
            deadline = self.round_deadline(round_idx)
            left = time_left(time.monotonic() - started, round_idx - first, num_rounds - first)  # this job's rounds so far
            self.info(
                f"round {round_idx} (rounds 0-{num_rounds - 1}): sending each of {len(clients)} {self.client_noun} its own model"
                f"{self.deadline_note(round_idx, deadline)}{f'; {left}' if left else ''}"
            )
            answers = self.send_each(task_name, self.round_models(clients, round_idx), deadline, round_idx)
            if self.abort_signal.triggered:
                return False
            if answers.unreadable:
                client = answers.unreadable[0]
                self.panic(f"round {round_idx}: {client} {answers.missing[client]}; the job stops")
                return False
            self.before_aggregation()
            outputs = self.aggregate_round(round_idx, clients, answers)
            if outputs is None:
                return False
            self.after_aggregation(outputs)
            if not self.end_round(round_idx, outputs):
                return False
            self.round_done()
        return True

    def round_clients(self, round_idx: int) -> list[str]:
        """The clients asked in round `round_idx`."""
        raise NotImplementedError

    def round_models(self, clients: list[str], round_idx: int) -> dict[str, FLModel]:
        """client -> the model (task) it is sent in round `round_idx`."""
        raise NotImplementedError

    def round_deadline(self, round_idx: int) -> float | None:
        """Seconds the round waits for answers (None: until every client answered or is gone)."""
        return None

    def deadline_note(self, round_idx: int, deadline: float | None) -> str:
        """What the round's log line says of its deadline (nothing by default)."""
        return ""

    def aggregate_round(self, round_idx: int, clients: list[str], answers: Answers) -> dict[str, FLModel] | None:
        """The round's outputs, client -> FLModel (FLARE's AGGREGATION_RESULT), from its answers; None when the
        job cannot go on (after saying why)."""
        raise NotImplementedError

    def end_round(self, round_idx: int, outputs: dict[str, FLModel]) -> bool:
        """What follows the aggregation (keep the outputs, save, log); False when the job cannot go on."""
        return True

    # ----- FLARE's round events, as its FedAvg fires them -----------------------------------------------
    def round_started(self, round_idx: int, num_rounds: int) -> None:
        self.fl_ctx.set_prop(AppConstants.NUM_ROUNDS, num_rounds, private=True, sticky=False)
        self.fl_ctx.set_prop(AppConstants.CURRENT_ROUND, round_idx, private=True, sticky=False)
        self.event(AppEventType.ROUND_STARTED)

    def before_aggregation(self) -> None:
        self.event(AppEventType.BEFORE_AGGREGATION)

    def after_aggregation(self, outputs: dict[str, Any]) -> None:
        self.fire_event_with_data(AppEventType.AFTER_AGGREGATION, self.fl_ctx, AppConstants.AGGREGATION_RESULT, outputs)

    def round_done(self) -> None:
        self.event(AppEventType.ROUND_DONE)

    def _prepare_task_data(self, client_task: ClientTask, fl_ctx: FLContext) -> None:
        """Called by FLARE each time a client fetches its task (nvflare 2.9's ModelController): counts the fetches.
        A Client API that cannot decode the task (a ScriptRunner left at the NUMPY exchange format receiving torch
        tensors) fetches it again and again, and the round would wait for ever."""
        self.sends[client_task.client.name] = client_task.task_send_count + 1
        super()._prepare_task_data(client_task, fl_ctx)

    def _accept_train_result(self, client_name: str, result: Shareable, fl_ctx: FLContext, is_unknown_task: bool = False) -> bool:
        """FLARE's check of a result's return code (nvflare 2.9's ModelController), recording why a client's
        task failed, so that the round names the real reason rather than a deadline."""
        rc = result.get_return_code()
        if rc not in (None, ReturnCode.OK) and not is_unknown_task:
            self.failed[client_name] = str(rc)
        return super()._accept_train_result(client_name, result, fl_ctx, is_unknown_task)

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
        self.failed, self.sends = {}, {}

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
                ended = watch.gone(set(models) - set(answers.results), slowest_answer=max(answers.seconds.values(), default=None))
            waiting = {c for c in expected - set(answers.results) - ended - set(self.failed) if not self.get_client_disconnect_time(c)}
            answers.unreadable = sorted(c for c, n in self.sends.items() if n >= RESEND_LIMIT and c not in answers.results)
            if not waiting or answers.unreadable or (deadline is not None and time.time() - sent > deadline):
                break
            time.sleep(0.2)
        if self.get_num_standing_tasks():
            self.cancel_all_tasks()  # late results are dropped by FLARE
        elapsed = time.time() - sent
        for client in sorted(set(models) - set(answers.results)):
            answers.missing[client] = self.missing_reason(client, answers, ended, elapsed, seen=watch.seen if watch else set())
            if round_idx is not None:
                self.lost.setdefault(client, round_idx)
        for client in answers.results:
            if self.lost.pop(client, None) is not None:
                self.info(f"{client} answers again")
        return answers

    def missing_reason(self, client: str, answers: Answers, ended: set[str], elapsed: float, seen: set[str] = frozenset()) -> str:
        """Why nothing came back from `client`, the root cause first (`seen`: the simulator clients whose
        process was seen during the task)."""
        if client in answers.unreadable:
            return UNREADABLE.format(count=self.sends[client])
        if client in ended and client not in seen:
            return "its simulator process never ran the task (it ended before, e.g. unable to connect at start; its log says why)"
        if client in ended:  # the root cause, when a killed process's task is also reported failed
            return "its simulator process ended without an answer (killed or crashed)"
        if client in self.failed:
            return f"its task failed ({self.failed[client]}); that client's log says why"
        if self.get_client_disconnect_time(client):
            return "FLARE reports it disconnected (its job process or its heartbeat is gone)"
        if client in self.lost:
            return f"silent since round {self.lost[client]}, not waited for beyond the others"
        return f"no result within the deadline ({elapsed:.0f} s)"

    def release_lost(self) -> None:
        """At the job's end, in the simulator: end the processes of the clients lost during the job."""
        if self.in_simulator() and self.lost:
            for line in release_lost_workers(self.lost):
                self.warning(line)
