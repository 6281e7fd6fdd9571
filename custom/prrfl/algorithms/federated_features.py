"""Classifier re-training with federated features (CReFF: Shang et al., IJCAI 2022), pure torch, without FLARE.

A linear classifier is a list of its parameters, the weight [C, D] and, when it has one, the bias [C]; `flatten`
and `unflatten` turn it into the one row of numbers it travels as. A site reports, for each class it holds, the
gradient of the cross entropy of its real embeddings of that class w.r.t. the classifier (`class_gradient`). The
server keeps `m` federated features per class and moves them so that their gradients at the same classifier match
the sites' (`gradient_distance`, `match_features`), then trains a classifier on them alone (`retrain_classifier`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
import torch.nn.functional as F

Classifier = list[torch.Tensor]  # weight [C, D], then bias [C] when the layer has one

COSINE_EPSILON = 1e-6  # added to the product of the norms in a cosine (the authors' distance)


def flatten(classifier: Sequence[torch.Tensor]) -> torch.Tensor:
    """The parameters as one row: the weight row by row, then the bias."""
    return torch.cat([p.reshape(-1) for p in classifier])


def unflatten(row: torch.Tensor, num_classes: int, dim: int, bias: bool) -> Classifier:
    """`flatten`'s inverse for a classifier of `num_classes` x `dim` weights (and a bias)."""
    weight = row[: num_classes * dim].reshape(num_classes, dim)
    return [weight, row[num_classes * dim :]] if bias else [weight]


def classifier_logits(classifier: Sequence[torch.Tensor], features: torch.Tensor) -> torch.Tensor:
    return F.linear(features, classifier[0], classifier[1] if len(classifier) > 1 else None)


def class_gradient(classifier: Sequence[torch.Tensor], features: torch.Tensor, label: int, create_graph: bool = False) -> Classifier:
    """The gradient of the mean cross entropy of `features` [N, D], all of class `label`, w.r.t. each parameter of the
    classifier. create_graph: differentiable w.r.t. the features (the server's matching)."""
    params = [p if p.requires_grad else p.detach().requires_grad_() for p in classifier]
    logits = classifier_logits(params, features)
    loss = F.cross_entropy(logits, torch.full((len(features),), label, dtype=torch.long, device=features.device))
    return list(torch.autograd.grad(loss, params, create_graph=create_graph))


def gradient_distance(synthetic: Sequence[torch.Tensor], real: Sequence[torch.Tensor]) -> torch.Tensor:
    """Sum over the classifier's parameters of sum over their rows (a bias being one row) of 1 - cos(row_syn, row_real),
    the cosine being a.b / (|a| |b| + 1e-6): the gradient-matching distance of dataset condensation, which CReFF's
    authors use."""
    total = synthetic[0].new_zeros(())
    for syn, ref in zip(synthetic, real):
        syn, ref = syn.reshape(-1, syn.shape[-1]), ref.reshape(-1, ref.shape[-1]).to(syn)
        cosine = (syn * ref).sum(dim=1) / (syn.norm(dim=1) * ref.norm(dim=1) + COSINE_EPSILON)
        total = total + (1 - cosine).sum()
    return total


def matching_loss(features: torch.Tensor, classifier: Sequence[torch.Tensor], real: Mapping[int, Sequence[torch.Tensor]]) -> torch.Tensor:
    """sum over the classes c of `real` of gradient_distance(class_gradient(classifier, features[c], c), real[c]);
    features [C, m, D], differentiable w.r.t. them."""
    total = features.new_zeros(())
    for c, gradient in real.items():
        total = total + gradient_distance(class_gradient(classifier, features[c], c, create_graph=True), gradient)
    return total


def match_features(
    features: torch.Tensor, classifier: Sequence[torch.Tensor], real: Mapping[int, Sequence[torch.Tensor]], steps: int, lr: float
) -> tuple[torch.Tensor, list[float]]:
    """`steps` steps of plain SGD (learning rate `lr`) on the federated features [C, m, D] against `matching_loss`, the
    classifier fixed. Returns the new features and the loss before each step and after the last. A class without a
    real gradient keeps its features."""
    features = features.detach().clone().requires_grad_()
    optimizer = torch.optim.SGD([features], lr=lr)
    fixed = [p.detach() for p in classifier]
    losses = []
    for _ in range(steps if real else 0):
        loss = matching_loss(features, fixed, real)
        losses.append(float(loss.detach()))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
    if real:
        losses.append(float(matching_loss(features, fixed, real).detach()))
    return features.detach(), losses


def retrain_classifier(
    features: torch.Tensor, initial: Sequence[torch.Tensor], epochs: int, lr: float, batch_size: int, generator: torch.Generator
) -> Classifier:
    """A classifier trained from `initial` on the federated features [C, m, D] alone (class c's features labelled c):
    `epochs` shuffled passes (`generator`) in batches of `batch_size`, plain SGD at `lr` on the cross entropy."""
    num_classes, per_class, dim = features.shape
    inputs = features.detach().reshape(-1, dim)
    labels = torch.arange(num_classes, device=inputs.device).repeat_interleave(per_class)
    params = [p.detach().clone().requires_grad_() for p in initial]
    optimizer = torch.optim.SGD(params, lr=lr)
    for _ in range(epochs):
        order = torch.randperm(len(inputs), generator=generator).to(inputs.device)
        for start in range(0, len(inputs), batch_size):
            batch = order[start : start + batch_size]
            loss = F.cross_entropy(classifier_logits(params, inputs[batch]), labels[batch])
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
    return [p.detach() for p in params]


def uniform_classifier(num_classes: int, dim: int, bias: bool, generator: torch.Generator) -> Classifier:
    """A classifier drawn as torch initialises a linear layer: every parameter uniform in (-1/sqrt(D), 1/sqrt(D))."""
    bound = dim**-0.5
    shapes = [(num_classes, dim), (num_classes,)] if bias else [(num_classes, dim)]
    return [(torch.rand(shape, generator=generator) * 2 - 1) * bound for shape in shapes]


def average_class_gradients(rows: torch.Tensor, present: torch.Tensor) -> dict[int, torch.Tensor]:
    """class -> the mean of the sites' gradient rows of the class, over the sites that hold it (each site alike, as
    the authors' server does: no site's class counts enter), from rows [K, C, P] and present [K, C]."""
    held = present.sum(dim=0)
    mean = (rows * present[..., None]).sum(dim=0) / held.clamp(min=1)[:, None]
    return {c: mean[c] for c in range(rows.shape[1]) if held[c] > 0}
