"""CReFF (Shang et al., "Federated Learning on Heterogeneous and Long-Tailed Data via Classifier Re-Training with
Federated Features", IJCAI 2022), a competitor of FCA's Table 4 (which may spell it CReRF): FedAvg whose server
re-trains the global model's classifier on federated features (`prrfl.algorithms.federated_features`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from prrfl.algorithms import federated_features as ff
from prrfl.keys import CLASS_GRADIENT_PRESENT, CLASS_GRADIENTS, GRADIENT_CLASSIFIER_ROUND, MATCH_LOSS, RETRAINED_CLASSIFIER, RETRAINED_ROUND
from prrfl.messages import Download, Upload
from prrfl.methods.fedavg import FedAvg
from prrfl.methods.view import SiteView
from prrfl.server.checks import class_rows_problem
from prrfl.tasks.classification import ClassificationTask
from prrfl.tasks.contract import is_count

if TYPE_CHECKING:
    from prrfl.tasks.contract import Task

INITIAL_CLASSIFIER_SEED = 104729  # added to the run's seed: the classifier of round 0's gradients, the same at every site and the server
SERVER_SEED = 7907  # added to the run's seed: the server's draws (initial federated features, each round's fresh classifier, shuffles)


class CReFF(FedAvg):
    """CReFF (Shang et al., IJCAI 2022): FedAvg in which the server also learns `features_per_class` federated
    features per class and re-trains the classifier on them, for the global model.

    Round r: a site receives the FedAvg model and the classifier W~ the server re-trained in round r - 1 (in round 0
    a classifier drawn from the run's seed, as the authors' code starts from a fresh linear layer). Before training
    it reports, for each class c it holds, the gradient w.r.t. W~ of the cross entropy of W~ on its real embeddings of
    c from the received model in evaluation mode, averaged over `gradient_draws` random draws of up to
    `gradient_batch_size` training images of c (augmented as for training); then it trains the FedAvg model as FedAvg
    does and uploads it. The server averages the models (sample-weighted FedAvg) and each class's gradients over the
    sites that hold it (each site alike), moves the federated features by `match_steps` steps of SGD (`feature_lr`)
    so that their gradients at W~ match those (the sum over classes of the summed 1 - cosine of each class row and of
    the bias, `prrfl.algorithms.federated_features.gradient_distance`), and trains a freshly drawn classifier on the
    federated features alone, `retrain_epochs` epochs of SGD (`retrain_lr`, batches of `retrain_batch_size`). The
    global model is the FedAvg model with that classifier: it is what a site reports (scored at its download) and what
    generalization scores; the sites train from the FedAvg model, its averaged classifier included, as the authors'
    code does (the re-trained classifier serves inference and the next round's gradients only).

    Choices (docs/authors_code.md §10): the authors' code's settings: 100 features per class drawn from N(0, 1) at the start and kept over the
    rounds, 100 matching steps at lr 0.1, 300 re-training epochs at lr 0.01 in batches of 32, 10 draws of 32 images per
    class for a site's gradients (FCA's code states no setting for CReFF); the features are the classifier's input
    (the task model's embedding), and the classifier is the task model's last linear layer; a site whose gradients
    were taken at another classifier than the server's current one (it missed a round and trained from an older
    download) has its model averaged but its gradients left out of the matching; every draw (features, classifiers,
    shuffles) comes from generators seeded from the run's seed, the server's kept in its state. With
    `class_loss=balanced_softmax` (FCA trains every method so) the sites' local training takes the balanced softmax of
    their own prior, as FedAvg's; the gradients and the re-training keep the plain cross entropy: a gradient must be
    of the loss it is matched against, and the federated features are class-balanced (m per class), so the balanced
    softmax of their prior is the cross entropy. `report_global_model=false` reports a site's model after its local
    epochs, whose classifier is the averaged one; the re-trained classifier is then in the server's global model only.
    Classification only (one class per image, a linear classifier on the embedding).
    """

    name = "creff"

    def __init__(
        self,
        cfg,
        task,
        *,
        features_per_class: int = 100,
        match_steps: int = 100,
        feature_lr: float = 0.1,
        retrain_epochs: int = 300,
        retrain_lr: float = 0.01,
        retrain_batch_size: int = 32,
        gradient_draws: int = 10,
        gradient_batch_size: int = 32,
        **options: Any,
    ):
        super().__init__(cfg, task, **options)
        counts = (features_per_class, retrain_batch_size, gradient_draws, gradient_batch_size)
        if min(counts) < 1 or min(match_steps, retrain_epochs) < 0 or not (feature_lr > 0 and retrain_lr > 0):
            raise ValueError(
                "CReFF options need features_per_class, retrain_batch_size, gradient_draws, gradient_batch_size >= 1, "
                f"match_steps, retrain_epochs >= 0 and positive learning rates, got {counts}, {match_steps}, {retrain_epochs}, "
                f"{feature_lr}, {retrain_lr}"
            )
        self.features_per_class, self.match_steps, self.feature_lr = features_per_class, match_steps, feature_lr
        self.retrain_epochs, self.retrain_lr, self.retrain_batch_size = retrain_epochs, retrain_lr, retrain_batch_size
        self.gradient_draws, self.gradient_batch_size = gradient_draws, gradient_batch_size

    @classmethod
    def unsupported_reason(cls, task: Task) -> str | None:
        if not isinstance(task, ClassificationTask):
            return "CReFF re-trains the classifier of one class per image (classification tasks)"
        with torch.random.fork_rng(devices=[]):
            model = task.build_model()
        if not isinstance(model.get_submodule(model.classifier_key.rpartition(".")[0]), nn.Linear):
            return "CReFF re-trains a linear classifier on the embedding; the task model's classifier layer is not one"
        return None

    # ----- the classifier -------------------------------------------------------------------
    @property
    def head(self) -> str:
        return self.classifier_key.rpartition(".")[0]

    @property
    def layer(self) -> nn.Linear:
        return self.reference_model.get_submodule(self.head)

    def head_keys(self) -> list[str]:
        """The state-dict keys of the classifier's parameters, in `flatten`'s order (weight, then bias)."""
        return [f"{self.head}.{name}" for name, _ in self.layer.named_parameters()]

    def unflatten(self, row: torch.Tensor) -> ff.Classifier:
        return ff.unflatten(row, self.layer.out_features, self.layer.in_features, self.layer.bias is not None)

    def initial_classifier(self) -> ff.Classifier:
        """Round 0's classifier W~: drawn from the run's seed, the same at every site and at the server."""
        generator = torch.Generator().manual_seed(self.cfg.seed + INITIAL_CLASSIFIER_SEED)
        return ff.uniform_classifier(self.layer.out_features, self.layer.in_features, self.layer.bias is not None, generator)

    def with_classifier(self, params: dict[str, torch.Tensor], classifier: ff.Classifier) -> dict[str, torch.Tensor]:
        """`params` with the classifier's entries replaced by `classifier`'s, in their dtype and device."""
        swapped = dict(params)
        for key, value in zip(self.head_keys(), classifier):
            swapped[key] = value.to(params[key])
        return swapped

    # ----- site side -----------------------------------------------------------------------
    def on_download(self, site: SiteView, download: Download, first: bool) -> None:
        """Load the FedAvg model; take the class gradients at the re-trained classifier (before any local step); put
        that classifier in the model to be scored as the global model, the averaged one kept for `before_epoch`."""
        super().on_download(site, download, first)
        model = site.models[self.upload_role]
        sent = download.meta.get(RETRAINED_CLASSIFIER)
        retrained = None if sent is None else self.unflatten(torch.tensor(sent, dtype=torch.float32))
        if download.round < self.cfg.num_rounds:  # not the last aggregate sent to score only: a local update follows
            at = self.initial_classifier() if retrained is None else retrained
            rows, present = self.class_gradients(site, at)
            site.memory["class_gradients"] = (rows, present, -1 if retrained is None else int(download.meta[RETRAINED_ROUND]))
        if retrained is not None:
            state = model.state_dict()
            site.memory["averaged_classifier"] = {k: state[k].detach().clone() for k in self.head_keys()}
            model.load_state_dict(self.with_classifier(state, retrained))

    def before_epoch(self, site: SiteView, epoch: int) -> None:
        """The local update starts from the FedAvg model, its averaged classifier included."""
        averaged = site.memory.pop("averaged_classifier", None)
        if averaged is not None:
            site.models[self.upload_role].load_state_dict(averaged, strict=False)

    def class_gradients(self, site: SiteView, classifier: ff.Classifier) -> tuple[torch.Tensor, torch.Tensor]:
        """Rows [C, P] (zero for a class the site lacks) and presence [C]: each class's gradient of the cross entropy of
        `classifier` on the site's embeddings of it, averaged over `gradient_draws` draws of up to `gradient_batch_size`
        training images of the class (without replacement within a draw), augmented as for training."""
        model, train = site.models[self.upload_role], site.train
        was_training = model.training
        model.eval()
        device = next(model.parameters()).device
        at = [p.to(device) for p in classifier]
        rows = torch.zeros(site.task.num_classes, sum(p.numel() for p in at), dtype=torch.float64)
        targets = train.targets.cpu()
        try:
            for c in range(site.task.num_classes):
                members = torch.nonzero(targets == c).flatten()
                if len(members) == 0:
                    continue
                for _ in range(self.gradient_draws):
                    order = torch.randperm(len(members), generator=site.generator)[: self.gradient_batch_size]
                    drawn = members[order].to(train.targets.device)
                    inputs, _ = site.task.train_transform(train.images[drawn], train.targets[drawn], site.generator)
                    with torch.no_grad():
                        embedding = model(inputs)[1].float()
                    rows[c] += ff.flatten(ff.class_gradient(at, embedding, c)).double().cpu()
                rows[c] /= self.gradient_draws
        finally:
            model.train(was_training)
        return rows, torch.bincount(targets, minlength=site.task.num_classes) > 0

    def upload_meta(self, site: SiteView) -> dict[str, Any]:
        rows, present, at_round = site.memory["class_gradients"]
        return {CLASS_GRADIENTS: rows.tolist(), CLASS_GRADIENT_PRESENT: present.tolist(), GRADIENT_CLASSIFIER_ROUND: at_round}

    # ----- server side ---------------------------------------------------------------------
    def upload_meta_problem(self, upload: Upload) -> str | None:
        """A CReFF site's upload must carry one finite gradient row of the classifier's size per class, flagged for
        exactly the classes its counts hold, and the round of the classifier they were taken at."""
        meta = upload.meta
        if CLASS_GRADIENTS not in meta:
            return "it sends no class gradients (a CReFF site sends one per class)"
        width = sum(p.numel() for p in self.layer.parameters())
        problem = class_rows_problem(meta, CLASS_GRADIENTS, CLASS_GRADIENT_PRESENT, self.task.num_classes, width)
        if problem:
            return problem
        if meta[CLASS_GRADIENT_PRESENT] != [n > 0 for n in upload.class_counts]:
            return f"{CLASS_GRADIENT_PRESENT} {meta[CLASS_GRADIENT_PRESENT]} does not flag the classes of its class counts {upload.class_counts}"
        at_round = meta.get(GRADIENT_CLASSIFIER_ROUND)
        if not (at_round == -1 or is_count(at_round)):
            return f"{GRADIENT_CLASSIFIER_ROUND} must be an integer >= -1, got {at_round!r:.40}"
        return None

    def aggregate(self, uploads: list[Upload], round_idx: int, server: dict[str, Any]) -> dict[str, Download]:
        """FedAvg of the models; the federated features matched to the round's class gradients (those taken at the
        server's current classifier); a classifier re-trained on them, sent with the average."""
        average = self.average(uploads)
        generator = torch.Generator()
        if "rng" in server:
            generator.set_state(server["rng"])
        else:
            generator.manual_seed(self.cfg.seed + SERVER_SEED)
        layer = self.layer
        if "features" not in server:
            server["features"] = torch.randn(layer.out_features, self.features_per_class, layer.in_features, generator=generator)
        at_round = server.get("classifier_round", -1)
        at = self.initial_classifier() if "classifier" not in server else self.unflatten(server["classifier"])
        current = [u for u in uploads if u.meta[GRADIENT_CLASSIFIER_ROUND] == at_round]
        real = {}
        if current:
            rows = torch.tensor([u.meta[CLASS_GRADIENTS] for u in current], dtype=torch.float32)
            present = torch.tensor([u.meta[CLASS_GRADIENT_PRESENT] for u in current])
            real = {c: self.unflatten(row) for c, row in ff.average_class_gradients(rows, present).items()}
        features, losses = ff.match_features(server["features"], at, real, self.match_steps, self.feature_lr)
        fresh = ff.uniform_classifier(layer.out_features, layer.in_features, layer.bias is not None, generator)
        retrained = ff.retrain_classifier(features, fresh, self.retrain_epochs, self.retrain_lr, self.retrain_batch_size, generator)
        server.update(features=features, classifier=ff.flatten(retrained), classifier_round=round_idx, rng=generator.get_state())
        meta = {RETRAINED_CLASSIFIER: ff.flatten(retrained).tolist(), RETRAINED_ROUND: round_idx}
        if losses:
            meta[MATCH_LOSS] = [losses[0], losses[-1]]
        return {u.site: Download(params=dict(average), meta=dict(meta)) for u in uploads}

    def global_params(self, downloads: dict[str, Download]) -> dict[str, torch.Tensor] | None:
        """The FedAvg model with the re-trained classifier."""
        first = next(iter(downloads.values()), None)
        if first is None or RETRAINED_CLASSIFIER not in first.meta:
            return super().global_params(downloads)
        retrained = self.unflatten(torch.tensor(first.meta[RETRAINED_CLASSIFIER], dtype=torch.float32))
        return super().global_params({site: Download(params=self.with_classifier(first.params, retrained)) for site in downloads})

    def server_scalars(self, downloads: dict[str, Download]) -> dict[str, float]:
        """The matching loss of the round, before and after the features' steps."""
        loss = next((d.meta[MATCH_LOSS] for d in downloads.values() if MATCH_LOSS in d.meta), None)
        return {} if loss is None else {"creff/match_loss_before": loss[0], "creff/match_loss_after": loss[1]}
