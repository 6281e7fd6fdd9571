"""Run configuration: one validated dataclass, sent by the server to every site with the first task.

Only site-local facts (data root, device, threads) are set at the site; everything that must agree
across sites (schedule, seeds, method options) lives here, in the job's server config.

A job travels as JSON and is edited by hand or with `--set`, so a value of the wrong kind is the
common mistake: the string "flase" would be truthy, the string "abc" a learning rate that fails
only at the first optimiser step. Every value is therefore checked against its type annotation
(`check_value`), here for the run's fields and by the registry for the method's and the task's
options, and a failure is a `ConfigError` naming the config field and what was expected.
"""

from __future__ import annotations

import collections.abc
import dataclasses
import difflib
import functools
import json
import re
import reprlib
import types
import typing
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, Union


class ConfigError(ValueError):
    """A configuration that must not run; the message names the config field and what was expected.
    A ValueError, so code that already refuses bad values with ValueError keeps working."""


_REPR = reprlib.Repr()
_REPR.maxstring = _REPR.maxother = 80  # a wrong value is quoted, but a huge one must not flood the line


def config_error(subject: str, expected: str, value: Any, path: str | None = None) -> ConfigError:
    """`<subject> must be <expected>, got <value>[ (config field '<path>')]`: the one format of a bad value.
    `path` names the field when the subject does not (an option inside method_args or data)."""
    where = f" (config field '{path}')" if path else ""
    return ConfigError(f"{subject} must be {expected}, got {_REPR.repr(value)}{where}")


# JSON words for the Python types a config may hold: (one value, several values)
_WORDS: dict[Any, tuple[str, str]] = {
    bool: ("true or false", "true/false values"),
    int: ("an integer", "integers"),
    float: ("a number", "numbers"),
    str: ("a string", "strings"),
    dict: ("a dict", "dicts"),
    type(None): ("null", "nulls"),
}
_SEQUENCES = (list, tuple, collections.abc.Sequence)


def describe(annotation: Any, plural: bool = False) -> str:
    """What a value of `annotation` looks like, in the words of a JSON config ("a list of numbers").
    Raises TypeError for an annotation the checker does not understand, so a new option with an
    exotic type fails the tests instead of passing unchecked."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if annotation is Any:
        return "values" if plural else "any value"
    if annotation in _WORDS or origin is dict:
        return _WORDS[origin or annotation][plural]
    if origin is Literal:
        return f"{'values from' if plural else 'one of'} {list(args)}"
    if origin in (Union, types.UnionType):
        return " or ".join(describe(a, plural) for a in sorted(args, key=lambda a: a is type(None)))
    if origin in _SEQUENCES:
        many = "lists" if plural else "a list"
        if origin is tuple and Ellipsis not in args:
            if len(set(args)) != 1:
                raise TypeError(f"cannot describe the mixed tuple {annotation!r}")
            return f"{many} of {len(args)} {describe(args[0], plural=True)}"
        return f"{many} of {describe(args[0], plural=True)}" if args else many
    raise TypeError(f"no config check for the annotation {annotation!r}")


def matches(value: Any, annotation: Any) -> bool:
    """Whether a JSON-like value fits `annotation`, strictly: a bool is not an int, an int is a
    float, a string is never a sequence, a Literal wants one of its values (and their type)."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if annotation is Any:
        return True
    if annotation is bool or annotation is str or annotation is type(None) or annotation is dict:
        return isinstance(value, annotation)
    if annotation is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if annotation is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if origin is Literal:
        return any(type(value) is type(a) and value == a for a in args)
    if origin in (Union, types.UnionType):
        return any(matches(value, a) for a in args)
    if origin is dict:
        return isinstance(value, dict) and all(matches(k, args[0]) and matches(v, args[1]) for k, v in value.items())
    if origin in _SEQUENCES:
        if not isinstance(value, (list, tuple)):
            return False
        if origin is tuple and Ellipsis not in args:
            return len(value) == len(args) and all(matches(v, a) for v, a in zip(value, args))
        return not args or all(matches(v, args[0]) for v in value)
    raise TypeError(f"no config check for the annotation {annotation!r}")


def check_value(value: Any, annotation: Any, subject: str, path: str | None = None) -> None:
    """Raise a ConfigError (see `config_error`) unless `value` fits `annotation`."""
    if not matches(value, annotation):
        raise config_error(subject, describe(annotation), value, path)


def _close_matches(unknown: list[str], known: list[str]) -> str:
    """' (did you mean 'x'?)' for the typos that resemble a known name, else ''."""
    guesses = {name: difflib.get_close_matches(name, known, n=1) for name in unknown}
    hints = [f"'{close[0]}'" + (f" for '{name}'" if len(unknown) > 1 else "") for name, close in guesses.items() if close]
    return f" (did you mean {', '.join(hints)}?)" if hints else ""


def unknown_names_error(what: str, unknown: Iterable[str], known: Iterable[str], where: str = "") -> ConfigError:
    """`unknown <what>(s) [...]<where> (did you mean ...?); expected some of [...]`."""
    unknown, known = sorted(unknown), sorted(known)
    return ConfigError(f"unknown {what}(s) {unknown}{where}{_close_matches(unknown, known)}; expected some of {known}")


def check_options(values: Any, annotations: Mapping[str, Any], owner: str, path: str) -> None:
    """Options held in the config field `path` (method_args, data): each must be one of
    `annotations` and fit its annotation. `owner` says whose options they are ("method 'prr'")."""
    if not isinstance(values, dict):
        raise config_error(f"config field '{path}'", "a dict", values)
    unknown = set(values) - set(annotations)
    if unknown:
        raise unknown_names_error(f"{owner} option", unknown, annotations, where=f" in config field '{path}'")
    for name, value in values.items():
        check_value(value, annotations[name], f"{owner} option '{name}'", f"{path}.{name}")


def check_name(value: Any, known: Iterable[str], path: str) -> None:
    """A name that must be one of `known` (a task, a method), with a suggestion for a typo."""
    known = sorted(known)
    if value not in known:
        hint = _close_matches([value], known) if isinstance(value, str) else ""
        raise ConfigError(f"config field '{path}' must be one of {known}, got {_REPR.repr(value)}{hint}")


def with_settings(values: Mapping[str, Any], settings: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of the config dict `values` with `settings` set; a dotted key reaches a nested dict
    ({"data.image_size": 128} sets values["data"]["image_size"]). Values are checked where the config
    is built, not here."""
    values = json.loads(json.dumps(dict(values)))
    for key, value in settings.items():
        *parents, leaf = str(key).split(".")
        node = values
        for depth, part in enumerate(parents, 1):
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ConfigError(f"config field '{'.'.join(parents[:depth])}' holds no fields")
        node[leaf] = value
    return values


def apply_overrides(values: dict, assignments: list[str]) -> dict:
    """KEY=VALUE settings into a config dict; dotted keys reach nested dicts (data.image_size=128),
    values are JSON when they parse (numbers, true, lists), strings otherwise. The values are
    checked where the config is built (prrfl.registry.validate_config), so `lr=abc` is refused there by name."""
    for item in assignments:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"--set expects KEY=VALUE, got {item!r}")
        try:
            value = json.loads(raw)
        except json.JSONDecodeError:
            value = raw
        try:
            values = with_settings(values, {key: value})
        except ConfigError as e:
            raise ConfigError(f"--set {item}: {e}") from None
    return values


MinSites = int | Literal["all", "majority"]
_FOLDER_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


@dataclass
class RunConfig:
    task: str = "derm"
    method: str = "prr"
    run_name: str = "derm_prr"  # names the persistent state folders on the server and the sites
    num_rounds: int = 5
    local_epochs: int = 2
    batch_size: int = 16
    optimizer: Literal["sgd", "adam"] = "sgd"  # the paper: SGD for dermoscopy, Adam for prostate MRI
    lr: float = 1e-2
    lr_step_epochs: int = 25  # the paper halves the learning rate every 25 epochs
    lr_gamma: float = 0.5
    momentum: float = 0.0  # SGD only
    weight_decay: float = 1e-6
    seed: int = 0
    # sites that must answer each round: a number, "all", or "majority" (a strict majority of the
    # sites that prepared their data); see required_sites
    min_sites: MinSites = "majority"
    select_from_round: int = 0  # best-on-validation selection considers rounds >= this (authors: 40 of 50)
    # the server rejects an upload whose update norm exceeds this multiple of the round's lower median
    # update norm (from 2 uploads on) or of the site's own recent accepted norms; null: off. And, when set,
    # one whose update norm exceeds update_norm_max. See prrfl.server.checks.norm_outliers
    update_norm_ratio: float | None = 10.0
    update_norm_max: float | None = None
    eval_test_every_epoch: bool = True  # per-epoch test curves (retrogress plots)
    # a method with a global model (FedAvg, FedProx, IDA, FedBN, SiloBN, HarmoFL) reports it as each site receives
    # it, scored when the download arrives (its papers' protocol); false: its site's model after the local epochs,
    # as personalized methods report theirs (Method.reports_download)
    report_global_model: bool = True
    # the classification term of every model a site trains (classification tasks): "method", the method's own (cross
    # entropy, or its imbalance loss: PRR's CPA, FedFocal's focal loss, ...); "balanced_softmax", the balanced softmax
    # of the site's own class prior for every method, as FCA trains every framework it compares (Method.supervised_loss)
    class_loss: Literal["method", "balanced_softmax"] = "method"
    # how every model a site trains and evaluates computes (prrfl.numerics), the same weights either way: "float32",
    # or "bf16", each model's forward under bfloat16 autocast (weights, optimiser state, losses and checkpoints
    # stay float32); channels_last: 4-D weights and inputs in channels-last memory order (a GPU's faster conv
    # kernels); torch_compile: each trained model's forward (and so its backward) compiled by torch.compile.
    # They change the numbers in their last bits or more: float32 stays the default until they are shown equal
    # over seeds (docs/running.md, "Faster numerics on a GPU")
    precision: Literal["float32", "bf16"] = "float32"
    channels_last: bool = False
    torch_compile: bool = False
    method_args: dict[str, Any] = field(default_factory=dict)
    data: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name, annotation in _field_types().items():
            check_value(getattr(self, name), annotation, f"config field '{name}'")
        for name in ("num_rounds", "local_epochs", "batch_size", "lr_step_epochs"):
            self._require(name, getattr(self, name) >= 1, "a positive integer")
        for name in ("lr", "lr_gamma"):
            self._require(name, getattr(self, name) > 0, "> 0")
        for name in ("momentum", "weight_decay"):  # torch's SGD refuses negative ones, but only at the site
            self._require(name, getattr(self, name) >= 0, ">= 0")
        self._require("select_from_round", 0 <= self.select_from_round < self.num_rounds, f"in [0, num_rounds={self.num_rounds})")
        self._require("update_norm_ratio", self.update_norm_ratio is None or self.update_norm_ratio > 1, "> 1 or null (off)")
        self._require("update_norm_max", self.update_norm_max is None or self.update_norm_max > 0, "> 0 or null (off)")
        positive = isinstance(self.min_sites, str) or self.min_sites >= 1
        self._require("min_sites", positive, "a positive integer, 'all' or 'majority'")
        # a path component at the server and every site: "../x" or "/x" would leave the workspace
        folder = _FOLDER_NAME.fullmatch(self.run_name) is not None
        self._require("run_name", folder, "a folder name of letters, digits, '.', '_' and '-'")

    def _require(self, name: str, ok: bool, expected: str) -> None:
        if not ok:
            raise config_error(f"config field '{name}'", expected, getattr(self, name))

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> RunConfig:
        if not isinstance(values, dict):
            raise config_error("a run configuration", "a dict of config fields", values)
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = set(values) - known
        if unknown:
            raise unknown_names_error("config field", unknown, known)
        return cls(**values)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def lr_at(self, epoch: int) -> float:
        """Step schedule over the global epoch index (round * local_epochs + local epoch)."""
        return self.lr * self.lr_gamma ** (epoch // self.lr_step_epochs)

    def required_sites(self, n: int) -> int:
        """How many of `n` sites (those that prepared their data) must answer each round: min_sites
        itself, all n, or a strict majority n // 2 + 1 (3 of 4, 2 of 2, 2 of 3). At least 1, so a
        federation in which no site prepared never goes on. An integer min_sites above n is a
        ConfigError: the job cannot go on with these sites."""
        if self.min_sites == "all":
            return max(n, 1)
        if self.min_sites == "majority":
            return n // 2 + 1
        if self.min_sites > n:
            raise ConfigError(f"config field 'min_sites' asks for {self.min_sites} sites, but there are only {n}")
        return self.min_sites


# The run's fields that make a run a variant of its method, reported apart from the method's own runs and named
# in its label as an ablation's method_args are (prrfl.report.variant_label): the classification term and the
# numerics (prrfl.numerics)
VARIANT_FIELDS = ("class_loss", "precision", "channels_last", "torch_compile")


def variant_settings(values: Mapping[str, Any]) -> dict[str, Any]:
    """The VARIANT_FIELDS of a config or a site's results (a dict) that are not RunConfig's defaults; a field
    the dict lacks is its default (a run recorded before the field existed ran as the default does)."""
    defaults = {f.name: f.default for f in dataclasses.fields(RunConfig)}
    return {name: values[name] for name in VARIANT_FIELDS if name in values and values[name] != defaults[name]}


@functools.cache
def _field_types() -> dict[str, Any]:
    """RunConfig's field annotations, evaluated (they are strings under `from __future__ import annotations`)."""
    return typing.get_type_hints(RunConfig)
