"""IDA: Inverse Distance Aggregation (Yeganeh et al., MICCAI DCL workshop 2020)."""

from __future__ import annotations

from typing import Any

import torch

from prrfl.messages import Upload
from prrfl.methods.fedavg import FedAvg
from prrfl.server import aggregation

_EPS = 1e-12  # a site exactly at the mean would otherwise get an infinite weight


class IDA(FedAvg):
    """FedAvg whose site weights are the inverse distances of the site models to their mean:
    alpha_k = (1 / ||theta_mean - theta_k||) / sum_j (1 / ||theta_mean - theta_j||).

    Choices: theta_mean is the plain mean of the uploaded models (`weighting="samples"`: the FedAvg
    average instead); the distance is the Euclidean norm over all trainable parameters flattened
    into one vector (BatchNorm running statistics are averaged with the IDA weights but do not enter
    the distance); distances are floored at 1e-12. Pure IDA: neither sample counts nor training
    accuracy (the paper's INTRAC variant) enter the weights. The whole model travels; sites evaluate
    their model after local training, as in FedAvg.
    """

    name = "ida"

    def __init__(self, cfg, task, *, weighting: aggregation.Weighting = "uniform", **options: Any):
        super().__init__(cfg, task, weighting=weighting, **options)  # weighting of the reference mean

    def site_weights(self, uploads: list[Upload]) -> torch.Tensor:
        states = [u.params for u in uploads]
        mean = aggregation.weighted_average(states, aggregation.site_weights(uploads, self.weighting))
        keys = [k for k, _ in self.reference_model.named_parameters() if k in mean]
        distances = [max(aggregation.parameter_distance(s, mean, keys), _EPS) for s in states]
        inverse = 1.0 / torch.tensor(distances, dtype=torch.float64)
        return inverse / inverse.sum()
