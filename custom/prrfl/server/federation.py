"""The server's side of a run as pure functions over typed state, without FLARE.

`Federation` holds a run's config, task and method. `start` turns the sites' answers to `prepare` into
the run's first `ServerState`; `round` turns one round's uploads and the current state into the next
state, one `Download` per site that was aggregated, and a `RoundSummary` (who was aggregated, who was
rejected and why, who was missing). Neither touches the network or the disk, and neither mutates its
input state: the FLARE controller (prrfl.flare.server_workflow) only moves messages, applies deadlines, saves
the state and tracks the round, and the round logic is tested in-process (tests/test_federation.py).

What can go wrong is returned, not raised: `Outcome.events` are the log lines of the step (level, text)
and `Outcome.stop`, when set, is why the job cannot go on (fewer usable sites than `min_sites`).
"""

from __future__ import annotations

import copy
import uuid
from dataclasses import MISSING, asdict, dataclass, field, fields
from typing import TYPE_CHECKING, Any, Literal, Protocol

import torch

from prrfl.config import ConfigError, RunConfig
from prrfl.keys import PROTOTYPES
from prrfl.messages import Download, PrepareReply, Upload
from prrfl.server.aggregation import add_difference
from prrfl.server.checks import (
    NORM_HISTORY,
    norm_outliers,
    round_value,
    settings_problem,
    summary_problem,
    update_norm,
    upload_problem,
)
from prrfl.summary import participation, results_table

if TYPE_CHECKING:
    from collections.abc import Iterable

    from prrfl.tasks.contract import Task

Level = Literal["info", "warning", "error"]
Event = tuple[Level, str]


@dataclass
class ServerState:
    """Everything the server keeps between rounds; saved after every round (as a plain dict, `to_dict`)."""

    run_id: str
    config: dict[str, Any]
    global_counts: list[int]
    site_counts: dict[str, list[int]]  # the sites that prepared their data at the run's start -> class counts
    downloads: dict[str, Download]  # each site's last download (what it trains from next)
    next_round: int = 0
    cohorts: dict[str, str] = field(default_factory=dict)  # FLARE client -> the cohort (hospital) its data is
    round_estimates: dict[str, float] = field(default_factory=dict)  # each site's estimate of a round (s), for the first deadline
    method_memory: dict[str, Any] = field(default_factory=dict)  # the method's own server-side state
    summaries: dict[str, dict[str, Any]] = field(default_factory=dict)  # each site's last round summary
    history: list[dict[str, Any]] = field(default_factory=list)  # RoundSummary.to_dict() of every completed round
    update_norms: dict[str, list[float]] = field(default_factory=dict)  # each site's last accepted update norms

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_dict(cls, saved: dict[str, Any]) -> ServerState:
        """A saved state, also one written before a field existed (it takes the field's default)."""
        if not isinstance(saved, dict):
            raise ValueError(f"the saved server state is {type(saved).__name__}, not a dict: it is not a state of a prrfl run")
        required = {f.name for f in fields(cls) if f.default is MISSING and f.default_factory is MISSING}
        lacking = sorted(required - set(saved))
        if lacking:
            raise ValueError(f"the saved server state lacks {lacking}: it is not a state of a prrfl run")
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in saved.items() if k in names})

    def observed_seconds(self) -> list[float]:
        """Every round time measured so far (for the deadline)."""
        return [s for h in self.history for s in h.get("seconds", {}).values()]


@dataclass
class RoundAnswers:
    """What came back from the sites in one round, as the controller received it."""

    uploads: dict[str, Upload] = field(default_factory=dict)  # params are still differences to what was sent
    summaries: dict[str, dict[str, Any]] = field(default_factory=dict)  # each answering site's round summary
    seconds: dict[str, float] = field(default_factory=dict)
    failed: dict[str, str] = field(default_factory=dict)  # site -> the error it reported
    missing: dict[str, str] = field(default_factory=dict)  # site -> why nothing came back


@dataclass
class RoundSummary:
    """One completed round, as kept in the server's history."""

    round: int
    sites: list[str]  # aggregated, in upload order
    summaries: dict[str, dict[str, Any]]
    seconds: dict[str, float]
    missing: dict[str, str]
    failed: dict[str, str] = field(default_factory=dict)
    rejected: dict[str, str] = field(default_factory=dict)  # site -> why its upload was refused
    norms: dict[str, float] = field(default_factory=dict)  # update norm of every well-formed upload

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Outcome:
    """The result of a step: the new state (None when the step could not produce one), the log lines,
    and why the job must stop (None: it goes on)."""

    state: ServerState | None
    events: list[Event] = field(default_factory=list)
    stop: str | None = None
    downloads: dict[str, Download] = field(default_factory=dict)
    summary: RoundSummary | None = None


def add_to_sent(upload: Upload, sent: dict[str, torch.Tensor]) -> Upload:
    """The site's trained weights: what the server sent plus the (checked) difference, in the sent dtype."""
    return Upload(upload.site, add_difference(upload.params, sent), upload.num_train, upload.class_counts, upload.meta)


def prototype_width_outliers(uploads: dict[str, Upload]) -> dict[str, str]:
    """The well-formed uploads whose prototypes are not those of the round (`round_value`: the most common
    width, no prototypes counting as width 0; a tie goes to sending some), each with the reason: the method
    stacks the sites' prototypes, which needs one width, and a site of a method that exchanges them must send them."""
    widths = {site: len(u.meta[PROTOTYPES][0]) if PROTOTYPES in u.meta else 0 for site, u in uploads.items()}
    common = round_value(widths, rank=lambda width: width > 0)
    others = sum(width == common for width in widths.values())
    return {
        site: (f"it sends prototypes of width {width}" if width else "it sends no prototypes")
        + f", the round's other {others} upload(s) {f'of width {common}' if common else 'none'}"
        for site, width in widths.items()
        if width != common
    }


def new_run_id() -> str:
    return uuid.uuid4().hex[:12]


class ServerMethod(Protocol):
    """What the round logic needs of a method (prrfl.methods.method.Method has it): its model, the entries that
    travel, its check of its own upload meta, its aggregation, and its global model when it has one."""

    def build_model(self) -> torch.nn.Module: ...

    def shared_keys(self, model: torch.nn.Module) -> list[str]: ...

    def upload_meta_problem(self, upload: Upload) -> str | None: ...

    def aggregate(self, uploads: list[Upload], round_idx: int, server: dict[str, Any]) -> dict[str, Download]: ...

    def global_params(self, downloads: dict[str, Download]) -> dict[str, torch.Tensor] | None: ...


class Federation:
    def __init__(self, cfg: RunConfig, task: Task, method: ServerMethod):
        self.cfg, self.task, self.method = cfg, task, method
        self._reference: dict[str, torch.Tensor] | None = None

    # ----- the start of a run ---------------------------------------------------------------
    def start(
        self, replies: dict[str, PrepareReply], failed: dict[str, str], missing: dict[str, str], sites: list[str], run_id: str | None = None
    ) -> Outcome:
        """The run's first state from the sites' answers to `prepare` (sites that failed or are missing are
        left out; `run_id`: the id the sites were told, default a new one), or a stop when fewer than min_sites prepared their data. Seeds torch's global RNG with
        the run's seed to build the initial model, the same for every site."""
        cfg, task = self.cfg, self.task
        events: list[Event] = []
        counts, cohorts, estimates, synthetic, per_site_files = {}, {}, {}, [], set()
        for site, why in sorted(missing.items()):
            events.append(("error", f"{site} cannot take part in this run: no answer to prepare: {why}"))
        for site, why in sorted(failed.items()):
            events.append(("error", f"{site} cannot take part in this run: {why}"))
        for site in sorted(replies):
            reply = replies[site]
            problem = task.stats_problem(reply.num_train, reply.class_counts) or settings_problem(reply.settings)
            if problem:
                events.append(("warning", f"{site} did not report usable statistics or settings ({problem}); it is left out of this run"))
                continue
            counts[site] = reply.class_counts
            cohorts[site] = str(reply.cohort or site)
            if reply.round_estimate_s is not None:
                estimates[site] = reply.round_estimate_s
            per_site_files |= set(reply.settings.get("per_site_files", []))
            for note in reply.settings.get("notes", []):
                events.append(("warning", f"{site}: {note}"))
            if not reply.data_root:
                synthetic.append(site)
            events.append(
                (
                    "info",
                    f"{site} ({reply.cohort}): {reply.num_train} training {task.sample_noun} from "
                    f"{reply.data_root or 'the embedded synthetic federation'}, class counts {counts[site]}; settings "
                    f"{reply.settings.get('used') or 'none (defaults)'}; state in {reply.state_dir}; estimated "
                    f"{estimates.get(site, float('nan')):.1f} s per round",
                )
            )
        for name in sorted(per_site_files - set(sites)):
            events.append(("warning", f"local/prrfl_site.{name}.json is not used: no site of this job is named '{name}' (sites: {sites})"))
        if synthetic:
            events.append(("warning", f"sites training on the embedded synthetic federation (no data_root in their settings): {synthetic}"))
        try:
            min_sites = cfg.required_sites(len(sites))
        except ConfigError as e:
            return Outcome(None, events, stop=f"the job cannot start: {e}")
        if len(counts) < min_sites:
            stop = f"only {len(counts)} of {len(sites)} sites prepared their data, fewer than min_sites={cfg.min_sites} ({min_sites})"
            return Outcome(None, events, stop=stop)
        global_counts = [sum(c[i] for c in counts.values()) for i in range(task.num_classes)]
        events.append(("info", f"global class counts {dict(zip(task.class_names, global_counts))}"))
        torch.manual_seed(cfg.seed)  # the same initial model for every site, reproducible from the seed
        initial = Download(params=self.method.build_model().state_dict())
        state = ServerState(
            run_id=run_id or new_run_id(),
            config=cfg.to_dict(),
            global_counts=global_counts,
            site_counts=counts,
            cohorts=cohorts,
            round_estimates=estimates,
            downloads={s: initial for s in counts},
        )
        return Outcome(state, events)

    # ----- a round --------------------------------------------------------------------------
    def in_cohort_order(self, state: ServerState, sites: Iterable[str]) -> list[str]:
        """The sites in the order of their cohorts in the task's table (then by name). Uploads are checked
        and aggregated in this order, so the float sums, and every number after them, do not depend on the
        FLARE client names: a deployment whose clients are named after hospitals aggregates as the
        simulator's site-1..site-N do."""
        rank = {cohort: i for i, cohort in enumerate(self.task.cohorts)}

        def key(site: str) -> tuple[int, str, str]:
            cohort = state.cohorts.get(site, "")
            return rank.get(cohort, len(rank)), cohort, site

        return sorted(sites, key=key)

    def reference(self) -> dict[str, torch.Tensor]:
        """The shared entries of a model of the method (keys, shapes) that uploads are checked against.
        Built once, from torch's global RNG seeded with the run's seed (as the initial model)."""
        if self._reference is None:
            torch.manual_seed(self.cfg.seed)
            model = self.method.build_model()
            shared = set(self.method.shared_keys(model))
            self._reference = {k: v for k, v in model.state_dict().items() if k in shared}
        return self._reference

    def round(self, state: ServerState, round_idx: int, answers: RoundAnswers) -> Outcome:
        """One round: check every upload (well-formed, then its update norm), aggregate the usable ones
        into one download per aggregated site, and return the next state. A site that failed, was missing
        or was rejected keeps its previous download. Fewer usable uploads than min_sites: a stop, and no
        new state (the job keeps the state of the last completed round)."""
        cfg = self.cfg
        events: list[Event] = []
        for site, why in sorted(answers.missing.items()):
            events.append(("warning", f"round {round_idx}: no result from {site}: {why}; it keeps its previous download"))
        for site, why in sorted(answers.failed.items()):
            events.append(("error", f"round {round_idx}: {site} failed: {why}; it keeps its previous download"))
        rejected: dict[str, str] = {}
        checked: dict[str, Upload] = {}
        for site in self.in_cohort_order(state, answers.uploads):
            problem = upload_problem(answers.uploads[site], self.reference(), self.task)  # on the difference, before use
            problem = problem or summary_problem(answers.summaries.get(site, {}))
            problem = problem or self.method.upload_meta_problem(answers.uploads[site])  # the method's own values
            if problem:
                rejected[site] = problem
            else:
                checked[site] = answers.uploads[site]
        for site, problem in prototype_width_outliers(checked).items():
            rejected[site] = problem
            del checked[site]
        norms = {site: update_norm(upload.params) for site, upload in checked.items()}
        events.append(("info", f"round {round_idx}: update norms " + ", ".join(f"{s} {n:.3g}" for s, n in norms.items())))
        for site, problem in norm_outliers(norms, cfg.update_norm_ratio, state.update_norms, cfg.update_norm_max).items():
            rejected[site] = problem
            del checked[site]
        for site, problem in sorted(rejected.items()):
            events.append(("error", f"round {round_idx}: rejected the upload of {site}: {problem}"))
        sites = sorted(state.site_counts)
        min_sites = cfg.required_sites(len(sites))
        if len(checked) < min_sites:
            left_out = sorted(set(sites) - set(checked))
            stop = (
                f"round {round_idx}: only {len(checked)} of {len(sites)} sites sent a usable upload (left out: {left_out}), "
                f"fewer than min_sites={cfg.min_sites} ({min_sites}); the job stops"
            )
            return Outcome(None, events, stop=stop)
        new = copy.copy(state)  # a new state object; the containers that change are copied below
        new.update_norms = {**state.update_norms}
        for site in checked:
            new.update_norms[site] = [*state.update_norms.get(site, []), norms[site]][-NORM_HISTORY:]
        uploads = [add_to_sent(upload, state.downloads[site].params) for site, upload in checked.items()]
        new.method_memory = copy.deepcopy(state.method_memory)
        downloads = self.method.aggregate(uploads, round_idx, new.method_memory)
        summaries = {site: answers.summaries.get(site, {}) for site in checked}
        summary = RoundSummary(
            round=round_idx,
            sites=sorted(u.site for u in uploads),  # who took part (aggregated in cohort order)
            summaries=summaries,
            seconds={s: answers.seconds[s] for s in summaries if s in answers.seconds},
            missing=dict(answers.missing),
            failed=dict(answers.failed),
            rejected=rejected,
            norms=norms,
        )
        new.downloads = {**state.downloads, **downloads}
        new.summaries = {**state.summaries, **summaries}
        new.history = [*state.history, summary.to_dict()]
        new.next_round = round_idx + 1
        return Outcome(new, events, downloads=downloads, summary=summary)

    # ----- the end of a run -------------------------------------------------------------------
    def results(self, state: ServerState) -> tuple[dict[str, Any], dict[str, torch.Tensor] | None, str]:
        """The run's results (per site: its last summary and participation), the method's global model after
        the last round (None when it has none, e.g. PRR), and the results table in markdown."""
        rounds = participation(state.history, list(state.site_counts))
        sites = {s: {**state.summaries.get(s, {}), "participation": rounds[s]} for s in state.site_counts}
        results = {"run_id": state.run_id, "config": state.config, "sites": sites, "global_model": None}
        params = None
        if state.history:
            last = state.history[-1]
            params = self.method.global_params({s: state.downloads[s] for s in last["sites"]})
        return results, params, results_table(sites, metrics=self.task.table_metrics, note=self.task.table_note)
