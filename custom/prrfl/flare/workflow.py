"""Server workflow: one personalized download per site per round, with persisted state.

Each round the workflow sends every site ITS OWN model (a separate task per site), waits, checks
the uploads, lets the method aggregate them into one download per site, and writes its whole state
atomically, so a re-submitted job with resume=True continues from the last completed round.
"""

from __future__ import annotations

import time
import uuid
from pathlib import Path
from typing import Any

import torch
from nvflare.app_common.abstract.fl_model import FLModel, ParamsType
from nvflare.app_common.workflows.model_controller import ModelController
from nvflare.app_opt.pt.decomposers import TensorDecomposer
from nvflare.fuel.utils import fobs

from prrfl.config import RunConfig
from prrfl.flare import protocol as P
from prrfl.flare.validation import upload_problem
from prrfl.methods.base import Download, Upload
from prrfl.registry import build_method, build_task
from prrfl.report import results_table
from prrfl.storage import load_torch, save_json, save_text, save_torch

STATE_FILE = "server_state.pt"


def resume_problem(saved: dict[str, Any], requested: dict[str, Any], next_round: int) -> str | None:
    """The resume rule: the same config, except that num_rounds may grow (to extend a finished run)
    but not fall below the rounds already completed. None when the run may resume."""
    if {**saved, "num_rounds": None} != {**requested, "num_rounds": None}:
        changed = sorted(k for k in set(saved) | set(requested) if k != "num_rounds" and saved.get(k) != requested.get(k))
        return f"the config differs from the saved run's in {changed}; only num_rounds may change"
    if requested["num_rounds"] < next_round:
        return f"num_rounds={requested['num_rounds']} but {next_round} rounds are already completed"
    return None


class PersonalizedWorkflow(ModelController):
    def __init__(
        self,
        config: dict[str, Any],
        resume: bool = False,
        state_dir: str = "",
        task_timeout: int = 0,
    ):
        """config: a RunConfig as a dict. state_dir: where the workflow keeps its state (default
        <server workspace>/prrfl/<run_name>). task_timeout: seconds a site may take for one task
        (0 = wait for ever); sites that miss it are left out of that round."""
        super().__init__(persistor_id="", ignore_result_error=True)  # a failed site must not end the job
        # attributes named like the arguments: FLARE's job export reads them back into the config
        self.config = config
        self.resume = resume
        self.state_dir = state_dir
        self.task_timeout = task_timeout
        self.cfg = RunConfig.from_dict(config)

    # ----- main loop -------------------------------------------------------------------
    def run(self) -> None:
        fobs.register(TensorDecomposer)
        cfg = self.cfg
        task = build_task(cfg)
        method = build_method(cfg, task)
        clients = sorted(c.name for c in self.engine.get_clients())
        min_sites = cfg.min_sites or len(clients)
        state_dir = Path(self.state_dir or Path(self.engine.get_workspace().get_root_dir()) / "prrfl" / cfg.run_name)
        state = self._load_state(state_dir)
        if state is None:
            state = self._new_state(cfg, task, clients, min_sites)
            if state is None:
                return
            save_torch(state, state_dir / STATE_FILE)
        # the sites that prepared their data at the run's start and take part in this job
        sites = sorted(set(state["site_counts"]) & set(clients))
        absent = sorted(set(state["site_counts"]) - set(clients))
        if absent:
            self.warning(f"sites of run {state['run_id']} not in this job: {absent}; they keep their last download")
        torch.manual_seed(cfg.seed)
        model = task.build_model()
        reference = {k: v for k, v in model.state_dict().items() if k in set(method.shared_keys(model))}
        common = {P.CONFIG: cfg.to_dict(), P.RUN_ID: state["run_id"], P.NUM_SITES: len(sites), P.GLOBAL_COUNTS: state["global_counts"]}

        for round_idx in range(state["next_round"], cfg.num_rounds):
            if self.abort_signal.triggered:
                return
            self.info(f"round {round_idx + 1}/{cfg.num_rounds}: sending each of {len(sites)} sites its own model")
            answers = self._send_each(
                P.TASK_TRAIN,
                {s: P.download_to_model(state["downloads"][s], common, round_idx, cfg.num_rounds) for s in sites},
            )
            uploads, summaries = [], {}
            for site in sites:
                if site not in answers:
                    self.warning(f"round {round_idx}: no result from {site}; it keeps its previous download")
                    continue
                if (answers[site].meta or {}).get(P.ERROR):
                    self.error(f"round {round_idx}: {site} failed: {answers[site].meta[P.ERROR]}; it keeps its previous download")
                    continue
                upload = P.model_to_upload(site, answers[site])
                problem = upload_problem(upload, reference, task.num_classes)  # on the difference, before use
                if problem:
                    self.error(f"round {round_idx}: rejected the upload of {site}: {problem}")
                    continue
                uploads.append(P.add_to_sent(upload, state["downloads"][site].params))
                summaries[site] = (answers[site].meta or {}).get("summary", {})
            if len(uploads) < min_sites:
                self.panic(f"round {round_idx}: only {len(uploads)} usable uploads, fewer than min_sites={min_sites}")
                return
            downloads = method.aggregate(uploads, round_idx, state["method_memory"])
            state["downloads"].update(downloads)
            state["summaries"].update(summaries)
            state["history"].append({"round": round_idx, "sites": [u.site for u in uploads], "summaries": summaries})
            state["next_round"] = round_idx + 1
            save_torch(state, state_dir / STATE_FILE)
            self._log_round(round_idx, summaries, task.primary_metric)

        self._finish(state, state_dir)

    # ----- setup -----------------------------------------------------------------------
    def _load_state(self, state_dir: Path) -> dict[str, Any] | None:
        path = state_dir / STATE_FILE
        if not (self.resume and path.exists()):
            return None
        state = load_torch(path)
        problem = resume_problem(state["config"], self.cfg.to_dict(), state["next_round"])
        if problem:
            raise ValueError(f"cannot resume from {path}: {problem}")
        state["config"] = self.cfg.to_dict()
        self.info(f"resuming run {state['run_id']} from {path} at round {state['next_round']}")
        return state

    def _new_state(self, cfg: RunConfig, task, sites: list[str], min_sites: int) -> dict[str, Any] | None:
        run_id = uuid.uuid4().hex[:12]
        self.info(f"new run {run_id}: asking {len(sites)} sites to prepare their data")
        common = {P.CONFIG: cfg.to_dict(), P.RUN_ID: run_id, P.NUM_SITES: len(sites)}
        answers = self._send_each(P.TASK_PREPARE, {s: FLModel(params_type=ParamsType.FULL, params={}, meta=common) for s in sites})
        counts = {}
        for site in sites:
            meta = answers[site].meta if site in answers else None
            if meta and meta.get(P.ERROR):
                self.error(f"{site} cannot take part in this run: {meta[P.ERROR]}")
                continue
            if not meta or len(meta.get("class_counts", [])) != task.num_classes:
                self.warning(f"{site} did not report usable class counts; it is left out of this run")
                continue
            counts[site] = meta["class_counts"]
            self.info(f"{site} ({meta.get('cohort')}): {meta['num_train']} training images, class counts {counts[site]}")
        if len(counts) < min_sites:
            self.panic(f"only {len(counts)} sites prepared their data, fewer than min_sites={min_sites}")
            return None
        global_counts = [sum(c[i] for c in counts.values()) for i in range(task.num_classes)]
        self.info(f"global class counts {dict(zip(task.class_names, global_counts))}")
        torch.manual_seed(cfg.seed)  # the same initial model for every site, reproducible from the seed
        initial = Download(params=task.build_model().state_dict())
        return {
            "run_id": run_id,
            "config": cfg.to_dict(),
            "next_round": 0,
            "global_counts": global_counts,
            "site_counts": counts,
            "downloads": {s: initial for s in counts},
            "method_memory": {},
            "summaries": {},
            "history": [],
        }

    # ----- messaging -------------------------------------------------------------------
    def _send_each(self, task_name: str, models: dict[str, FLModel]) -> dict[str, FLModel]:
        """One task per site (each gets its own model); returns the results that came back."""
        results: dict[str, FLModel] = {}

        def collect(result: FLModel) -> None:
            results[result.meta["client_name"]] = result

        for site, model in models.items():
            self.send_model(task_name, model, targets=[site], timeout=self.task_timeout, callback=collect)
        while self.get_num_standing_tasks():
            if self.abort_signal.triggered:
                break
            time.sleep(0.2)
        return results

    # ----- reporting -------------------------------------------------------------------
    def _log_round(self, round_idx: int, summaries: dict[str, Any], metric: str) -> None:
        parts = []
        for site, summary in sorted(summaries.items()):
            last = (summary.get("last") or {}).get("test", {})
            if metric in last:
                parts.append(f"{site} {metric}={last[metric]:.1f}")
        self.info(f"round {round_idx} done; test of the personalized models: " + ", ".join(parts))

    def _finish(self, state: dict[str, Any], state_dir: Path) -> None:
        results = {"run_id": state["run_id"], "config": state["config"], "sites": state["summaries"]}
        table = results_table(state["summaries"])
        for folder in (state_dir, Path(self.get_run_dir())):
            save_json(results, folder / "results.json")
            save_text(table + "\n", folder / "results.md")
        self.info("per-site results of the personalized models (best round on validation):\n" + table)
