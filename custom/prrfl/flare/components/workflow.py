"""`PersonalizedFedAvg`: FedAvg's loop with one model per client. FedAvg, FedBN and PFA are three
aggregators on this one controller.

Each round the controller sends every client ITS OWN model (`PerClientController.send_each`), turns the
results into full weights, lets the aggregator compute one new model per client and, when it has a
`PrototypeExchange`, adds the global class counts and prototypes to each client's next model. A client
that fails, is missing or whose result cannot be used keeps its previous model; fewer than `min_clients`
usable results stop the job. At the end every client's final model is saved as
`<run dir>/models/<client>.pt` (a state dict, `torch.save`).

The server keeps, per client, the last FULL model it knows of that client: what it sent, with the keys of
the aggregate replaced. A client may return only some keys (e.g. its shared weights, keeping BatchNorm at
home): the aggregator sees those, the others stay as they were. Results may be FULL weights or a DIFF
against what was sent (a ScriptRunner with params_transfer_type=DIFF); params travel as torch tensors
(ScriptRunner(server_expected_format=ExchangeFormat.PYTORCH)); numpy arrays are accepted too.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from nvflare.app_common.abstract.fl_model import FLModel, ParamsType
from nvflare.app_opt.pt.decomposers import TensorDecomposer
from nvflare.fuel.utils import fobs
from torch import nn

from prrfl.flare.components.aggregators import PerClientAggregator
from prrfl.flare.components.controller import Answers, PerClientController
from prrfl.flare.components.prototypes import PrototypeExchange
from prrfl.flare.places import differences
from prrfl.keys import CLASS_COUNTS, PROTOTYPES
from prrfl.server.aggregation import add_difference, as_tensors
from prrfl.server.checks import params_problem
from prrfl.server.class_statistics import usable_statistics
from prrfl.storage import load_torch, save_torch

MODELS_DIR = "models"  # under the job's run dir on the server: <client>.pt per client
STATE_FILE = "personalized_fedavg_state.pt"  # in state_dir: what a resumed job continues from


def full_weights(result: FLModel, sent: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A result's params as full weights: FULL as they are (the aggregator checks them), DIFF added to what was
    `sent` (in its dtype) once checked against it. KeyError for a key that was not sent; ValueError for another
    params type or a difference the checks refuse (prrfl.server.checks.params_problem: not tensors, another
    shape or kind of values, NaN or Inf)."""
    params = as_tensors(result.params or {})
    if result.params_type in (None, ParamsType.FULL):
        return params
    if result.params_type != ParamsType.DIFF:
        raise ValueError(f"cannot use params of type {result.params_type}")
    unknown = sorted(set(params) - set(sent), key=str) if isinstance(params, Mapping) else []
    if unknown:
        raise KeyError(f"a difference for keys that were not sent: {unknown[:5]}")
    problem = params_problem(params, sent, subset=True)
    if problem:  # named as the aggregator names the client of a refused result
        raise ValueError(f"{(result.meta or {}).get('client_name', 'the result')}: {problem}")
    return add_difference(params, sent)


def component_arguments(component: object | None) -> dict[str, Any] | None:
    """A component's class and constructor arguments (the attributes named like them, as FLARE's job export reads
    them back); None for no component."""
    if component is None:
        return None
    names = [name for name in inspect.signature(type(component).__init__).parameters if name != "self"]
    return {"class": type(component).__name__, **{name: getattr(component, name) for name in names if hasattr(component, name)}}


class PersonalizedFedAvg(PerClientController):
    """FedAvg's rounds with a `PerClientAggregator`: every client trains and receives a model of its own.

    num_rounds: rounds to run. aggregator: a PerClientAggregator (FedAvgAggregator, FedBNAggregator,
    FourierAggregator, ...). model: the initial model of every client, an nn.Module (its state dict is
    used; in an exported job the module is rebuilt from its class and arguments) or a state dict (in a job
    built and run in Python only). num_clients: clients trained per round, as FLARE FedAvg's `num_clients`: a
    random subset of the connected clients (FLARE's `sample_clients`) when fewer than are connected; a client
    left out of a round keeps its model; None (default): every connected client, every round. min_clients:
    usable results needed in every round (fewer stop the job with an error naming the clients). prototypes: a
    PrototypeExchange whose global statistics go into the meta of every client's next model. task_name:
    the clients' train task. timeout: seconds a round waits for results (None or 0, as FLARE's FedAvg: no
    deadline; a round then waits until every client answered, failed or is gone). key_metric: the metric (in a result's `metrics`) by which each client's best model is chosen,
    as FLARE's IntimeModelSelector chooses the global one: a Client API script reports the score of the model
    it received, and the server keeps, per client, the model it sent in the round that scored best
    (`<run dir>/models/<client>.best.pt`; higher is better, or lower with negate_key_metric); None: no selection.
    state_dir: a folder (on the server, outside the job's workspace) where the controller saves its state after
    every round, atomically: each client's model, the meta of its next model, its best score, the prototype
    exchange's generator and the next round; "" (default): nothing is saved. resume: continue from the state
    saved there (a re-submitted job goes on at the round after the last completed one; False: a saved state
    is ignored and overwritten). The state records its job (`identity`: the model's entries, the aggregator's
    and the exchange's class and arguments, the task name); a state of another job, or one none of whose
    clients is connected, is refused when the job starts, in one line naming the file and what differs.
    """

    def __init__(
        self,
        num_rounds: int,
        aggregator: PerClientAggregator,
        model: nn.Module | Mapping[str, torch.Tensor],
        min_clients: int = 1,
        prototypes: PrototypeExchange | None = None,
        task_name: str = "train",
        timeout: float | None = None,
        key_metric: str | None = "accuracy",
        negate_key_metric: bool = False,
        state_dir: str = "",
        resume: bool = False,
        num_clients: int | None = None,
    ):
        super().__init__(persistor_id="")  # no persistor: the controller keeps and saves one model per client
        if not isinstance(num_rounds, int) or num_rounds < 1:
            raise ValueError(f"num_rounds must be a positive integer, got {num_rounds!r}")
        if not isinstance(min_clients, int) or min_clients < 1:
            raise ValueError(f"min_clients must be a positive integer, got {min_clients!r}")
        if not isinstance(aggregator, PerClientAggregator):
            raise TypeError(f"aggregator must be a PerClientAggregator, got {type(aggregator).__name__}")
        if prototypes is not None and not isinstance(prototypes, PrototypeExchange):
            raise TypeError(f"prototypes must be a PrototypeExchange, got {type(prototypes).__name__}")
        if num_clients is not None and (not isinstance(num_clients, int) or num_clients < min_clients):
            raise ValueError(f"num_clients must be None or an integer of at least min_clients={min_clients}, got {num_clients!r}")
        if timeout is not None and not timeout >= 0:
            raise ValueError(f"timeout must be seconds >= 0 (0 or None: no deadline), got {timeout!r}")
        # attributes named like the arguments: FLARE's job export reads them back
        self.num_rounds, self.aggregator, self.model = num_rounds, aggregator, model
        self.min_clients, self.prototypes, self.task_name, self.timeout = min_clients, prototypes, task_name, timeout
        self.key_metric, self.negate_key_metric, self.num_clients = key_metric, negate_key_metric, num_clients
        if resume and not state_dir:
            raise ValueError("resume=True needs the state_dir the earlier job saved its state in")
        self.state_dir, self.resume = state_dir, resume
        self.best: dict[str, tuple[float, int]] = {}  # client -> (its best key metric, the round of that model)
        self.models: dict[str, dict[str, torch.Tensor]] = {}  # client -> its current full model
        self.next_meta: dict[str, dict[str, Any]] = {}  # client -> meta for its next model (global statistics)

    def initial_state(self) -> dict[str, torch.Tensor]:
        state = self.model.state_dict() if isinstance(self.model, nn.Module) else self.model
        return {k: v.detach().cpu().clone() for k, v in state.items()}

    def run(self) -> None:
        fobs.register(TensorDecomposer)
        try:
            self._run()
        finally:
            self.release_lost()

    def _run(self) -> None:
        initial = self.initial_state()
        try:  # the aggregator learns the model's keys and shapes (results are checked against them) and its BatchNorm layers
            self.aggregator.use_model(self.model if isinstance(self.model, nn.Module) else None)
        except ValueError as e:
            self.panic(f"the job cannot start: {e}")
            return
        self.aggregator.set_reference(initial)
        self._initial = initial
        try:
            first = self._load_state(self.sample_clients())
        except (OSError, RuntimeError, KeyError, ValueError) as e:
            self.panic(f"the job cannot start: {e}")
            return
        if self.run_rounds(first, self.num_rounds, self.task_name):
            self._save_models()

    # ----- state, for resume ---------------------------------------------------------------------------
    def _state_file(self) -> Path:
        return Path(self.state_dir) / STATE_FILE

    def identity(self) -> dict[str, Any]:
        """What a saved state records of its job, compared when a job resumes it: the model's entries (key -> shape
        and dtype), the aggregator's and the prototype exchange's class and arguments, and the task name.
        num_rounds, min_clients, num_clients, timeout and key_metric may change from one job of a run to the next."""
        return {
            "model": {k: f"{tuple(v.shape)} {v.dtype}" for k, v in self._initial.items()},
            "aggregator": component_arguments(self.aggregator),
            "prototypes": component_arguments(self.prototypes),
            "task_name": self.task_name,
        }

    def _load_state(self, clients: list[str]) -> int:
        """The round to start from: 0, or with resume the round after the last completed one of the saved state.
        ValueError naming the file when the state is another job's, or none of its clients is among `clients`."""
        if not self.resume:
            return 0
        path = self._state_file()
        if not path.exists():
            self.warning(f"resume=True but {path} does not exist: starting at round 0")
            return 0
        saved = load_torch(path)
        if not isinstance(saved, dict) or not {"next_round", "models", "next_meta", "best"} <= set(saved):
            raise ValueError(f"cannot resume from {path}: it is not a state saved by {type(self).__name__}")
        if "identity" not in saved:
            self.warning(f"{path} does not record the job that saved it: it is resumed without comparing that job with this one")
        differ = differences(saved.get("identity", self.identity()), self.identity())
        if saved["models"] and not set(saved["models"]) & set(clients):
            differ.append(f"its clients {sorted(saved['models'])} are none of this job's {sorted(clients)}")
        if differ:
            raise ValueError(f"cannot resume from {path}: it is the state of another job: {'; '.join(differ)}")
        self.models, self.next_meta, self.best = saved["models"], saved["next_meta"], saved["best"]
        if self.prototypes is not None and saved.get("prototypes") is not None:
            self.prototypes.load_state_dict(saved["prototypes"])
        self.info(f"resuming from {path}: rounds 0-{saved['next_round'] - 1} were completed")
        return saved["next_round"]

    def _save_state(self, next_round: int) -> None:
        state = {
            "identity": self.identity(),
            "next_round": next_round,
            "models": self.models,
            "next_meta": self.next_meta,
            "best": self.best,
            "prototypes": None if self.prototypes is None else self.prototypes.state_dict(),
        }
        save_torch(state, self._state_file())

    # ----- the hooks of PerClientController.run_rounds ---------------------------------------------------
    def round_clients(self, round_idx: int) -> list[str]:
        clients = sorted(self.sample_clients(self.num_clients))
        for client in clients:
            self.models.setdefault(client, {k: v.clone() for k, v in self._initial.items()})
        return clients

    def round_models(self, clients: list[str], round_idx: int) -> dict[str, FLModel]:
        return {
            c: FLModel(
                params_type=ParamsType.FULL,
                params=self.models[c],
                current_round=round_idx,
                total_rounds=self.num_rounds,
                meta=dict(self.next_meta.get(c, {})),
            )
            for c in clients
        }

    def round_deadline(self, round_idx: int) -> float | None:
        return self.timeout or None  # 0, as FLARE's FedAvg: no deadline

    def aggregate_round(self, round_idx: int, clients: list[str], answers: Answers) -> dict[str, FLModel] | None:
        """The aggregator's outputs from the usable results; a client without one keeps its model. Fewer usable
        results than min_clients, or a failed aggregation, stop the job."""
        for client, why in sorted(answers.missing.items()):
            self.warning(f"round {round_idx}: no result from {client}: {why}; it keeps its previous model")
        accepted = self._accept(answers.results, round_idx)
        if len(accepted) < self.min_clients:
            self.panic(
                f"round {round_idx}: only {len(accepted)} of {len(clients)} clients sent a usable result ({sorted(accepted)}), "
                f"fewer than min_clients={self.min_clients}; the job stops"
            )
            return None
        try:
            outputs = self.aggregator.aggregate_models(round_idx, self.num_rounds)
        except ValueError as e:  # e.g. clients' models of different shapes
            self.panic(f"round {round_idx}: the aggregation failed: {e}; the job stops")
            return None
        finally:
            self.aggregator.reset_stats()
        if self.prototypes is not None:
            self.next_meta.update(self.prototypes.exchange(self._statistics(answers.results, accepted, round_idx), clients))
        return outputs

    def end_round(self, round_idx: int, outputs: dict[str, FLModel]) -> bool:
        for client, output in outputs.items():
            self.models[client].update(output.params)
        meta = next(iter(outputs.values())).meta
        self.info(f"round {round_idx} done: aggregated {sorted(outputs)}" + (f"; {meta}" if meta else ""))
        if self.state_dir:
            try:
                self._save_state(round_idx + 1)
            except OSError as e:
                self.panic(f"round {round_idx}: cannot save the controller's state in {self.state_dir}: {e}; the job stops")
                return False
        return True

    def _accept(self, results: Mapping[str, FLModel], round_idx: int) -> list[str]:
        """The aggregator takes each usable result (as full weights), then refuses those that disagree with the
        round's others (their keys, the unit of their weight: `PerClientAggregator.refuse_disagreeing`); returns
        the clients it kept. Each refused client is named with the reason and keeps its previous model."""
        self.aggregator.reset_stats()
        refused = {}
        for client in sorted(results):
            result = results[client]
            self._select(client, result, round_idx)
            try:
                full = full_weights(result, self.models[client])
                self.aggregator.accept_model(FLModel(params_type=ParamsType.FULL, params=full, meta=dict(result.meta or {})))
            except (KeyError, ValueError) as e:
                refused[client] = e
        refused.update(self.aggregator.refuse_disagreeing())
        for client, why in sorted(refused.items()):
            self.error(f"round {round_idx}: the result of {client} cannot be used: {why}; it keeps its previous model")
        return [client for client in sorted(results) if client not in refused]

    def _statistics(self, results: Mapping[str, FLModel], accepted: list[str], round_idx: int) -> dict[str, dict[str, Any]]:
        """The accepted clients' metas for the prototype exchange; a client that sent no class counts or
        prototypes, or unusable ones (malformed, or of another number of classes or width than the round's
        others: `prrfl.server.class_statistics.usable_statistics`), is named in a warning and those are left out."""
        metas = {client: dict(results[client].meta or {}) for client in accepted}
        for client, meta in metas.items():
            lacking = [key for key in (CLASS_COUNTS, PROTOTYPES) if key not in meta]
            if lacking:
                self.warning(
                    f"round {round_idx}: {client} sent no {' and no '.join(lacking)}: it is left out of the global statistics "
                    "(PrototypeTracker.attach puts them into the result)"
                )
        usable, left_out = usable_statistics(metas)
        for client, why in left_out:
            self.warning(f"round {round_idx}: {client}: {why}")
        return usable

    def _select(self, client: str, result: FLModel, round_idx: int) -> None:
        """When the result scores the model the client was sent this round better than any before (key_metric),
        that model becomes the client's best (saved atomically at once, so a job that stops keeps it)."""
        if self.key_metric is None:
            return
        value = result.metrics.get(self.key_metric) if isinstance(result.metrics, Mapping) else None
        if not isinstance(value, (int, float)) or isinstance(value, bool) or value != value:
            if round_idx == 0:
                self.warning(f"{client} reports no number as metrics[{self.key_metric!r}]: no best model is chosen for it")
            return
        score = -value if self.negate_key_metric else value
        if client in self.best and score <= self.best[client][0]:
            return
        self.best[client] = (score, round_idx)
        save_torch(self.models[client], self._models_dir() / f"{client}.best.pt")
        self.info(f"round {round_idx}: the model {client} was sent is its best so far ({self.key_metric} {value:g})")

    def _models_dir(self) -> Path:
        return Path(self.engine.get_workspace().get_run_dir(self.fl_ctx.get_job_id())) / MODELS_DIR

    def _save_models(self) -> None:
        folder = self._models_dir()
        for client, state in sorted(self.models.items()):
            save_torch(state, folder / f"{client}.pt")
        self.info(f"saved the final model of each of {len(self.models)} clients to {folder}/<client>.pt")
        if self.best:
            best = ", ".join(
                f"{c} round {r} ({self.key_metric} {-s if self.negate_key_metric else s:g})" for c, (s, r) in sorted(self.best.items())
            )
            self.info(f"each client's best model ({folder}/<client>.best.pt): {best}")
