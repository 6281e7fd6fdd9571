"""FML: Federated Mutual Learning (Shen et al., arXiv 2006.16765, 2020)."""

from __future__ import annotations

from typing import Any

from prrfl.algorithms.det import kl_distillation
from prrfl.methods.fedavg import FedAvg


class FML(FedAvg):
    """Each site keeps a personalized model (never shared) and a meme model, here the deputy, that
    is averaged by FedAvg and overwritten at every download. Both train together by deep mutual
    learning on every batch:
        L_personal = alpha * CE(z_p) + (1 - alpha) * KL(p_d || p_p)
        L_deputy   = beta  * CE(z_d) + (1 - beta)  * KL(p_p || p_d)
    with the teacher of each KL detached (the KL of PRR's DET, at temperature 1).

    Choices: alpha = beta = 0.5 (the paper's setting); the whole deputy (BN included) travels and is
    averaged by training-set size; the evaluated model is the personalized one. Unlike PRR's DET the
    transfer runs in both directions in every epoch, with no phase switch.
    """

    name = "fml"
    global_model_reported = False  # a personalized model, scored after its local epochs
    roles = ("personal", "deputy")
    eval_role = "personal"
    upload_role = "deputy"
    download_roles = ("deputy",)

    def __init__(self, cfg, task, *, alpha: float = 0.5, beta: float = 0.5, **options: Any):
        super().__init__(cfg, task, **options)
        if not (0 <= alpha <= 1 and 0 <= beta <= 1):
            raise ValueError(f"FML options alpha and beta must lie in [0, 1], got {alpha}, {beta}")
        self.alpha, self.beta = alpha, beta

    def losses(self, site, targets, outputs):
        (z_p, _), (z_d, _) = outputs["personal"], outputs["deputy"]
        return {
            "personal": self.alpha * self.supervised_loss(site, z_p, targets) + (1 - self.alpha) * kl_distillation(z_p, z_d),
            "deputy": self.beta * self.supervised_loss(site, z_d, targets) + (1 - self.beta) * kl_distillation(z_d, z_p),
        }
