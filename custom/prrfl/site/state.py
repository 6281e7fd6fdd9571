"""Per-site runtime state and its checkpoint.

Everything a site needs between rounds (both models, optimiser state, RNG state, the method's
memory, best-on-validation record, history) lives in one checkpoint in the site's own workspace,
written atomically after every round: FLARE may relaunch the site process for every task, and a
site that crashes resumes from its last completed round.

The previous round's checkpoint is kept too: when the server dies after a site finished round r
but before the server recorded it, the resumed job sends round r again, and the site must redo it
from its state after round r-1, not train it twice. It is also the fallback when the newest
checkpoint cannot be read (a disk fault, a truncated copy): the unreadable file is kept aside as
`site_state.pt.corrupt-<time>`, the site continues from the previous round and the round it lost is
listed in its results as missed.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import io
import json
import logging
import subprocess
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from prrfl.config import RunConfig
from prrfl.data.manifest import fingerprint
from prrfl.methods.view import LossCheck, Scalar, SiteView
from prrfl.metrics import download_drops
from prrfl.numerics import numerics, prepare_model
from prrfl.storage import atomic_write, atomic_write_bytes, load_torch, save_json, save_torch_keeping_previous, set_aside
from prrfl.tasks.contract import SiteData, Task

if TYPE_CHECKING:
    from prrfl.methods.method import Method

log = logging.getLogger(__name__)

EXAMPLES = "examples.npz"  # a few test samples with the best model's output, for figures (segmentation)
CHECKPOINT = "site_state.pt"
PREVIOUS_CHECKPOINT = "site_state.previous.pt"
RESULTS = "results.json"
MODEL_CARD_SUFFIX = ".json"  # best_<role>.json beside best_<role>.pt
# A card binds its own content: content_sha256 holds the sha256 of each field's canonical JSON (`field_digest`),
# so a field edited by hand afterwards is found and named (integrity against edits, not a signature).
# Format 2: every field is bound (CARD_FIELDS), and a card without content_sha256 is refused.
MODEL_CARD_FORMAT = "prrfl-model-card/2"
CARD_FIELDS = (
    "format",
    "model_file",
    "task",
    "method",
    "role",
    "run_id",
    "run_name",
    "site",
    "cohort",
    "round",
    "selected_by",
    "metrics",
    "class_names",
    "class_long_names",
    "preprocessing",
    "config",
    "data_root",
    "num_train",
    "saved",
    "torch",
    "weights_sha256",
    "prrfl_version",
    "code_commit",
    "data_fingerprint",
    "synthetic_data",
)
# Format 1, still read: its fields came over time (weights_sha256, prrfl_version, code_commit, data_fingerprint
# and synthetic_data later, content_sha256 last), and its content_sha256, where present, binds these fields only
# (not its metrics, nor class_long_names, which it lacks). A reader says what it cannot check of such a card.
MODEL_CARD_FORMAT_1 = "prrfl-model-card/1"
FORMAT_1_BOUND = (
    "model_file",
    "task",
    "method",
    "role",
    "run_id",
    "site",
    "cohort",
    "round",
    "class_names",
    "preprocessing",
    "config",
    "weights_sha256",
)


def field_digest(value: Any) -> str:
    """The sha256 of a card field's canonical JSON (sorted keys): what content_sha256 holds per field."""
    return hashlib.sha256(json.dumps(value, sort_keys=True).encode()).hexdigest()


def card_digests(card: dict[str, Any], fields: tuple[str, ...] = CARD_FIELDS) -> dict[str, str]:
    """The card's content_sha256: each of `fields` to its `field_digest`."""
    return {f: field_digest(card.get(f)) for f in fields}


def weights_stamp(model: torch.nn.Module) -> tuple:
    """What identifies a model's current weights without reading them: the module, and each parameter's and
    buffer's storage and version counter, which every in-place write bumps (an optimizer step, load_state_dict,
    BatchNorm's running statistics in a training forward, copy_)."""
    return (id(model), *((t.data_ptr(), t._version) for t in (*model.parameters(), *model.buffers())))


def save_weights(state_dict: dict[str, Any], path: Path) -> str:
    """Write a best model's weights atomically; returns the sha256 of the very bytes written, for its card
    (hashing what was serialised, not re-reading the file, so card and file agree by construction)."""
    buffer = io.BytesIO()
    torch.save(state_dict, buffer)
    data = buffer.getvalue()
    atomic_write_bytes(path, data)
    return hashlib.sha256(data).hexdigest()


def package_version() -> str | None:
    """The installed prrfl distribution's version (None when the package runs without being installed)."""
    try:
        return importlib.metadata.version("prrfl")
    except importlib.metadata.PackageNotFoundError:
        return None


@functools.lru_cache(maxsize=1)
def code_commit() -> str | None:
    """The git commit of the source tree this package runs from, `-dirty` when tracked files differ from
    it; None when the package is not a tracked file of a git checkout (an installed copy, a job folder)
    or git is missing or slow. Once per process: the code that runs is the code that was imported."""
    here = Path(__file__).resolve()

    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(here.parent), *args], capture_output=True, text=True, timeout=10, check=True).stdout

    try:
        git("ls-files", "--error-unmatch", here.name)  # a copy inside some other repository is not its checkout
        dirty = git("status", "--porcelain", "--untracked-files=no").strip()
        return git("rev-parse", "HEAD").strip() + ("-dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return None


def data_identity(task: Task, data_root: str | None) -> tuple[str | None, bool]:
    """(data_fingerprint, synthetic_data) of a model card. The fingerprint is that of the prepared data's
    manifest.json (`prrfl.data.manifest.fingerprint` says what it identifies); for a task whose data is
    made in memory from its data options (no prepared folder), the sha256 of those options as canonical
    JSON. Synthetic: no data root (the task's embedded synthetic federation) or a manifest that says so.
    A manifest gone since the data was loaded gives None, logged: it must not stop the training."""
    try:
        digest, synthetic = fingerprint(task.prepared_root(data_root))
    except NotImplementedError:  # Task.prepared_root: the task has no prepared folder
        options = json.dumps({"task": task.name, "data": task.data_cfg}, sort_keys=True).encode()
        digest, synthetic = hashlib.sha256(options).hexdigest(), False
    except (OSError, ValueError) as e:
        log.warning("no data fingerprint for the model card: %s", e)
        digest, synthetic = None, False
    return digest, synthetic or data_root is None


@dataclass
class SiteRuntime:
    name: str
    cfg: RunConfig
    task: Task
    method: Method
    data: SiteData
    device: torch.device
    state_dir: Path  # checkpoints, best model, results.json (prrfl.flare.places)
    models: dict[str, torch.nn.Module]
    optimizers: dict[str, torch.optim.Optimizer]
    generator: torch.Generator
    run_id: str
    data_root: str | None = None  # None: the task's embedded default data
    output_dir: Path | None = None  # a second copy of results.json (the workspace, where reports look)
    log_scalar: Scalar = lambda tag, value, step: None
    eval_batch_size: int | None = None  # samples per evaluation chunk (None: the task's default)
    memory: dict[str, Any] = field(default_factory=dict)
    round_idx: int = -1  # last completed round
    best: dict[str, Any] | None = None
    ood: dict[str, float] | None = None  # best model on the out-of-distribution cohort, after the last round
    history: list[dict[str, Any]] = field(default_factory=list)
    scores: dict[tuple[str, str], tuple[tuple, dict[str, float]]] = field(default_factory=dict, repr=False)  # evaluate's

    @classmethod
    def start(
        cls,
        name: str,
        cfg: RunConfig,
        task: Task,
        method: Method,
        data: SiteData,
        state_dir: Path,
        *,
        model_seed: int,
        generator_seed: int | None = None,
        device: torch.device | None = None,
        **fields: Any,
    ) -> SiteRuntime:
        """A site at the start of a run: the method's models, built under `torch.manual_seed(model_seed)`
        (so every site with the same seed starts from the same weights) and set up for the run's numerics
        (`prrfl.numerics.prepare_model`, compiled when the config says so), their optimizers, and the
        generator of batch orders and augmentations, seeded with `generator_seed` (default `model_seed`).
        `fields` are the other fields (run_id, log_scalar, ...). A FLARE site (`prrfl.flare.site_app`)
        then restores its state; benchmarks and tests use the site as it is."""
        device = device or torch.device("cpu")
        torch.manual_seed(model_seed)
        models = {role: prepare_model(method.build_model().to(device), cfg, compiled=True) for role in method.roles}
        optimizers = {role: method.build_optimizer(m) for role, m in models.items()}
        generator = torch.Generator().manual_seed(model_seed if generator_seed is None else generator_seed)
        return cls(name, cfg, task, method, data, device, state_dir, models, optimizers, generator, **fields)

    def view(self) -> SiteView:
        """What the method's hooks see of this site: its current models, optimisers and memory (`restore`
        replaces the memory, so a view is taken per round, after it)."""
        return SiteView(
            name=self.name,
            task=self.task,
            models=self.models,
            optimizers=self.optimizers,
            memory=self.memory,
            train=self.data.train,
            class_counts=self.data.class_counts,
            generator=self.generator,
            evaluate=self.evaluate,
            log_scalar=self.log_scalar,
            loss_check=LossCheck(self.name, deferred=self.device.type != "cpu"),
        )

    # ----- evaluation ------------------------------------------------------------------
    def evaluate(self, role: str, split_name: str) -> dict[str, float]:
        """The task's metrics of the model of `role` on a split. A model that has not changed since it was last
        scored on that split (`weights_stamp`: no parameter or buffer written since) is not scored again: within a
        round PRR's P is scored on test after its last epoch and again at the round's end and the next download,
        and on valid at the round's end and by DET before the next epoch, all with the same weights."""
        model = self.models[role]
        stamp = (self.eval_batch_size, *weights_stamp(model))  # chunks of another size may differ in the last bits
        kept = self.scores.get((role, split_name))
        if kept is not None and kept[0] == stamp:
            return dict(kept[1])
        scores = self.task.evaluate(model, self.data.split(split_name), self.eval_batch_size)
        self.scores[(role, split_name)] = (stamp, dict(scores))
        return scores

    def evaluate_best_on_ood(self) -> dict[str, float] | None:
        """The best-on-validation model on the task's out-of-distribution cohort (Table X), when the
        site's data root holds it."""
        cohort = self.task.ood_cohort
        best_file = self.state_dir / f"best_{self.method.eval_role}.pt"
        if cohort is None or not best_file.exists():
            return None
        try:
            split = self.task.load_site(cohort, self.device, self.data_root).test
        except FileNotFoundError as e:
            log.info("site %s: no out-of-distribution evaluation (%s)", self.name, e)
            return None
        return self.task.evaluate(self.best_model(), split, self.eval_batch_size)

    def best_model(self) -> torch.nn.Module | None:
        """The reported model at its best validation round (None before the first eligible round), computing
        as the trained models do (uncompiled: it is evaluated once)."""
        best_file = self.state_dir / f"best_{self.method.eval_role}.pt"
        if not best_file.exists():
            return None
        model = prepare_model(self.method.build_model().to(self.device), self.cfg)
        model.load_state_dict(load_torch(best_file, map_location=self.device))
        return model

    def save_best(self, role: str, round_idx: int, valid: dict[str, float], test: dict[str, float]) -> None:
        """The model of `role` as the site's best, and its model card beside it (`model_card`)."""
        sha256 = save_weights(self.models[role].state_dict(), self.state_dir / f"best_{role}.pt")
        save_json(self.model_card(role, round_idx, valid, test, sha256), self.state_dir / f"best_{role}{MODEL_CARD_SUFFIX}")

    def model_card(self, role: str, round_idx: int, valid: dict[str, float], test: dict[str, float], weights_sha256: str) -> dict[str, Any]:
        """What a saved best model is and how it was made: enough to rebuild it (task, method, config) and
        to feed it new inputs as in training (the task's preprocessing), with the metrics it was chosen by;
        the sha256 of its weights file (`save_weights`), the code and the data that made it; and content_sha256,
        which binds every field (CARD_FIELDS)."""
        data_fingerprint, synthetic = data_identity(self.task, self.data_root)
        card = {
            "format": MODEL_CARD_FORMAT,
            "model_file": f"best_{role}.pt",
            "task": self.cfg.task,
            "method": self.cfg.method,
            "role": role,
            "run_id": self.run_id,
            "run_name": self.cfg.run_name,
            "site": self.name,
            "cohort": self.data.cohort,
            "round": round_idx,
            "selected_by": f"valid {self.task.primary_metric}, rounds >= {self.cfg.select_from_round}",
            "metrics": {"valid": valid, "test": test},
            "class_names": list(self.task.class_names),
            "class_long_names": list(self.task.class_long_names or self.task.class_names),
            "preprocessing": self.task.preprocessing(),
            "config": self.cfg.to_dict(),
            "data_root": self.data_root,
            "num_train": self.data.num_train,
            "saved": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "torch": torch.__version__,
            "weights_sha256": weights_sha256,
            "prrfl_version": package_version(),
            "code_commit": code_commit(),
            "data_fingerprint": data_fingerprint,
            "synthetic_data": synthetic,
        }
        return {**card, "content_sha256": card_digests(card)}

    def write_examples(self) -> None:
        """The task's example outputs of the best model on the test split (`Task.examples`), written
        beside results.json; nothing for a task that draws none."""
        model = self.best_model()
        examples = self.task.examples(model, self.data.test) if model is not None else None
        if examples:
            for folder in {self.state_dir, self.output_dir or self.state_dir}:
                atomic_write(folder / EXAMPLES, lambda f: np.savez_compressed(f, **examples))

    # ----- persistence -----------------------------------------------------------------
    def save(self) -> None:
        save_torch_keeping_previous(
            {
                "run_id": self.run_id,
                "round_idx": self.round_idx,
                "models": {r: m.state_dict() for r, m in self.models.items()},
                "optimizers": {r: o.state_dict() for r, o in self.optimizers.items()},
                "generator": self.generator.get_state(),
                "memory": self.memory,
                "best": self.best,
                "ood": self.ood,
                "history": self.history,
            },
            self.state_dir / CHECKPOINT,
            self.state_dir / PREVIOUS_CHECKPOINT,
        )
        results = self.results()
        for folder in {self.state_dir, self.output_dir or self.state_dir}:
            save_json(results, folder / RESULTS)

    def restore(self, before_round: int | None = None) -> bool:
        """Load this run's newest readable checkpoint of a round before `before_round` (any round when
        None); False when there is none (a new run). An unreadable checkpoint is set aside and the
        previous one used, with a warning; when none of this run is readable, a RuntimeError says what to do."""
        unreadable: list[Path] = []
        for name in (CHECKPOINT, PREVIOUS_CHECKPOINT):
            path = self.state_dir / name
            if not path.exists():
                continue
            try:
                ckpt = load_torch(path, map_location=self.device)
            except RuntimeError as e:
                log.warning("site %s: %s; trying the previous checkpoint", self.name, e)
                unreadable.append(path)
                continue
            if ckpt.get("run_id") != self.run_id:
                log.info("site %s: checkpoint %s belongs to another run (%s); ignored", self.name, path, ckpt.get("run_id"))
                continue
            if before_round is not None and ckpt["round_idx"] >= before_round:
                log.warning(
                    "site %s: %s is of round %d but the server asks for round %d (it did not record the site's "
                    "last upload); looking for an earlier checkpoint",
                    self.name,
                    path,
                    ckpt["round_idx"],
                    before_round,
                )
                continue
            self._load(ckpt)
            for bad in unreadable:
                kept = set_aside(bad, "corrupt")
                log.warning(
                    "site %s: continuing from %s (round %d) instead of the unreadable %s, kept as %s; the rounds "
                    "after %d are lost for this site (listed as missed in its results)",
                    self.name,
                    path,
                    self.round_idx,
                    bad.name,
                    kept.name,
                    self.round_idx,
                )
            log.info("site %s: resumed from %s after round %d", self.name, path, self.round_idx)
            return True
        if unreadable:
            raise RuntimeError(
                f"site {self.name}: no readable checkpoint of run {self.run_id} in {self.state_dir} "
                f"({', '.join(p.name for p in unreadable)} cannot be read): restore that folder from a backup, "
                "or move it away and start a new run"
            )
        return False

    def _load(self, ckpt: dict[str, Any]) -> None:
        for role, model in self.models.items():
            model.load_state_dict(ckpt["models"][role])
        for role, opt in self.optimizers.items():
            opt.load_state_dict(ckpt["optimizers"][role])
        self.generator.set_state(ckpt["generator"].cpu())
        self.memory = ckpt["memory"]
        self.round_idx = ckpt["round_idx"]
        self.best = ckpt["best"]
        self.ood = ckpt["ood"]
        self.history = ckpt["history"]

    def download_drop(self, round_idx: int) -> float | None:
        """The primary test metric lost right after round `round_idx`'s download (None: not measured)."""
        pair = download_drops(self.history, self.task.primary_metric).get(round_idx)
        return None if pair is None else pair[0] - pair[1]

    def results(self) -> dict[str, Any]:
        scored = "download" if self.method.reports_download() else "round"  # the records of the reported model
        last = next((h for h in reversed(self.history) if h["kind"] == scored and "valid" in h), None)
        trained = {h["round"] for h in self.history if h["kind"] == "round"}
        return {
            "site": self.name,
            "cohort": self.data.cohort,
            "task": self.cfg.task,
            "method": self.cfg.method,
            "method_args": self.cfg.method_args,  # the options set for this run (an ablation's switches)
            "class_loss": self.cfg.class_loss,  # the classification term: the method's own, or balanced softmax for all
            **numerics(self.cfg),  # how the models computed: precision, channels_last, torch_compile (prrfl.numerics)
            "reported_model": self.method.eval_role,  # the model whose metrics are `best`, `last` and `history`'s valid/test
            # when it is scored: "download" (the global model, as received: `best`/`last` are download records, their
            # round the aggregate's) or "round" (after the local epochs)
            "reported_at": scored,
            "select_from_round": self.cfg.select_from_round,  # the first round `best` was chosen among
            "code_commit": code_commit(),  # the code that produced these numbers (None outside a git checkout)
            "run_name": self.cfg.run_name,
            "run_id": self.run_id,
            "seed": self.cfg.seed,
            "rounds_completed": self.round_idx + 1,  # the run's rounds up to this site's last one
            "num_rounds": self.cfg.num_rounds,  # the run's rounds in all: fewer completed means it has not finished
            "rounds_missed": sorted(set(range(self.round_idx + 1)) - trained),  # e.g. while the site was down
            "data_root": self.data_root,  # None: the task's embedded default data
            "state_dir": str(self.state_dir),  # best_<role>.pt: the reported model (prrfl.crosseval)
            "num_train": self.data.num_train,
            "class_counts": self.data.class_counts,
            "best": self.best,
            "last": last,
            "ood": self.ood,
            "history": self.history,
        }
