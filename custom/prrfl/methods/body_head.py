"""Methods that split the model into a shared body and a head at each site: FedRep and FedBABU, two competitors of
FCA's Table 4. The head is the task model's classifier layer (the module of its `classifier_key`); the body is
everything else. FCA's published code holds FedAvg and FCA only, so the settings here are the papers'."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any, Literal

import torch

from prrfl.messages import Download, Upload
from prrfl.methods.fedavg import FedAvg
from prrfl.methods.method import check_finite
from prrfl.methods.view import SiteView
from prrfl.tasks.classification import ClassificationTask

if TYPE_CHECKING:
    from prrfl.tasks.contract import Task

Part = Literal["head", "body", "all"]


def set_trainable(model: torch.nn.Module, head: str, part: Part) -> None:
    """Only `part` of the model takes gradients (the others' stay None, so the optimiser leaves them as they are)."""
    for name, p in model.named_parameters():
        in_head = name.startswith(f"{head}.")
        p.requires_grad_(part == "all" or (part == "head") == in_head)


class _BodyHead(FedAvg):
    """FedAvg of the body only: the head (the classifier layer) stays at the site. A personalized model, reported
    after its local epochs. Classification only."""

    global_model_reported = False

    @classmethod
    def unsupported_reason(cls, task: Task) -> str | None:
        if not isinstance(task, ClassificationTask):
            return f"{cls.__name__}'s head is the classifier layer of an image classifier (classification tasks)"
        return None

    @property
    def head(self) -> str:
        return self.classifier_key.rpartition(".")[0]

    def local_keys(self, model: torch.nn.Module) -> set[str]:
        return {k for k in model.state_dict() if k.startswith(f"{self.head}.")}


class FedRep(_BodyHead):
    """FedRep (Collins et al., "Exploiting Shared Representations for Personalized Federated Learning", ICML 2021):
    the body is shared (sample-weighted FedAvg), the head personal (never leaves the site). In each round a site
    first trains its head with the body frozen, then its body with the head frozen; it reports its body with its own
    head.

    Choices: the paper's round is tau_h = 10 head epochs then 1 body epoch (the authors' code: local_ep 10 of which
    local_rep_ep 1 for the body) on top of the schedule; here both fit within the run's local_epochs E, so that every
    method trains E epochs a round: `head_epochs` (default None) head epochs first, the rest body epochs; None takes
    the code's split, all but the last epoch for the head (E - 1 head epochs, 1 body epoch), and at E = 1 each batch
    takes one head step then one body step. BatchNorm belongs to the body (averaged, statistics included).
    """

    name = "fedrep"

    def __init__(self, cfg, task, *, head_epochs: int | None = None, **options: Any):
        super().__init__(cfg, task, **options)
        if head_epochs is not None and not 0 <= head_epochs <= cfg.local_epochs:
            raise ValueError(f"FedRep option head_epochs must lie in [0, local_epochs = {cfg.local_epochs}], got {head_epochs}")
        self.head_epochs = head_epochs
        self.parts: tuple[Part, ...] = ("head", "body")

    def epoch_parts(self, epoch: int) -> tuple[Part, ...]:
        """What each batch of local epoch `epoch` trains, in order."""
        epochs = self.cfg.local_epochs
        if self.head_epochs is None and epochs == 1:
            return ("head", "body")
        head_epochs = epochs - 1 if self.head_epochs is None else self.head_epochs
        return ("head",) if epoch < head_epochs else ("body",)

    def before_epoch(self, site: SiteView, epoch: int) -> None:
        self.parts = self.epoch_parts(epoch)

    def train_batch(self, site, inputs, targets):
        for part in self.parts:
            set_trainable(site.models["local"], self.head, part)
            losses = super().train_batch(site, inputs, targets)
        return losses


class FedBABU(_BodyHead):
    """FedBABU (Oh et al., "FedBABU: Toward Enhanced Representation for Federated Image Classification", ICLR 2022):
    only the body is trained and averaged (sample-weighted FedAvg); the head keeps its random initialisation (the
    initial model's, the same at every site) and is neither trained nor aggregated during the rounds. At the end each
    site fine-tunes its model on its own training data for `finetune_epochs` epochs and reports it.

    Choices: finetune_epochs = 5 (the paper's tau_f); `finetune="full"` fine-tunes body and head (the paper's
    personalization), `"head"` the head alone; the fine-tuning runs at the end of the run's last round, after its
    local epochs, on the site's model then (not on the server's last aggregate, which the loop does not send back
    for training), with the run's optimiser at that round's learning rate and the supervised loss; the site uploads
    its body as it was before the fine-tuning. Before the last round a site reports its model with the random head
    (the un-personalized model). BatchNorm belongs to the body (averaged, statistics included).
    """

    name = "fedbabu"

    def __init__(self, cfg, task, *, finetune_epochs: int = 5, finetune: Literal["full", "head"] = "full", **options: Any):
        super().__init__(cfg, task, **options)
        if finetune_epochs < 0 or finetune not in ("full", "head"):
            raise ValueError(f"FedBABU needs finetune_epochs >= 0 and finetune 'full' or 'head', got {finetune_epochs}, {finetune!r}")
        self.finetune_epochs, self.finetune = finetune_epochs, finetune

    def on_download(self, site: SiteView, download: Download, first: bool) -> None:
        super().on_download(site, download, first)
        site.memory["round"] = download.round

    def before_epoch(self, site: SiteView, epoch: int) -> None:
        set_trainable(site.models["local"], self.head, "body")

    def after_epoch(self, site: SiteView, epoch: int) -> None:
        if epoch == self.cfg.local_epochs - 1 and site.memory.get("round") == self.cfg.num_rounds - 1:
            self.fine_tune(site)

    def fine_tune(self, site: SiteView) -> None:
        """`finetune_epochs` epochs of the supervised loss on the site's training split; the body before them is
        kept for the upload."""
        model, optimizer = site.models["local"], site.optimizers["local"]
        shared = self.shared_keys(model)
        site.memory["upload_body"] = {k: v.detach().cpu().clone() for k, v in model.state_dict().items() if k in shared}
        set_trainable(model, self.head, "all" if self.finetune == "full" else "head")
        model.train()
        for _ in range(self.finetune_epochs):
            for inputs, targets in site.task.train_batches(site.train, self.cfg.batch_size, site.generator):
                loss = self.supervised_loss(site, model(inputs)[0], targets)
                optimizer.zero_grad(set_to_none=True)
                check_finite(site, loss)
                loss.backward()
                optimizer.step()
            site.loss_check.settle()

    def upload(self, site: SiteView) -> Upload:
        upload = super().upload(site)
        body = site.memory.pop("upload_body", None)
        return upload if body is None else dataclasses.replace(upload, params=body)
