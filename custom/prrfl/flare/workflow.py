"""Server workflow: one personalized download per site per round, with persisted state.

Each round the workflow sends every site ITS OWN model (a separate task per site), waits until every
site answered or the round's deadline passed (prrfl.flare.liveness), checks the uploads, lets the method
aggregate them into one download per site, and writes its whole state atomically, so a re-submitted job
with resume continues from the last completed round. A round goes on without the sites that failed,
did not answer in time or that FLARE reports dead, as long as `min_sites` answered; otherwise the job
stops with the saved state of the last completed round.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psutil
import torch
from nvflare.app_common.abstract.fl_model import FLModel, ParamsType
from nvflare.app_opt.pt.decomposers import TensorDecomposer
from nvflare.fuel.utils import fobs
from nvflare.fuel.utils.memory_utils import cleanup_memory

from prrfl.config import ConfigError, RunConfig
from prrfl.flare import places
from prrfl.flare import protocol as P
from prrfl.flare.components.controller import PerClientController
from prrfl.flare.liveness import AUTO, Deadline
from prrfl.flare.places import RunLock, WorkspaceBusy
from prrfl.flare.tracking import publish_cohorts, send_scalars
from prrfl.flare.validation import NORM_HISTORY, norm_outliers, update_norm, upload_problem
from prrfl.messages import Download
from prrfl.metrics import nanmean
from prrfl.registry import build_method, build_task, validate_config
from prrfl.report import participation, results_table
from prrfl.storage import load_torch, save_json, save_text, save_torch, save_torch_keeping_previous, set_aside

if TYPE_CHECKING:
    from prrfl.methods.base import Method
    from prrfl.tasks.base import Task

STATE_FILE = "server_state.pt"
PREVIOUS_STATE_FILE = "server_state.previous.pt"
GLOBAL_MODEL_FILE = "global_model.pt"  # the method's global model after the last round, when it has one
RESUME_MODES = (False, True, AUTO)


def resume_problem(saved: dict[str, Any], requested: dict[str, Any], next_round: int) -> str | None:
    """The resume rule: the same config, except that num_rounds may grow (to extend a finished run)
    but not fall below the rounds already completed. None when the run may resume."""
    if {**saved, "num_rounds": None} != {**requested, "num_rounds": None}:
        changed = sorted(k for k in set(saved) | set(requested) if k != "num_rounds" and saved.get(k) != requested.get(k))
        return f"the config differs from the saved run's in {changed}; only num_rounds may change"
    if requested["num_rounds"] < next_round:
        return f"num_rounds={requested['num_rounds']} but {next_round} rounds are already completed"
    return None


class PersonalizedWorkflow(PerClientController):
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
        if not isinstance(memory_gc_rounds, int) or isinstance(memory_gc_rounds, bool) or memory_gc_rounds < 0:
            raise ValueError(f"workflow argument 'memory_gc_rounds' must be an integer >= 0, got {memory_gc_rounds!r}")
        if resume not in RESUME_MODES or not isinstance(resume, (bool, str)):
            raise ValueError(f"workflow argument 'resume' must be false, true or \"auto\", got {resume!r}")
        self.deadline = Deadline(task_timeout, first_task_timeout, min_task_timeout, task_timeout_factor, estimate_timeout_factor)
        self.cfg = validate_config(config)  # every field and method option, before any site is asked

    # ----- main loop -------------------------------------------------------------------
    def run(self) -> None:
        """The job under the workspace's lock (prrfl.flare.places.RunLock): taken before any state is read
        or moved, so a second job on the same workspace is refused instead of moving this one's live state
        aside. In the simulator, the processes of sites lost during the job are ended at its end, so that a
        frozen site cannot keep the simulator from exiting (prrfl.flare.liveness.release_lost_workers)."""
        fobs.register(TensorDecomposer)
        state_dir = self._state_dir()
        job_id = self.fl_ctx.get_job_id() if self.fl_ctx else None
        root = Path(self.engine.get_workspace().get_root_dir())
        lock = RunLock(places.lock_file(root, state_dir, job_id))
        try:
            places.ensure_writable(state_dir, "server", "set the workflow's state_dir argument to a writable folder")
            lock.acquire(run_name=self.cfg.run_name, job_id=job_id, state_dir=str(state_dir))
        except WorkspaceBusy as e:
            where = f"the simulator workspace {root.resolve().parent}" if places.in_simulator(job_id) else f"the state folder {state_dir}"
            self.panic(f"the job cannot start: {places.busy_message(where, e.holder)}")
            return
        except OSError as e:  # ensure_writable names the folder and the setting
            self.panic(f"the job cannot start: {e}")
            return
        try:
            self._run(state_dir, lock)
        finally:
            lock.release()
            self.release_lost()

    def _run(self, state_dir: Path, lock: RunLock) -> None:
        cfg = self.cfg
        task = build_task(cfg)
        method = build_method(cfg, task)
        clients = sorted(c.name for c in self.engine.get_clients())
        try:  # a job that cannot start says why, in one line, before any site trains
            state = self._load_state(state_dir)
        except (OSError, ValueError, RuntimeError) as e:
            self.panic(f"the job cannot start: {e}")
            return
        if state is None:
            state = self._new_state(cfg, task, method, clients)
            if state is None:
                return
            try:
                save_torch(state, state_dir / STATE_FILE)
            except OSError as e:
                self.panic(f"the job cannot start: cannot save the server's state: {e}")
                return
        lock.update(run_id=state["run_id"])
        # the sites that prepared their data at the run's start and take part in this job
        sites = sorted(set(state["site_counts"]) & set(clients))
        publish_cohorts(self.fl_ctx, state.get("cohorts", {}))  # the tracking runs are named by cohort
        absent = sorted(set(state["site_counts"]) - set(clients))
        if absent:
            self.warning(f"sites of run {state['run_id']} not in this job: {absent}; they keep their last download")
        try:
            min_sites = cfg.required_sites(len(state["site_counts"]))
        except ConfigError as e:
            self.panic(f"the job cannot go on: {e}")
            return
        torch.manual_seed(cfg.seed)
        model = method.build_model()
        reference = {k: v for k, v in model.state_dict().items() if k in set(method.shared_keys(model))}
        common = {P.CONFIG: cfg.to_dict(), P.RUN_ID: state["run_id"], P.NUM_SITES: len(sites), P.GLOBAL_COUNTS: state["global_counts"]}
        if state["next_round"] >= cfg.num_rounds:
            self.info(f"run {state['run_id']} has completed all {cfg.num_rounds} rounds; nothing to train (raise num_rounds to extend it)")

        for round_idx in range(state["next_round"], cfg.num_rounds):
            if self.abort_signal.triggered:
                return
            observed = [s for h in state["history"] for s in h.get("seconds", {}).values()]
            estimates = list(state.get("round_estimates", {}).values())
            self.info(
                f"round {round_idx + 1}/{cfg.num_rounds}: sending each of {len(sites)} sites its own model; "
                f"deadline {self.deadline.explain(observed, estimates)}"
            )
            answers = self.send_each(
                P.TASK_TRAIN,
                {s: P.download_to_model(state["downloads"][s], common, round_idx, cfg.num_rounds) for s in sites},
                self.deadline.seconds(observed, estimates),
                round_idx,
            )
            if self.abort_signal.triggered:
                return
            checked = {}
            for site, why in sorted(answers.missing.items()):
                self.warning(f"round {round_idx}: no result from {site}: {why}; it keeps its previous download")
            for site in sorted(answers.results):
                result = answers.results[site]
                if (result.meta or {}).get(P.ERROR):
                    self.error(f"round {round_idx}: {site} failed: {result.meta[P.ERROR]}; it keeps its previous download")
                    continue
                upload = P.model_to_upload(site, result)
                problem = upload_problem(upload, reference, task)  # on the difference, before use
                if problem:
                    self.error(f"round {round_idx}: rejected the upload of {site}: {problem}")
                    continue
                checked[site] = upload
            norms = {site: update_norm(upload.params) for site, upload in checked.items()}
            self.info(f"round {round_idx}: update norms " + ", ".join(f"{s} {n:.3g}" for s, n in norms.items()))
            accepted_norms = state.setdefault("update_norms", {})  # each site's accepted norms, for its own rule
            for site, problem in sorted(norm_outliers(norms, cfg.update_norm_ratio, accepted_norms, cfg.update_norm_max).items()):
                self.error(f"round {round_idx}: rejected the upload of {site}: {problem}")
                del checked[site]
            uploads = [P.add_to_sent(upload, state["downloads"][site].params) for site, upload in checked.items()]
            summaries = {site: (answers.results[site].meta or {}).get("summary", {}) for site in checked}
            if len(uploads) < min_sites:
                left_out = sorted(set(sites) - {u.site for u in uploads})
                self.panic(
                    f"round {round_idx}: only {len(uploads)} of {len(sites)} sites sent a usable upload (left out: {left_out}), "
                    f"fewer than min_sites={cfg.min_sites} ({min_sites}); the job stops. The state after the last completed "
                    f"round is in {state_dir}: bring the sites back and re-submit the job with resume"
                )
                return
            for site in checked:
                accepted_norms[site] = [*accepted_norms.get(site, []), norms[site]][-NORM_HISTORY:]
            downloads = method.aggregate(uploads, round_idx, state["method_memory"])
            state["downloads"].update(downloads)
            state["summaries"].update(summaries)
            state["history"].append(
                {
                    "round": round_idx,
                    "sites": [u.site for u in uploads],
                    "summaries": summaries,
                    "seconds": {s: answers.seconds[s] for s in summaries},
                    "missing": answers.missing,
                }
            )
            state["next_round"] = round_idx + 1
            try:
                self._save_state(state, state_dir)
            except OSError as e:  # e.g. prrfl.storage.DiskFullError: one line, the last saved round kept
                self.panic(
                    f"round {round_idx}: cannot save the server's state: {e}; the state after round {round_idx - 1} is kept in {state_dir}"
                )
                return
            if self.memory_gc_rounds and (round_idx + 1) % self.memory_gc_rounds == 0:
                cleanup_memory()
            self._log_round(round_idx, summaries, task.primary_metric)
            self._track_round(round_idx, summaries, method.server_scalars(downloads), task.primary_metric)

        self._finish(state, state_dir, task, method)

    # ----- setup -----------------------------------------------------------------------
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

    def _load_state(self, state_dir: Path) -> dict[str, Any] | None:
        """The saved state to continue, or None for a new run (resume rules: see __init__)."""
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
        problem = resume_problem(state["config"], self.cfg.to_dict(), state["next_round"])
        if problem:
            raise ValueError(f"cannot resume from {path}: {problem}")
        state["config"] = self.cfg.to_dict()
        self.info(f"resuming run {state['run_id']} from {path} at round {state['next_round']}")
        return state

    def _save_state(self, state: dict[str, Any], state_dir: Path) -> None:
        """Atomically, keeping the previous round's state as the fallback for an unreadable file."""
        save_torch_keeping_previous(state, state_dir / STATE_FILE, state_dir / PREVIOUS_STATE_FILE)

    def _new_state(self, cfg: RunConfig, task: Task, method: Method, sites: list[str]) -> dict[str, Any] | None:
        run_id = uuid.uuid4().hex[:12]
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
        counts, cohorts, estimates, synthetic, per_site_files = {}, {}, {}, [], set()
        for site, why in sorted(answers.missing.items()):
            self.error(f"{site} cannot take part in this run: no answer to prepare: {why}")
        for site in sorted(answers.results):
            meta = answers.results[site].meta or {}
            if meta.get(P.ERROR):
                self.error(f"{site} cannot take part in this run: {meta[P.ERROR]}")
                continue
            problem = task.stats_problem(meta.get("num_train"), meta.get("class_counts"))
            if problem:
                self.warning(f"{site} did not report usable statistics ({problem}); it is left out of this run")
                continue
            counts[site] = meta["class_counts"]
            cohorts[site] = str(meta.get("cohort") or site)
            estimate = meta.get("round_estimate_s")
            if isinstance(estimate, (int, float)) and 0 < estimate < float("inf"):
                estimates[site] = float(estimate)
            settings = meta.get("settings") or {}
            per_site_files |= set(settings.get("per_site_files", []))
            for note in settings.get("notes", []):
                self.warning(f"{site}: {note}")
            source = meta.get("data_root") or "the embedded synthetic federation"
            if not meta.get("data_root"):
                synthetic.append(site)
            self.info(
                f"{site} ({meta.get('cohort')}): {meta['num_train']} training {task.sample_noun} from {source}, class counts "
                f"{counts[site]}; settings {settings.get('used') or 'none (defaults)'}; state in {meta.get('state_dir')}; "
                f"estimated {estimates.get(site, float('nan')):.1f} s per round"
            )
        for name in sorted(per_site_files - set(sites)):
            self.warning(f"local/prrfl_site.{name}.json is not used: no site of this job is named '{name}' (sites: {sites})")
        if synthetic:
            self.warning(f"sites training on the embedded synthetic federation (no data_root in their settings): {synthetic}")
        try:
            min_sites = cfg.required_sites(len(sites))
        except ConfigError as e:
            self.panic(f"the job cannot start: {e}")
            return None
        if len(counts) < min_sites:
            self.panic(f"only {len(counts)} of {len(sites)} sites prepared their data, fewer than min_sites={cfg.min_sites} ({min_sites})")
            return None
        global_counts = [sum(c[i] for c in counts.values()) for i in range(task.num_classes)]
        self.info(f"global class counts {dict(zip(task.class_names, global_counts))}")
        torch.manual_seed(cfg.seed)  # the same initial model for every site, reproducible from the seed
        initial = Download(params=method.build_model().state_dict())
        return {
            "run_id": run_id,
            "config": cfg.to_dict(),
            "next_round": 0,
            "global_counts": global_counts,
            "site_counts": counts,
            "cohorts": cohorts,  # FLARE client -> the cohort (hospital) its data is
            "round_estimates": estimates,  # each site's estimate of a round (s), for the first deadline
            "downloads": {s: initial for s in counts},
            "method_memory": {},
            "summaries": {},
            "history": [],
        }

    # ----- reporting -------------------------------------------------------------------
    def _log_round(self, round_idx: int, summaries: dict[str, Any], metric: str) -> None:
        parts = []
        for site, summary in sorted(summaries.items()):
            last = (summary.get("last") or {}).get("test", {})
            if metric in last:
                parts.append(f"{site} {metric}={last[metric]:.1f}")
        rss = psutil.Process().memory_info().rss / 2**20  # benchmarks/memory.py follows it over the rounds
        self.info(f"round {round_idx} done (server RSS {rss:.0f} MiB); test of the personalized models: " + ", ".join(parts))

    def _track_round(self, round_idx: int, summaries: dict[str, Any], method_scalars: dict[str, float], metric: str) -> None:
        """The federation's tracking run (prrfl.flare.tracking), on the sites' x axis (local epochs done):
        the sites' mean valid and test metrics after the round (tags as in a site's run), the mean drop of
        the test metric right after this round's download, the number of sites aggregated, and the method's
        own server values (e.g. pfa/r), at the epoch the round's download is used."""
        epochs = self.cfg.local_epochs
        start, end = round_idx * epochs, (round_idx + 1) * epochs - 1
        scalars: dict[str, list[float]] = {}
        for summary in summaries.values():
            for split in ("valid", "test"):
                for name, value in ((summary.get("last") or {}).get(split) or {}).items():
                    scalars.setdefault(f"{split}/{name}", []).append(value)
        at_end = {tag: nanmean(values) for tag, values in scalars.items()}
        at_end["federation/sites_aggregated"] = len(summaries)
        drops = [s["download_drop"] for s in summaries.values() if s.get("download_drop") is not None]
        at_start = dict(method_scalars)
        if drops:
            at_start[f"retrogress/{metric}_drop"] = nanmean(drops)
        send_scalars(self, self.fl_ctx, at_start, start)
        send_scalars(self, self.fl_ctx, at_end, end)

    def _finish(self, state: dict[str, Any], state_dir: Path, task: Task, method: Method) -> None:
        rounds = participation(state["history"], list(state["site_counts"]))
        sites = {s: {**state["summaries"].get(s, {}), "participation": rounds[s]} for s in state["site_counts"]}
        results = {"run_id": state["run_id"], "config": state["config"], "sites": sites, "global_model": None}
        if state["history"]:  # the method's global model after the last round (prrfl.crosseval evaluates it)
            last = state["history"][-1]
            params = method.global_params({s: state["downloads"][s] for s in last["sites"]})
            if params is not None:
                save_torch(params, state_dir / GLOBAL_MODEL_FILE)
                results["global_model"] = {"file": str(state_dir / GLOBAL_MODEL_FILE), "round": last["round"]}
        table = results_table(sites, metrics=task.metric_names[:2])
        for folder in (state_dir, Path(self.get_run_dir())):
            save_json(results, folder / "results.json")
            save_text(table + "\n", folder / "results.md")
        self.info("per-site results of the personalized models (best round on validation):\n" + table)
