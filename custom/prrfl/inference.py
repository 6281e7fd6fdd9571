"""A saved model at a hospital, without the federation: load a best model by its model card, and score it
on a prepared split (`prrfl evaluate`).

Every best model `best_<role>.pt` has its card `best_<role>.json` beside it (`SiteRuntime.model_card`):
the task, method and whole config that rebuild the network, the preprocessing its inputs need, the
metrics it was chosen with, and the sha256 of the weights file it was written with. Nothing is re-typed
by the user: what the card says is what is built, and weights that are not the card's are refused.
"""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from prrfl.config import RunConfig
from prrfl.registry import build_method, build_task
from prrfl.site.state import BOUND_FIELDS, MODEL_CARD_FORMAT, MODEL_CARD_SUFFIX, card_digests
from prrfl.storage import load_json, load_torch
from prrfl.tasks.base import Task

log = logging.getLogger(__name__)

SPLITS = ("train", "valid", "test")


@dataclass
class SavedModel:
    path: Path
    card: dict[str, Any]
    task: Task
    model: torch.nn.Module


def card_path(model_path: str | Path) -> Path:
    return Path(model_path).with_suffix(MODEL_CARD_SUFFIX)


def load_saved_model(model_path: str | Path, device: str | torch.device = "cpu") -> SavedModel:
    """The model of a best-model file, rebuilt from its card, in evaluation mode. Errors name the file:
    a missing model or card, a card of another format, weights that are not the ones the card was written
    with (`check_weights`) or do not fit the card's network."""
    path = Path(model_path)
    card_file = card_path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such model file")
    if not card_file.is_file():
        raise FileNotFoundError(f"{card_file}: the model card of {path.name} is missing (every best model is saved with one)")
    try:
        card = load_json(card_file)
    except ValueError as e:  # not JSON (json.JSONDecodeError, UnicodeDecodeError)
        raise ValueError(f"{card_file}: not a readable model card ({e})") from None
    if not isinstance(card, dict) or card.get("format") != MODEL_CARD_FORMAT:
        raise ValueError(f"{card_file}: not a model card of format {MODEL_CARD_FORMAT}")
    if card.get("model_file") != path.name:
        raise ValueError(f"{card_file} describes {card.get('model_file')}, not {path.name}")
    cfg = RunConfig.from_dict(card["config"])
    if (card.get("task"), card.get("method")) != (cfg.task, cfg.method):
        raise ValueError(f"{card_file}: task/method {card.get('task')}/{card.get('method')} but its config says {cfg.task}/{cfg.method}")
    task = build_task(cfg)
    model = build_method(cfg, task).build_model()
    try:
        state = load_torch(path, map_location=device)
    except RuntimeError as e:  # truncated or not a checkpoint: an input the user can replace
        raise ValueError(str(e)) from e
    check_weights(path, card)
    check_content(path, card)
    try:
        model.load_state_dict(state)
    except RuntimeError as e:
        detail = " ".join(str(e).split())[:300]
        raise ValueError(f"{path}: the weights do not fit the {cfg.task}/{cfg.method} network its card describes: {detail}") from None
    return SavedModel(path, card, task, model.to(device).eval())


def check_weights(path: Path, card: dict[str, Any]) -> None:
    """The sha256 of the weights file must be the card's `weights_sha256`: a card beside another model's
    weights (another site's, another run's) would describe a model it is not. A card written before the
    field existed is accepted with a warning that the pair cannot be checked."""
    card_file = card_path(path)
    expected = card.get("weights_sha256")
    if expected is None:
        log.warning("%s has no weights_sha256 (written by an older prrfl): cannot check that %s is its model", card_file, path.name)
        return
    actual = hashlib.sha256(path.read_bytes()).hexdigest()
    if actual != expected:
        raise ValueError(
            f"{path} (sha256 {actual[:12]}...) is not the model its card {card_file} was written for (weights_sha256 "
            f"{expected[:12]}...): put the .pt and .json saved together side by side"
        )


def check_content(path: Path, card: dict[str, Any]) -> None:
    """The card's bound fields (`BOUND_FIELDS`: its class names, preprocessing, config, ...) must be those it was
    written with (`content_sha256`): a card edited by hand, e.g. its class names reversed, would relabel every
    prediction silently. A card written before the field existed is accepted with a warning."""
    card_file = card_path(path)
    written = card.get("content_sha256")
    if written is None:
        log.warning("%s has no content_sha256 (written by an older prrfl): cannot check that it is unedited", card_file)
        return
    now = card_digests(card)
    changed = [f for f in BOUND_FIELDS if not isinstance(written, dict) or written.get(f) != now[f]]
    if changed:
        raise ValueError(
            f"{card_file}: {', '.join(changed)} changed since the card was written (its content_sha256 no longer matches): "
            "a model card edited by hand is refused; use the .pt and .json as they were saved together"
        )


def evaluate_saved_model(
    model_path: str | Path, data_root: str | Path, cohort: str | None = None, split: str = "test", device: str = "cpu"
) -> dict[str, Any]:
    """The task's metrics of a saved model on one split of prepared data (`cohort`: default the model's
    own). The data must be of the model's task and image size; the task says otherwise, naming the file."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {list(SPLITS)}, got {split!r}")
    saved = load_saved_model(model_path, device)
    cohort = cohort or saved.card["cohort"]
    try:
        data = saved.task.load_site(cohort, torch.device(device), str(data_root))
    except FileNotFoundError as e:
        raise FileNotFoundError(f"{e} (is {data_root} prepared {saved.card['task']} data with a cohort {cohort}?)") from None
    metrics = saved.task.evaluate(saved.model, data.split(split))
    return {
        "model": str(saved.path),
        "task": saved.card["task"],
        "method": saved.card["method"],
        "trained_at": f"{saved.card['site']} ({saved.card['cohort']}), round {saved.card['round']}",
        "data_root": str(data_root),
        "cohort": cohort,
        "split": split,
        "samples": len(data.split(split)),
        "metrics": metrics,
    }
