"""Personalized federated learning as FLARE components, usable from any FLARE job (docs/components.md).

None of them needs prrfl's own runtime (run config, registry, tasks, site runtime). Their math is prrfl's
server core (prrfl.server: aggregation, upload checks, the prototype exchange; no FLARE import), the same
code prrfl's own jobs run; the meta keys are prrfl.keys.

Server:
* `PerClientController`: a ModelController whose clients each get a model of their own (`send_each`).
* `PersonalizedFedAvg`: FedAvg's rounds on a PerClientController with a per-client aggregator; saves each
  client's final model as `<run dir>/models/<client>.pt`.
* `PerClientAggregator`: base of the aggregators (accept_model / aggregate_models / reset_stats, and the pure
  `aggregate_states` on state dicts); `FedAvgAggregator`, `FedBNAggregator` (BatchNorm kept at each
  client) and `FourierAggregator` (Progressive Fourier Aggregation, PRR).
* `PrototypeExchange`: global class counts and sampled global class prototypes for each client's next model.

Client (Client API scripts):
* `PrototypeTracker`: per-class mean embeddings, attached to the result's meta.
* `GlobalStatistics`: the global counts and prototypes a received model carries.
* `PersonalizedPair`: a personalized model and its deputy (Deputy-Enhanced Transfer, PRR).
"""

from prrfl.flare.components.aggregators import (
    NUM_SAMPLES,
    NUM_STEPS,
    PFA_R,
    FedAvgAggregator,
    FedBNAggregator,
    FourierAggregator,
    PerClientAggregator,
)
from prrfl.flare.components.client import PersonalizedPair
from prrfl.flare.components.controller import Answers, PerClientController
from prrfl.flare.components.prototypes import (
    CLASS_COUNTS,
    GLOBAL_CLASS_COUNTS,
    GLOBAL_PROTOTYPE_PRESENT,
    GLOBAL_PROTOTYPES,
    PROTOTYPE_PRESENT,
    PROTOTYPES,
    GlobalStatistics,
    PrototypeExchange,
    PrototypeTracker,
)
from prrfl.flare.components.workflow import MODELS_DIR, PersonalizedFedAvg

__all__ = [
    "CLASS_COUNTS",
    "GLOBAL_CLASS_COUNTS",
    "GLOBAL_PROTOTYPES",
    "GLOBAL_PROTOTYPE_PRESENT",
    "MODELS_DIR",
    "NUM_SAMPLES",
    "NUM_STEPS",
    "PFA_R",
    "PROTOTYPES",
    "PROTOTYPE_PRESENT",
    "Answers",
    "FedAvgAggregator",
    "FedBNAggregator",
    "FourierAggregator",
    "GlobalStatistics",
    "PerClientAggregator",
    "PerClientController",
    "PersonalizedFedAvg",
    "PersonalizedPair",
    "PrototypeExchange",
    "PrototypeTracker",
]
