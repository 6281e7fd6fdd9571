"""A saved model at a hospital, without the federation: load a best model by its model card, and score it
on a prepared split (`prrfl evaluate`).

Every best model `best_<role>.pt` has its card `best_<role>.json` beside it (`SiteRuntime.model_card`):
the task, method and whole config that rebuild the network, the preprocessing its inputs need, the
metrics it was chosen with, and the sha256 of the weights file it was written with; and the sha256 of each of
its own fields (`content_sha256`). Nothing is re-typed by the user: what the card says is what is built, and a
card edited since it was written, or weights that are not the card's, are refused. A card that cannot be verified
(of the earlier format `prrfl-model-card/1`, whose checksum, if any, leaves fields unbound) is refused too, unless
the caller accepts it explicitly (`accept_unverified_card`, the CLI's --accept-unverified-card): then it is read
with a warning saying what could not be checked.
"""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from prrfl.config import RunConfig
from prrfl.naming import site_label
from prrfl.numerics import prepare_model
from prrfl.registry import build_method, build_task
from prrfl.site.state import (
    CARD_FIELDS,
    FORMAT_1_BOUND,
    MODEL_CARD_FORMAT,
    MODEL_CARD_FORMAT_1,
    MODEL_CARD_SUFFIX,
    field_digest,
)
from prrfl.storage import load_json, load_torch
from prrfl.tasks.contract import Task

log = logging.getLogger(__name__)

SPLITS = ("train", "valid", "test")
ACCEPT_UNVERIFIED_FLAG = "--accept-unverified-card"  # of prrfl predict / prrfl evaluate: accept_unverified_card=True


@dataclass
class SavedModel:
    path: Path
    card: dict[str, Any]
    task: Task
    model: torch.nn.Module
    weights_sha256: str  # of the weights file as read
    warnings: tuple[str, ...] = ()  # what could not be checked of an older card (logged as warnings too)

    def describe(self) -> str:
        """Which model this is, on one line: its file, site, run, round and the first 12 hex digits of its
        weights' sha256 (e.g. "derm/prr best_personal.pt of site-1_A, run r1, round 3, sha256 3f2a...": the site by its
        label, prrfl.naming)."""
        c = self.card
        return (
            f"{c['task']}/{c['method']} {c['model_file']} of {site_label(c['site'], c['cohort'])}, run {c['run_id']}, round {c['round']}, "
            f"sha256 {self.weights_sha256[:12]}"
        )


def card_path(model_path: str | Path) -> Path:
    return Path(model_path).with_suffix(MODEL_CARD_SUFFIX)


def load_saved_model(model_path: str | Path, device: str | torch.device = "cpu", *, accept_unverified_card: bool = False) -> SavedModel:
    """The model of a best-model file, rebuilt from its card, in evaluation mode, computing as it was trained (the
    card's config: `prrfl.numerics`; its weights are float32 whatever the precision). Errors name the file:
    a missing model or card, a card of another format, a card edited since it was written or one that cannot be
    verified (`check_content`), weights that are not the ones the card was written with (`check_weights`) or do
    not fit the card's network. `accept_unverified_card`: read a card that cannot be verified (an earlier format)
    with a warning (`SavedModel.warnings`) instead of refusing it (the default)."""
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
    if not isinstance(card, dict) or card.get("format") not in (MODEL_CARD_FORMAT, MODEL_CARD_FORMAT_1):
        found = f"its format is {card.get('format')!r:.80}" if isinstance(card, dict) else f"a JSON {type(card).__name__}"
        raise ValueError(
            f"{card_file}: not a model card this prrfl reads ({found}): cards are of format {MODEL_CARD_FORMAT} (or the "
            f"earlier {MODEL_CARD_FORMAT_1}, read only with {ACCEPT_UNVERIFIED_FLAG}); use the .pt and .json as they were saved together"
        )
    unchecked = [check_content(card_file, card, accept_unverified_card)]
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
    sha256 = hashlib.sha256(path.read_bytes()).hexdigest()
    unchecked.append(check_weights(path, card, sha256))
    try:
        model.load_state_dict(state)
    except RuntimeError as e:
        detail = " ".join(str(e).split())[:300]
        raise ValueError(f"{path}: the weights do not fit the {cfg.task}/{cfg.method} network its card describes: {detail}") from None
    warnings = tuple(w for w in unchecked if w)
    for warning in warnings:
        log.warning("%s", warning)
    return SavedModel(path, card, task, prepare_model(model.to(device), cfg).eval(), sha256, warnings)


def check_weights(path: Path, card: dict[str, Any], sha256: str) -> str | None:
    """The sha256 of the weights file (`sha256`) must be the card's `weights_sha256`: a card beside another
    model's weights (another site's, another run's) would describe a model it is not. A card of format 1
    written before the field existed is accepted: the returned warning says that the pair cannot be checked."""
    card_file = card_path(path)
    expected = card.get("weights_sha256")
    if expected is None:
        return f"{card_file} has no weights_sha256 (written by an older prrfl): cannot check that {path.name} is its model"
    if sha256 != expected:
        raise ValueError(
            f"{path} (sha256 {sha256[:12]}...) is not the model its card {card_file} was written for (weights_sha256 "
            f"{str(expected)[:12]}...): put the .pt and .json saved together side by side"
        )
    return None


def check_content(card_file: Path, card: dict[str, Any], accept_unverified: bool = False) -> str | None:
    """The card's fields must be those it was written with (`content_sha256`, the sha256 of each field): a card
    edited by hand, e.g. its class names reversed or its validation metrics raised, would relabel every prediction
    or hide that the model is at chance level. A ValueError names the fields that changed (added or removed ones
    too). A card of the current format must hold content_sha256, which binds all its fields (CARD_FIELDS). One of
    format 1, without it or with one that binds FORMAT_1_BOUND only (what it binds is checked first), cannot be
    verified: a ValueError says what cannot be checked and how to read it anyway, unless `accept_unverified`,
    when the returned warning says it (`unverified`)."""
    written = card.get("content_sha256")
    earlier = card["format"] == MODEL_CARD_FORMAT_1
    if written is None:
        if earlier:
            return unverified(
                f"{card_file} has no content_sha256 (a {MODEL_CARD_FORMAT_1} card of an older prrfl): cannot check that it is unedited",
                accept_unverified,
            )
        raise ValueError(
            f"{card_file}: no content_sha256, which every {MODEL_CARD_FORMAT} model card holds (the sha256 of each of its "
            "fields): a card without it cannot be checked and is refused; use the .pt and .json as they were saved together"
        )
    if not isinstance(written, dict):
        raise ValueError(f"{card_file}: content_sha256 must map each field of the card to its sha256, got {type(written).__name__}")
    bound = FORMAT_1_BOUND if earlier else (*CARD_FIELDS, *card)
    fields = [f for f in dict.fromkeys((*bound, *written)) if f != "content_sha256"]
    changed = [f for f in fields if written.get(f) != field_digest(card.get(f))]
    if changed:
        raise ValueError(
            f"{card_file}: {', '.join(changed)} changed since the card was written (its content_sha256 no longer matches): "
            "a model card edited by hand is refused; use the .pt and .json as they were saved together"
        )
    if not earlier:
        return None
    # what format 1 leaves unbound, whatever else a hand added to its content_sha256: at least its `format`
    unbound = [f for f in card if f not in FORMAT_1_BOUND and f != "content_sha256"]
    return unverified(
        f"{card_file} is a {MODEL_CARD_FORMAT_1} card (an older prrfl): its content_sha256 does not bind "
        f"{', '.join(unbound)}, so edits to them cannot be found",
        accept_unverified,
    )


def unverified(warning: str, accept: bool) -> str:
    """`warning` (what of a card cannot be checked, naming the card) when the caller accepts an unverified card;
    otherwise a ValueError saying it and how to read the card anyway."""
    if accept:
        return warning
    raise ValueError(
        f"{warning}; a model card that cannot be verified is refused (an edit to it, e.g. its class names reversed, would "
        f"relabel every prediction unnoticed): to read it anyway, with this warning in the output, pass "
        f"{ACCEPT_UNVERIFIED_FLAG} to prrfl predict / prrfl evaluate (accept_unverified_card=True in Python)"
    )


def evaluate_saved_model(
    model_path: str | Path,
    data_root: str | Path,
    cohort: str | None = None,
    split: str = "test",
    device: str = "cpu",
    *,
    accept_unverified_card: bool = False,
) -> dict[str, Any]:
    """The task's metrics of a saved model on one split of prepared data (`cohort`: default the model's
    own). The data must be of the model's task and image size; the task says otherwise, naming the file.
    `accept_unverified_card`: as load_saved_model's."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {list(SPLITS)}, got {split!r}")
    saved = load_saved_model(model_path, device, accept_unverified_card=accept_unverified_card)
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
        "trained_at": f"{site_label(saved.card['site'], saved.card['cohort'])}, round {saved.card['round']}",
        "data_root": str(data_root),
        "cohort": cohort,
        "split": split,
        "samples": len(data.split(split)),
        "metrics": metrics,
    }
