"""`PersonalizedFedAvgRecipe`: the components as a FLARE 2.9 Recipe with the hello-pt surface, runnable on
SimEnv, PocEnv and ProdEnv, on which FLARE's `add_experiment_tracking` and `add_cross_site_evaluation` work.

    recipe = PersonalizedFedAvgRecipe(name="pfa", model=Net(), train_script="client.py", num_rounds=5, min_clients=2,
                                      aggregator=FourierAggregator())
    add_experiment_tracking(recipe, "tensorboard")
    add_cross_site_evaluation(recipe)  # every client scores every client's final model
    recipe.execute(SimEnv(num_clients=2))

Cross-site evaluation of per-client models: FLARE's `add_cross_site_evaluation` evaluates the models a
PyTorch recipe's persistor lists. Here that persistor (`PerClientModels`) lists each client's final model as
`PersonalizedFedAvg` saved it, named after the client, so every client is sent every client's personalized
model in a validate task (`flare.is_evaluate()` in the script, as hello-pt) and FLARE's matrix
(`cross_site_val/cross_val_results.json`) is data site -> model of site. The clients' own `submit_model`
answers, when the script gives some, are evaluated as well, as FLARE does.
"""

from __future__ import annotations

from pathlib import Path

from nvflare.apis.event_type import EventType
from nvflare.apis.fl_context import FLContext
from nvflare.app_common.abstract.model import ModelLearnable, make_model_learnable
from nvflare.app_common.model_desc import ModelDescriptor
from nvflare.app_opt.pt.file_model_persistor import PTFileModelPersistor
from nvflare.client.config import ExchangeFormat, TransferType
from nvflare.job_config.base_fed_job import BaseFedJob
from nvflare.job_config.script_runner import FrameworkType, ScriptRunner
from nvflare.recipe.spec import Recipe
from torch import nn

from prrfl.flare.components.aggregators import FourierAggregator, PerClientAggregator
from prrfl.flare.components.prototypes import PrototypeExchange
from prrfl.flare.components.workflow import MODELS_DIR, PersonalizedFedAvg
from prrfl.storage import load_torch

PERSISTOR_ID = "persistor"


class PerClientModels(PTFileModelPersistor):
    """The clients' final models of a `PersonalizedFedAvg` run (`<run dir>/models/<client>.pt`) as the models
    of the server, each named after its client, for FLARE's cross-site evaluation (its PTFileModelLocator
    reads a PTFileModelPersistor). It loads no initial model: the controller has its own."""

    def __init__(self):
        super().__init__(model=None)
        self.folder: Path | None = None

    def handle_event(self, event: str, fl_ctx: FLContext) -> None:
        if event == EventType.START_RUN:
            self.folder = Path(fl_ctx.get_engine().get_workspace().get_run_dir(fl_ctx.get_job_id())) / MODELS_DIR

    def get_model_inventory(self, fl_ctx: FLContext) -> dict[str, ModelDescriptor]:
        if self.folder is None or not self.folder.is_dir():
            return {}
        return {
            p.stem: ModelDescriptor(name=p.stem, location=str(p), model_format="PT_STATE_DICT", props={"client": p.stem})
            for p in sorted(self.folder.glob("*.pt"))
            if not p.stem.endswith(".best")
        }

    def get_model(self, model_file: str, fl_ctx: FLContext) -> ModelLearnable | None:
        desc = self.get_model_inventory(fl_ctx).get(model_file)
        return None if desc is None else make_model_learnable(load_torch(desc.location), {})

    get = get_model  # PTFileModelLocator asks for `get`


class PersonalizedFedAvgRecipe(Recipe):
    """A job of `PersonalizedFedAvg` (one model per client) and a Client API `train_script` at every client.

    name, model (nn.Module), train_script, train_args, num_rounds, min_clients: as FLARE's FedAvgRecipe.
    aggregator: a PerClientAggregator (default FourierAggregator(): PFA). prototypes: a PrototypeExchange or
    None. key_metric: each client's best model by this metric of its results (PersonalizedFedAvg). timeout:
    seconds a round waits (None or 0: until all answered, failed or are gone). num_clients: clients per round
    (None: every connected client; a number: FLARE's random subset, as FedAvg's num_clients). state_dir, resume: see PersonalizedFedAvg.
    launch_external_process: the script in a process of its own (FLARE's ScriptRunner option).
    The clients exchange torch tensors and send the difference to what they received. prrfl is imported from the
    installation, never copied into the job: the server needs it; a client only when its train script imports it
    (the clients' configuration names no prrfl class).
    """

    framework = FrameworkType.PYTORCH  # FLARE's add_cross_site_evaluation reads it

    def __init__(
        self,
        *,
        name: str = "personalized_fedavg",
        model: nn.Module,
        train_script: str,
        train_args: str = "",
        num_rounds: int = 2,
        min_clients: int = 2,
        aggregator: PerClientAggregator | None = None,
        prototypes: PrototypeExchange | None = None,
        key_metric: str | None = "accuracy",
        timeout: float | None = None,
        state_dir: str = "",
        resume: bool = False,
        launch_external_process: bool = False,
        num_clients: int | None = None,
    ):
        if not isinstance(model, nn.Module):
            raise TypeError(f"model must be an nn.Module (the clients' network), got {type(model).__name__}")
        if not Path(train_script).is_file():
            raise FileNotFoundError(f"train_script {train_script} does not exist")
        self.model, self.train_script, self.train_args, self.num_rounds = model, train_script, train_args, num_rounds
        # key_metric="": no FLARE IntimeModelSelector (one global best model); the controller selects per client
        job = BaseFedJob(name=name, min_clients=min_clients, key_metric="")
        job.set_app_packages(["prrfl"])  # imported from the sites' installation, never copied in part
        job.comp_ids["persistor_id"] = job.to_server(PerClientModels(), id=PERSISTOR_ID)
        controller = PersonalizedFedAvg(
            num_rounds=num_rounds,
            aggregator=aggregator if aggregator is not None else FourierAggregator(),
            model=model,
            min_clients=min_clients,
            prototypes=prototypes,
            timeout=timeout,
            key_metric=key_metric,
            state_dir=state_dir,
            resume=resume,
            num_clients=num_clients,
        )
        job.to_server(controller)
        job.to_clients(
            ScriptRunner(
                script=train_script,
                script_args=train_args,
                launch_external_process=launch_external_process,
                params_transfer_type=TransferType.DIFF,
                server_expected_format=ExchangeFormat.PYTORCH,
            )
        )
        super().__init__(job)
