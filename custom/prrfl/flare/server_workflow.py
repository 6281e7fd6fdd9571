"""Server workflow: one personalized download per site per round, with persisted state.

Each round the workflow sends every site ITS OWN model (a separate task per site, through
prrfl.flare.components.PerClientController), waits until every site answered or the round's deadline passed
(prrfl.flare.liveness), hands the answers to the round's pure logic (prrfl.server.federation.Federation: upload checks,
the method's aggregation, the next state and a typed round summary), and writes the state atomically, so a re-submitted job
with resume continues from the last completed round. A round goes on without the sites that failed,
did not answer in time or that FLARE reports dead, as long as `min_sites` answered; otherwise the job
stops with the saved state of the last completed round.
"""

from __future__ import annotations

import copy
import logging
from pathlib import Path
from typing import Any

import psutil
from nvflare.app_common.abstract.fl_model import FLModel, ParamsType
from nvflare.app_common.workflows.cross_site_eval import CrossSiteEval
from nvflare.app_opt.pt.decomposers import TensorDecomposer
from nvflare.fuel.f3.mpm import MainProcessMonitor
from nvflare.fuel.utils import fobs
from nvflare.fuel.utils.memory_utils import cleanup_memory

from prrfl.config import ConfigError, RunConfig
from prrfl.flare import places, sim_race
from prrfl.flare import task_protocol as P
from prrfl.flare.components.controller import Answers, PerClientController
from prrfl.flare.cross_site import COMPONENT_ID as CROSS_SITE_ID
from prrfl.flare.liveness import AUTO, Deadline
from prrfl.flare.places import RunLock, WorkspaceBusy, differences
from prrfl.flare.tracking import RECEIVER_ID, TensorBoardReceiver, publish_cohorts, send_scalars
from prrfl.messages import PrepareReply
from prrfl.metrics import nanmean
from prrfl.naming import site_label
from prrfl.registry import build_method, build_task, validate_config
from prrfl.server.checks import summary_problem
from prrfl.server.federation import Event, Federation, RoundAnswers, ServerState, new_run_id
from prrfl.storage import load_torch, save_json, save_text, save_torch, save_torch_keeping_previous, set_aside

STATE_FILE = "server_state.pt"
PREVIOUS_STATE_FILE = "server_state.previous.pt"
GLOBAL_MODEL_FILE = "global_model.pt"  # the method's global model after the last round, when it has one
RESUME_MODES = (False, True, AUTO)


def resume_problem(saved: dict[str, Any], requested: dict[str, Any], next_round: int) -> str | None:
    """The resume rule: the same config, except that num_rounds may grow (to extend a finished run)
    but not fall below the rounds already completed. None when the run may resume, else what differs. A field the
    saved config lacks (added to RunConfig since the run was saved) counts as its default, which is how that run ran."""
    saved = {**RunConfig().to_dict(), **saved}
    fixed_saved, fixed_requested = {**saved, "num_rounds": None}, {**requested, "num_rounds": None}
    if fixed_saved != fixed_requested:
        changed = sorted(k for k in set(saved) | set(requested) if k != "num_rounds" and saved.get(k) != requested.get(k))
        return (
            f"the config differs from the saved run's in {changed} ({'; '.join(differences(fixed_saved, fixed_requested))}); "
            "only num_rounds may change"
        )
    if requested["num_rounds"] < next_round:
        return f"num_rounds={requested['num_rounds']} but {next_round} rounds are already completed"
    return None


def sites_problem(sites: list[str], clients: list[str], cfg: RunConfig) -> str | None:
    """None when enough of a saved run's `sites` (those that prepared their data) are among this job's `clients`
    for its rounds (min_sites), else why not."""
    here = sorted(set(sites) & set(clients))
    try:
        needed = cfg.required_sites(len(sites))
    except ConfigError as e:
        return str(e)
    if len(here) >= needed:
        return None
    return (
        f"its sites {sorted(sites)} are not this job's: {len(here)} of them among its clients {sorted(clients)}, "
        f"fewer than min_sites={cfg.min_sites} ({needed})"
    )


def resume_refusal(path: Path, state: ServerState, cfg: RunConfig, clients: list[str] | None) -> str | None:
    """The one line that refuses to resume the run whose state is saved in `path`, None when this job may resume
    it. The state records its run's identity: the config (run_name, task, method, seed, ...: `resume_problem`)
    and the sites that prepared their data, enough of which must be this job's `clients` (None: not checked)."""
    problem = resume_problem(state.config, cfg.to_dict(), state.next_round)
    problem = problem or (None if clients is None else sites_problem(list(state.site_counts), clients, cfg))
    if problem is None:
        return None
    return f"cannot resume from {path}, the state of run {state.run_id} ('{state.config.get('run_name')}'): {problem}"


class PersonalizedWorkflow(PerClientController):
    """prrfl's own jobs on the per-client controller's round loop (`PerClientController.run_rounds`, the loop
    `PersonalizedFedAvg` runs too), adding only what is prrfl's: the run config checked before any site is asked,
    the sites' `prepare` task, the server's state saved after every round and resumed, the per-round deadline,
    the method's round (prrfl.server.federation) and the run's tracking."""

    client_noun = "sites"

    def __init__(
        self,
        config: dict[str, Any],
        resume: bool | str = False,
        state_dir: str = "",
        task_timeout: float | str = AUTO,
        first_task_timeout: float = 7200.0,
        min_task_timeout: float = 60.0,
        task_timeout_factor: float = 3.0,
        estimate_timeout_factor: float = 5.0,
        memory_gc_rounds: int = 1,
    ):
        """config: a RunConfig as a dict, validated here (a bad job never reaches a site).
        resume: False starts a new run (a saved one of the same run_name is set aside, not overwritten);
        True continues the saved run and fails when there is none; "auto" continues it when there is one,
        else starts a new run with a warning.
        state_dir: where the workflow keeps its state (default: prrfl.flare.places.default_state_dir).
        task_timeout ("auto" or seconds, 0 = none), first_task_timeout, min_task_timeout,
        task_timeout_factor, estimate_timeout_factor: the per-round deadline (prrfl.flare.liveness.Deadline).
        memory_gc_rounds: every this many rounds, FLARE's cleanup_memory (gc.collect + malloc_trim) returns
        freed memory to the system (0: never)."""
        super().__init__(persistor_id="")  # a failed site does not end the job (PerClientController)
        # attributes named like the arguments: FLARE's job export reads them back into the config
        self.config = config
        self.resume = resume
        self.state_dir = state_dir
        self.task_timeout = task_timeout
        self.first_task_timeout = first_task_timeout
        self.min_task_timeout = min_task_timeout
        self.task_timeout_factor = task_timeout_factor
        self.estimate_timeout_factor = estimate_timeout_factor
        self.memory_gc_rounds = memory_gc_rounds
        self._marker: Path | None = None  # the workspace marker of a simulator run (places.mark_workspace)
        self._emptied: str | None = None  # when the job found its simulator workspace emptied ("after round 3")
        self._resumed_at: int | None = None  # the first round of a resumed job: its sites start afresh inside it
        # A bad argument (a hand-edited job folder) is not raised here, where FLARE would bury it in a long traceback
        # about building its components: the job starts, and `run` refuses it in one line naming the file.
        self._refusal: str | None = None
        try:
            if not isinstance(memory_gc_rounds, int) or isinstance(memory_gc_rounds, bool) or memory_gc_rounds < 0:
                raise ValueError(f"workflow argument 'memory_gc_rounds' must be an integer >= 0, got {memory_gc_rounds!r}")
            if resume not in RESUME_MODES or not isinstance(resume, (bool, str)):
                raise ValueError(f"workflow argument 'resume' must be false, true or \"auto\", got {resume!r}")
            self.deadline = Deadline(task_timeout, first_task_timeout, min_task_timeout, task_timeout_factor, estimate_timeout_factor)
            self.cfg = validate_config(config)  # every field and method option, before any site is asked
        except (ValueError, TypeError) as e:  # ConfigError is a ValueError
            self._refusal, self.cfg = str(e), None
        sim_race.install()  # in FLARE's simulator: each site's process gets its own name (prrfl.flare.sim_race)

    @property
    def refusal(self) -> str | None:
        """Why the job's arguments cannot run (one line), or None. The recipe raises it when it builds a job; a job
        folder edited by hand is refused by `run`, in one line naming its file."""
        return self._refusal

    # ----- main loop -------------------------------------------------------------------
    def run(self) -> None:
        """The job under the workspace's lock (prrfl.flare.places.RunLock): taken before any state is read
        or moved, so a second job on the same workspace is refused instead of moving this one's live state
        aside. In the simulator, the processes of sites lost during the job are ended at its end, so that a
        frozen site cannot keep the simulator from exiting (prrfl.flare.liveness.release_lost_workers), and the
        run folder is marked: FLARE's simulator empties the workspace before a second job's lock check, so a job
        that finds its marker gone trains on and ends with an error naming what was lost (`_end_emptied`)."""
        if self._refusal is not None:
            self.panic(f"the job cannot start: {self._config_file()}, component 'workflow': {self._refusal}")
            return
        fobs.register(TensorDecomposer)
        state_dir = self._state_dir()
        job_id = self.fl_ctx.get_job_id() if self.fl_ctx else None
        root = Path(self.engine.get_workspace().get_root_dir())
        lock = RunLock(places.lock_file(root, state_dir, job_id))
        try:
            places.ensure_writable(state_dir, "server", "set the workflow's state_dir argument to a writable folder")
            lock.acquire(run_name=self.cfg.run_name, job_id=job_id, state_dir=str(state_dir))
        except WorkspaceBusy as e:
            if places.in_simulator(job_id):
                ws = root.resolve().parent
                lost = (
                    f". FLARE's simulator empties its workspace before any job code runs, so the running job's files in {ws} "
                    f"(logs, TensorBoard events, FLARE's cross-site results) are gone; its checkpoints and results in "
                    f"{places.simulator_state_root(ws)} are not. `prrfl run` refuses before the simulator starts"
                )
                self.panic(f"the job cannot start: {places.busy_message(f'the simulator workspace {ws}', e.holder)}{lost}")
            else:
                self.panic(f"the job cannot start: {places.busy_message(f'the state folder {state_dir}', e.holder)}")
            return
        except OSError as e:  # ensure_writable names the folder and the setting
            self.panic(f"the job cannot start: {e}")
            return
        if places.in_simulator(job_id):  # marked once the lock is held: a refused job marks nothing
            self._marker = places.mark_workspace(Path(self.get_run_dir()), self.cfg.run_name)
        try:
            self._run(state_dir, lock)
        finally:
            lock.release()
            self.release_lost()

    def _run(self, state_dir: Path, lock: RunLock) -> None:
        cfg = self.cfg
        task = build_task(cfg)
        method = build_method(cfg, task)
        federation = Federation(cfg, task, method)
        clients = sorted(c.name for c in self.engine.get_clients())
        try:  # a job that cannot start says why, in one line, before any site trains
            state = self._load_state(state_dir, clients)
        except (OSError, ValueError, RuntimeError) as e:
            self.panic(f"the job cannot start: {e}")
            return
        self._resumed_at = None if state is None else state.next_round
        if state is None:
            state = self._new_state(federation, clients)
            if state is None:
                return
            try:
                save_torch(state.to_dict(), state_dir / STATE_FILE)
            except OSError as e:
                self.panic(f"the job cannot start: cannot save the server's state: {e}")
                return
        lock.update(run_id=state.run_id)
        # the sites that prepared their data at the run's start and take part in this job
        sites = sorted(set(state.site_counts) & set(clients))
        publish_cohorts(self.fl_ctx, state.cohorts, state.run_id)  # the tracking runs are named by cohort, tagged with the run
        absent = sorted(set(state.site_counts) - set(clients))
        if absent:
            self.warning(f"sites of run {state.run_id} not in this job: {absent}; they keep their last download")
        newcomers = sorted(set(clients) - set(state.site_counts))
        if newcomers:
            self.warning(f"clients of this job that are not sites of run {state.run_id}: {newcomers}; they do not take part in it")
        try:
            cfg.required_sites(len(state.site_counts))
        except ConfigError as e:
            self.panic(f"the job cannot go on: {e}")
            return
        federation.reference()  # built from the run's seed before the first round, as the initial model
        common = {P.CONFIG: cfg.to_dict(), P.RUN_ID: state.run_id, P.NUM_SITES: len(sites), P.GLOBAL_COUNTS: state.global_counts}
        if state.next_round >= cfg.num_rounds:
            self.info(f"run {state.run_id} has completed all {cfg.num_rounds} rounds; nothing to train (raise num_rounds to extend it)")
        self.federation, self.state, self.sites, self.common, self.state_path = federation, state, sites, common, state_dir
        if self.run_rounds(state.next_round, cfg.num_rounds, P.TASK_TRAIN) and self._score_last():
            self._finish(federation, self.state, state_dir)
            self._check_workspace("at the job's end")
            if self._emptied:
                self._end_emptied(state_dir)

    # ----- the hooks of PerClientController.run_rounds ---------------------------------------------------
    def round_clients(self, round_idx: int) -> list[str]:
        return self.sites

    def round_models(self, clients: list[str], round_idx: int) -> dict[str, FLModel]:
        return {s: P.download_to_model(self.state.downloads[s], self.common, round_idx, self.cfg.num_rounds) for s in clients}

    def _resumed_first_round(self, round_idx: int) -> bool:
        """The first round of a resumed job starts every site afresh (a new job process loads its data and state), as a
        new run's `prepare` does, so it gets prepare's deadline."""
        return round_idx == self._resumed_at

    def _deadline_inputs(self, round_idx: int) -> tuple[list[float], list[float]]:
        if self._resumed_first_round(round_idx):
            return [], []
        return self.state.observed_seconds(), list(self.state.round_estimates.values())

    def round_deadline(self, round_idx: int) -> float | None:
        return self.deadline.seconds(*self._deadline_inputs(round_idx))

    def deadline_note(self, round_idx: int, deadline: float | None) -> str:
        if deadline is not None and self._resumed_first_round(round_idx) and self.deadline.timeout == AUTO:
            return f"; deadline {deadline:.0f} s (the first round of a resumed job: the sites start afresh, as at prepare)"
        return f"; deadline {self.deadline.explain(*self._deadline_inputs(round_idx))}"

    def aggregate_round(self, round_idx: int, clients: list[str], answers: Answers) -> dict[str, FLModel] | None:
        """The federation's round (prrfl.server.federation: upload checks, the method's aggregation, the next
        state); None when fewer than min_sites sent a usable upload."""
        outcome = self.federation.round(self.state, round_idx, round_answers(answers))
        self._log(outcome.events)
        if outcome.stop:
            self.panic(
                f"{outcome.stop}. The state after the last completed round is in {self.state_path}: bring the sites back "
                "and re-submit the job with resume"
            )
            return None
        self.outcome = outcome
        return {s: FLModel(params=d.params, meta=d.meta) for s, d in outcome.downloads.items()}

    def end_round(self, round_idx: int, outputs: dict[str, FLModel]) -> bool:
        """The new state saved atomically, memory returned, the round logged and tracked."""
        outcome, task, method = self.outcome, self.federation.task, self.federation.method
        try:
            self._save_state(outcome.state, self.state_path)
        except OSError as e:  # e.g. prrfl.storage.DiskFullError: one line, the last saved round kept
            self.panic(
                f"round {round_idx}: cannot save the server's state: {e}; the state after round {round_idx - 1} is kept in {self.state_path}"
            )
            return False
        self.state = outcome.state
        self._check_workspace(f"after round {round_idx}")
        if self.memory_gc_rounds and (round_idx + 1) % self.memory_gc_rounds == 0:
            cleanup_memory()
        summaries = outcome.summary.summaries
        self._log_round(round_idx, summaries, task.primary_metric, method.eval_role)
        self._track_round(round_idx, summaries, method.server_scalars(outcome.downloads), task.primary_metric)
        return True

    def _check_workspace(self, when: str) -> None:
        """In the simulator: whether the workspace was emptied while the job ran (its marker is gone), said once."""
        if self._marker is None or self._emptied or self._marker.exists():
            return
        self._emptied = when
        self.warning(places.emptied_warning(self._marker.parent, when, places.simulator_state_root(self._workspace())))

    def _workspace(self) -> Path:
        """The simulator's workspace (`-w`): the folder above the server's."""
        return Path(self.engine.get_workspace().get_root_dir()).resolve().parent

    def _end_emptied(self, state_dir: Path) -> None:
        """A simulator job whose workspace was emptied while it ran ends with an error (exit status 2) saying what is
        lost and where what is kept is: FLARE logs it, and it is logged again as the simulator's server process
        ends, after its sites' processes, so that it is the last line. The cross-site evaluation that would follow
        is not run: the abort ends the job after this workflow."""
        receiver = self.engine.get_component(RECEIVER_ID)
        report = places.emptied_report(
            f"run {self.state.run_id} of '{self.cfg.run_name}'",
            self._workspace(),
            self._emptied or "",
            state_dir,
            Path(self.get_run_dir()),
            self.cfg.run_name,
            tensorboard=Path(receiver.root_log_dir) if isinstance(receiver, TensorBoardReceiver) and receiver.lost() else None,
            cross_site=isinstance(self.engine.get_component(CROSS_SITE_ID), CrossSiteEval),
        )
        say_last(self.logger, report)
        self.panic(report)

    def _score_last(self) -> bool:
        """For a method that reports its global model (`Method.reports_download`): each site scores the last round's
        aggregate as it scored every earlier one at its download, and may keep it as its best (TASK_SCORE; no
        training). A site that does not answer keeps the best of the rounds it scored, with a warning. False when
        the job was aborted."""
        if not self.federation.method.reports_download() or not self.state.history:
            return True
        cfg, state, sites = self.cfg, self.state, self.sites
        self.info(f"after the last round ({cfg.num_rounds - 1}): each site scores its global model")
        models = self.round_models(sites, cfg.num_rounds)
        answers = self.send_each(P.TASK_SCORE, models, self.round_deadline(cfg.num_rounds), None)
        if self.abort_signal.triggered:
            return False
        summaries = {}
        for site in sites:
            result = answers.results.get(site)
            meta = {} if result is None else result.meta or {}
            why = answers.missing.get(site) if result is None else meta.get(P.ERROR) or summary_problem(meta.get("summary", {}))
            if why:
                self.warning(f"{site} did not score the last round's global model: {why}; its best is that of the rounds before")
            else:
                summaries[site] = meta.get("summary", {})
        if summaries:
            new = copy.copy(state)
            new.summaries = {**state.summaries, **summaries}
            try:
                self._save_state(new, self.state_path)
            except OSError as e:
                self.warning(f"cannot save the server's state with the last round's scores: {e}; the results below hold them")
            self.state = new
            for step, values in sorted(site_means(summaries, cfg.num_rounds * cfg.local_epochs - 1).items()):
                send_scalars(self, self.fl_ctx, values, step)  # the last aggregate's scores in the federation run
            metric = self.federation.task.primary_metric
            tests = {s: (v.get("last") or {}).get("test", {}) for s, v in sorted(summaries.items())}
            scores = ", ".join(f"{s} {metric}={test[metric]:.1f}" for s, test in tests.items() if metric in test)
            self.info(f"the last round's global model, test at each site: {scores}")
        return True

    def _log(self, events: list[Event]) -> None:
        for level, text in events:
            getattr(self, level)(text)

    # ----- setup -----------------------------------------------------------------------
    def _config_file(self) -> str:
        """This job's server configuration as FLARE deployed it (the file a hand edit changed)."""
        try:
            job_id = self.fl_ctx.get_job_id()
            return str(Path(self.engine.get_workspace().get_app_config_dir(job_id)) / "config_fed_server.json")
        except Exception:  # noqa: BLE001 - only a name for the message
            return "the job's app/config/config_fed_server.json"

    def _state_dir(self) -> Path:
        if self.state_dir:
            return Path(self.state_dir)
        root = Path(self.engine.get_workspace().get_root_dir())
        job_id = self.fl_ctx.get_job_id() if self.fl_ctx else None
        return places.default_state_dir(root, "server", self.cfg.run_name, job_id)

    def _read_state(self, state_dir: Path) -> dict[str, Any] | None:
        """The newest readable saved state; an unreadable one is set aside (kept) and the previous used."""
        current, previous = state_dir / STATE_FILE, state_dir / PREVIOUS_STATE_FILE
        if not current.exists():
            return None
        try:
            return load_torch(current)
        except RuntimeError as e:
            try:
                state = load_torch(previous) if previous.exists() else None
            except RuntimeError:
                state = None
            if state is None:
                raise RuntimeError(
                    f"{e}; {PREVIOUS_STATE_FILE} cannot be read either: restore {state_dir} from a backup or start a new run"
                ) from e
            kept = set_aside(current, "corrupt")
            self.warning(
                f"{e}; kept it as {kept.name} and resuming from {PREVIOUS_STATE_FILE} instead: round "
                f"{state['next_round']} is trained again (sites that had done it redo it from their previous checkpoint)"
            )
            return state

    def _load_state(self, state_dir: Path, clients: list[str] | None = None) -> ServerState | None:
        """The saved state to continue, or None for a new run (resume rules: see __init__). ValueError naming the
        file when it is not a state of a prrfl run, or the state of a run this job cannot continue
        (`resume_refusal`; with this job's `clients`, also checked against the sites of the saved run)."""
        path = state_dir / STATE_FILE
        if not self.resume:
            if path.exists():
                aside = places.set_aside_previous_run(state_dir)
                self.warning(
                    f"{path} holds a saved run of '{self.cfg.run_name}'; starting a new run as asked (resume=false): "
                    f"the old state is kept in {aside} (set resume to continue a saved run instead)"
                )
            return None
        state = self._read_state(state_dir)
        if state is None:
            if self.resume is True:
                raise FileNotFoundError(
                    f"resume=true but there is no saved state of run '{self.cfg.run_name}' in {state_dir}: nothing to "
                    'resume (set resume to "auto" to start a new run when there is none, or state_dir to where it is)'
                )
            self.warning(f"resume=auto: no saved state of run '{self.cfg.run_name}' in {state_dir}; starting a new run")
            return None
        try:
            saved = ServerState.from_dict(state)
        except ValueError as e:
            raise ValueError(f"cannot resume from {path}: {e}") from e
        refusal = resume_refusal(path, saved, self.cfg, clients)
        if refusal:
            raise ValueError(refusal)
        saved.config = self.cfg.to_dict()
        self.info(f"resuming run {saved.run_id} from {path} at round {saved.next_round}")
        return saved

    def _save_state(self, state: ServerState, state_dir: Path) -> None:
        """Atomically, keeping the previous round's state as the fallback for an unreadable file."""
        save_torch_keeping_previous(state.to_dict(), state_dir / STATE_FILE, state_dir / PREVIOUS_STATE_FILE)

    def _new_state(self, federation: Federation, sites: list[str]) -> ServerState | None:
        """Ask every site to prepare its data; the run's first state, or None after a panic."""
        cfg = self.cfg
        run_id = new_run_id()
        self.info(f"new run {run_id}: asking {len(sites)} sites to prepare their data; deadline {self.deadline.explain([])}")
        common = {P.CONFIG: cfg.to_dict(), P.RUN_ID: run_id, P.NUM_SITES: len(sites)}
        answers = self.send_each(
            P.TASK_PREPARE,
            {s: FLModel(params_type=ParamsType.FULL, params={}, meta=common) for s in sites},
            self.deadline.seconds([]),
            round_idx=None,
        )
        if self.abort_signal.triggered:
            return None
        replies, failed = {}, {}
        for site, result in answers.results.items():
            meta = result.meta or {}
            if meta.get(P.ERROR):
                failed[site] = meta[P.ERROR]
            else:
                replies[site] = PrepareReply.from_meta(meta)
        outcome = federation.start(replies, failed, answers.missing, sites, run_id)
        self._log(outcome.events)
        if outcome.stop:
            self.panic(outcome.stop)
        return outcome.state

    # ----- reporting -------------------------------------------------------------------
    def _log_round(self, round_idx: int, summaries: dict[str, Any], metric: str, role: str) -> None:
        parts = []
        for site, summary in sorted(summaries.items()):
            last = (summary.get("last") or {}).get("test", {})
            if metric in last:
                parts.append(f"{site_label(site, summary.get('cohort'))} {metric}={last[metric]:.1f}")
        rss = psutil.Process().memory_info().rss / 2**20  # benchmarks/memory.py follows it over the rounds
        kinds = {(s.get("last") or {}).get("kind") for s in summaries.values()}
        model = f"{role}, the global model as received" if "download" in kinds else role
        self.info(f"round {round_idx} done (server RSS {rss:.0f} MiB); test of each site's reported model ({model}): " + ", ".join(parts))

    def _track_round(self, round_idx: int, summaries: dict[str, Any], method_scalars: dict[str, float], metric: str) -> None:
        """The federation's tracking run (prrfl.flare.tracking), on the sites' x axis (local epochs done):
        the sites' mean valid and test metrics of their reported model (tags and steps as in a site's run), the mean drop of
        the test metric right after this round's download, the number of sites aggregated, and the method's
        own server values (e.g. pfa/r), at the epoch the round's download is used."""
        epochs = self.cfg.local_epochs
        start, end = round_idx * epochs, (round_idx + 1) * epochs - 1
        at_step = site_means(summaries, end)
        at_step.setdefault(end, {})["federation/sites_aggregated"] = len(summaries)
        drops = [s["download_drop"] for s in summaries.values() if s.get("download_drop") is not None]
        at_start = dict(method_scalars)
        if drops:
            at_start[f"retrogress/{metric}_drop"] = nanmean(drops)
        send_scalars(self, self.fl_ctx, at_start, start)
        for step, values in sorted(at_step.items()):
            send_scalars(self, self.fl_ctx, values, step)

    def _finish(self, federation: Federation, state: ServerState, state_dir: Path) -> None:
        results, global_params, table = federation.results(state)
        if global_params is not None:  # the method's global model after the last round (prrfl.crosseval evaluates it)
            save_torch(global_params, state_dir / GLOBAL_MODEL_FILE)
            results["global_model"] = {"file": str(state_dir / GLOBAL_MODEL_FILE), "round": state.history[-1]["round"]}
        for folder in (state_dir, Path(self.get_run_dir())):
            save_json(results, folder / "results.json")
            save_text(table + "\n", folder / "results.md")
        self.info("per-site results of the personalized models (best round on validation):\n" + table)


def site_means(summaries: dict[str, Any], end: int) -> dict[int, dict[str, float]]:
    """The sites' mean valid and test metrics by step (local epochs done - 1, as the sites log them): of the reported
    model (`last`: a global model scored at its download is tagged valid_global/..., at the end of the round it is
    the aggregate of; a model after the round's local epochs valid/...), and of the model after the local epochs
    where a site reports its download (`trained`, valid/...). `end` is the step of a record without epochs_done."""
    scalars: dict[tuple[str, int], list[float]] = {}
    for summary in summaries.values():
        last = summary.get("last") or {}
        records = [(last, "_global" if last.get("kind") == "download" else "")]
        if summary.get("trained"):
            records.append((summary["trained"], ""))
        for record, suffix in records:
            step = record.get("epochs_done", end + 1) - 1
            for split in ("valid", "test"):
                for name, value in (record.get(split) or {}).items():
                    scalars.setdefault((f"{split}{suffix}/{name}", step), []).append(value)
    at_step: dict[int, dict[str, float]] = {}
    for (tag, step), values in scalars.items():
        at_step.setdefault(step, {})[tag] = nanmean(values)
    return at_step


def say_last(logger: logging.Logger, message: str) -> None:
    """Log `message` (as an error) once more when this process has ended its job: FLARE's process monitor calls its
    cleanup callbacks after the job, and in the simulator's server process after the sites' processes ended, so
    the message is the last line the simulator prints."""

    def say_again() -> None:  # a named function: the monitor logs its callbacks by name
        logger.error(message)

    MainProcessMonitor.add_cleanup_cb(say_again)


def round_answers(answers: Answers) -> RoundAnswers:
    """The round's FLARE results as the federation's input: uploads (still differences), the sites' round
    summaries and times, the errors sites reported, and the sites that did not answer."""
    out = RoundAnswers(missing=dict(answers.missing))
    for site, result in sorted(answers.results.items()):
        meta = result.meta or {}
        if meta.get(P.ERROR):
            out.failed[site] = meta[P.ERROR]
            continue
        out.uploads[site] = P.model_to_upload(site, result)
        out.summaries[site] = meta.get("summary", {})
        out.seconds[site] = answers.seconds[site]
    return out
