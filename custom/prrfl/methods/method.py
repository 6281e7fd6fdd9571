"""The method contract: what a site does in a local round and what the server does with the uploads.

The shared loop (prrfl.site.trainer) owns the schedule, evaluation and checkpoints; the task owns
data, batches, metrics and its loss. A method says which models a site keeps (`roles`) and builds
them (`build_model`, `build_optimizer`: one factory each, so a method may own a model with several
heads), their losses on a batch, what happens at a download, before/after an epoch, and how the
server turns the uploads into one download per site.
A method whose local step is not one gradient step of a summed loss overrides `train_batch`.
The site-side hooks see the site through a `SiteView` (prrfl.methods.view): its models, optimisers,
memory, training data, evaluation and scalar log. Whatever a method must remember at a site between
rounds goes into `site.memory`, which the loop checkpoints with the models (site processes may be
restarted for every task).
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import typing
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, ClassVar

import torch

from prrfl.algorithms.losses import balanced_softmax_loss
from prrfl.messages import Download, StateDict, Upload
from prrfl.methods.view import SiteView
from prrfl.numerics import prepare_model

if TYPE_CHECKING:
    from prrfl.config import RunConfig
    from prrfl.tasks.contract import Task


class Method:
    """Base class: one local model trained with the task's supervised loss, uploaded whole."""

    name: ClassVar[str] = "base"
    # class defaults; a method whose options change its models may set them per instance in __init__
    roles: tuple[str, ...] = ("local",)
    eval_role: str = "local"  # the model a site reports and selects on validation
    # a method whose reported model is the global model (the download, with the site's local entries): it is
    # scored when it arrives, before the local epochs; otherwise the eval_role model after them
    global_model_reported: ClassVar[bool] = False
    upload_role: str = "local"
    # A method with many options may declare them as a (frozen, self-checking) dataclass instead of
    # keyword parameters; its constructor then takes them as **options (PRR: `PRROptions`).
    options_class: ClassVar[type | None] = None
    # the inputs of the batch `train_batch` is training (None outside it), for a method whose `losses` feed them to
    # another model (MOON's frozen models, BalanceFL's teacher)
    inputs: torch.Tensor | None = None

    def __init__(self, cfg: RunConfig, task: Task, **options: Any):
        self.cfg = cfg
        self.task = task
        if options:
            raise ValueError(f"method '{self.name}' got unknown option(s) {sorted(options)}")

    def reports_download(self) -> bool:
        """Whether the site reports (and selects on validation) the model it downloads, scored right after the
        download of round r as the global model of round r - 1 (the last round's is saved by the server, not
        scored at the sites), rather than its model after the local epochs."""
        return self.global_model_reported and self.cfg.report_global_model

    @classmethod
    def unsupported_reason(cls, task: Task) -> str | None:
        """Why this method cannot run on `task`, or None when it can. Checked when a job is built
        (`registry.build_method`), so a job that cannot work is refused before any site trains."""
        return None

    @classmethod
    def option_parameters(cls) -> dict[str, inspect.Parameter]:
        """The options a job may set in method_args, by name, with their evaluated annotation (what
        validation checks) and the default of the constructor that declares them (a subclass may
        pass its parent another one, as PRRFL does). They are the keyword parameters of each
        `__init__` up the class hierarchy, for as long as the constructors forward `**options` to
        their parent (FedProx -> FedAvg, PRRFL -> PRR); a subclass's parameter wins over its
        parent's of the same name (IDA's weighting). A class that declares an `options_class` (PRR)
        contributes that dataclass's fields instead, and the walk ends there: its constructor builds
        the dataclass rather than forwarding. Read from the signatures and fields, so that an option
        added to a method is validated without a list to keep in step."""
        found: dict[str, inspect.Parameter] = {}
        for klass in cls.__mro__:
            if klass is Method:  # takes no option of its own
                break
            options_class = vars(klass).get("options_class")
            if options_class is not None:
                hints = typing.get_type_hints(options_class)
                for f in dataclasses.fields(options_class):
                    p = inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, default=f.default, annotation=hints[f.name])
                    found.setdefault(f.name, p)
                break
            if "__init__" not in vars(klass):
                continue
            params = inspect.signature(klass.__init__).parameters.values()
            hints = typing.get_type_hints(klass.__init__)
            for p in params:
                if p.name not in ("self", "cfg", "task") and p.kind is not p.VAR_KEYWORD:
                    found.setdefault(p.name, p.replace(annotation=hints.get(p.name, Any)))
            if not any(p.kind is p.VAR_KEYWORD for p in params):
                break
        return found

    # ----- models -------------------------------------------------------------------------
    def build_model(self) -> torch.nn.Module:
        """A new model of any role (the task's network by default), with the caller's RNG state."""
        return self.task.build_model()

    def build_optimizer(self, model: torch.nn.Module) -> torch.optim.Optimizer:
        """The optimiser of one role's model, as the config says (`optimizer`, lr, momentum, weight
        decay); the loop sets the learning rate of every epoch from the schedule."""
        cfg = self.cfg
        if cfg.optimizer == "adam":
            return torch.optim.Adam(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
        return torch.optim.SGD(model.parameters(), lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay)

    def lr_at(self, epoch: int) -> float:
        """The learning rate of a global epoch index (round * local_epochs + local epoch): the config's
        step schedule, unless a method brings its own."""
        return self.cfg.lr_at(epoch)

    @functools.cached_property
    def reference_model(self) -> torch.nn.Module:
        """A model of the method's architecture for its keys and shapes (weights not meaningful),
        built once, without touching the caller's RNG."""
        with torch.random.fork_rng(devices=[]):
            return self.build_model()

    @property
    def classifier_key(self) -> str | None:
        """The state-dict key of the model's last classifier layer (PFA mixes it class by class)."""
        return getattr(self.reference_model, "classifier_key", None)

    @property
    def classifier_keys(self) -> tuple[str, ...]:
        """Every layer whose rows are the classes (PFA mixes each class by class): the model's
        `classifier_keys` (e.g. all four ASPP branches of DeepLab-v2), else its `classifier_key`."""
        keys = getattr(self.reference_model, "classifier_keys", None)
        return tuple(keys) if keys else ((self.classifier_key,) if self.classifier_key else ())

    # ----- both sides ---------------------------------------------------------------------
    def shared_keys(self, model: torch.nn.Module) -> list[str]:
        """State-dict keys that travel between site and server (default: all)."""
        return list(model.state_dict().keys())

    # ----- server side ---------------------------------------------------------------------
    def aggregate(self, uploads: list[Upload], round_idx: int, server: dict[str, Any]) -> dict[str, Download]:
        """Uploads of the sites that answered -> one download per site. `server` is the method's own
        persisted server-side state (a dict it may read and update)."""
        raise NotImplementedError

    def global_params(self, downloads: dict[str, Download]) -> StateDict | None:
        """The method's global model, from the server's last downloads (those of the sites that took
        part in the last round), as the state dict of `build_global_model`; None for a method without
        one (each site keeps a model of its own). Default: none."""
        return None

    def build_global_model(self) -> torch.nn.Module:
        """A new model of the global model's architecture (default: the method's model)."""
        return self.build_model()

    def upload_meta_problem(self, upload: Upload) -> str | None:
        """Why the server must refuse what a site of this method sends in `Upload.meta` beyond what every method's
        upload is checked for (`prrfl.server.checks.upload_problem`), or None when it is usable. Default: nothing
        more to check."""
        return None

    def server_scalars(self, downloads: dict[str, Download]) -> dict[str, float]:
        """The method's server-side values of a round for the federation's tracking run (logged once,
        not per site), from the round's downloads. Default: none."""
        return {}

    # ----- site side -----------------------------------------------------------------------
    def on_download(self, site: SiteView, download: Download, first: bool) -> None:
        """Load the download into the site's models. `first`: the initial model of the run."""
        for role in self.roles:
            site.models[role].load_state_dict(download.params, strict=first)

    def before_epoch(self, site: SiteView, epoch: int) -> None:
        pass

    def train_batches(self, site: SiteView) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """The (inputs, targets) batches of one local epoch: by default the task's shuffled pass over the site's
        training split, augmented (`Task.train_batches`); a method that samples its batches otherwise overrides it."""
        return site.task.train_batches(site.train, self.cfg.batch_size, site.generator)

    def train_batch(self, site: SiteView, inputs: torch.Tensor, targets: torch.Tensor) -> dict[str, torch.Tensor]:
        """One optimisation step on a batch; returns each trained model's loss, detached, on the model's device
        (the loop sums them there and reads them once per epoch: no wait for a GPU per batch). Default: forward
        every role, sum `losses` (with `inputs` at hand in `self.inputs`), one backward, step every optimiser, then
        `after_batch`. Methods whose step is not one gradient step of a summed loss (meta-learning, inner solvers)
        override this."""
        outputs = {role: site.models[role](inputs) for role in self.roles}
        self.inputs = inputs
        try:
            losses = self.losses(site, targets, outputs)
        finally:
            self.inputs = None
        for opt in site.optimizers.values():
            opt.zero_grad(set_to_none=True)
        total = sum(losses.values())
        check_finite(site, total)
        total.backward()
        for opt in site.optimizers.values():
            opt.step()
        self.after_batch(site, targets, outputs)
        return {role: loss.detach() for role, loss in losses.items()}

    def supervised_loss(self, site: SiteView, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """The task's loss with the run's classification term (config `class_loss`): the method's own (`class_term`),
        or for every method the balanced softmax of the site's own class prior (FCA's protocol)."""
        if self.cfg.class_loss == "balanced_softmax":
            return self.task.loss(logits, targets, class_term=balanced_softmax_loss(logits, targets, torch.tensor(site.class_counts)))
        return self.task.loss(logits, targets, class_term=self.class_term(site, logits, targets))

    def class_term(self, site: SiteView, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor | None:
        """The method's own classification term of a batch (an imbalance method's loss), in place of the task's cross
        entropy; None: the task's own."""
        return None

    def losses(
        self, site: SiteView, targets: torch.Tensor, outputs: dict[str, tuple[torch.Tensor, torch.Tensor]]
    ) -> dict[str, torch.Tensor]:
        """outputs: role -> (logits, embedding). Returns one loss per trained role."""
        return {role: self.supervised_loss(site, out[0], targets) for role, out in outputs.items()}

    def after_batch(self, site: SiteView, targets: torch.Tensor, outputs: dict[str, tuple[torch.Tensor, torch.Tensor]]) -> None:
        pass

    def after_epoch(self, site: SiteView, epoch: int) -> None:
        pass

    def upload(self, site: SiteView) -> Upload:
        model = site.models[self.upload_role]
        state = model.state_dict()
        params = {k: state[k].detach().cpu() for k in self.shared_keys(model)}
        return Upload(
            site=site.name,
            params=params,
            num_train=site.num_train,
            class_counts=site.class_counts,
            meta=self.upload_meta(site),
        )

    def upload_meta(self, site: SiteView) -> dict[str, Any]:
        return {}


def proximal_term(model: torch.nn.Module, anchor: dict[str, torch.Tensor], mu: float) -> torch.Tensor:
    """(mu / 2) * ||theta - anchor||^2 over the model's parameters that `anchor` names (FedProx's and Ditto's pull);
    the anchor lies on the model's device (put there once per round, not per batch)."""
    return 0.5 * mu * sum(((p - anchor[n]) ** 2).sum() for n, p in model.named_parameters() if n in anchor)


def frozen_copy(method: Method, state: dict[str, torch.Tensor], device: torch.device) -> torch.nn.Module:
    """A model of the method holding `state` on `device`, with the run's numerics, in evaluation mode and without
    gradients: a teacher or reference a site computes with but never trains. Built without touching the caller's RNG."""
    with torch.random.fork_rng(devices=[]):
        model = prepare_model(method.build_model().to(device), method.cfg)
    model.load_state_dict(state)
    model.eval().requires_grad_(False)
    return model


def check_finite(site: SiteView, loss: torch.Tensor) -> None:
    """A non-finite training loss raises FloatingPointError naming the site: at once on the CPU, at the end of the
    epoch on a GPU (`prrfl.methods.view.LossCheck`)."""
    site.loss_check.check(loss)


def global_class_counts(download: Download, method: str) -> list[int]:
    """The federation's class counts that a download brings (filled by the transport at the site)."""
    if download.global_class_counts is None:
        raise ValueError(f"method '{method}' needs the federation's class counts, but the download brings none")
    return download.global_class_counts
