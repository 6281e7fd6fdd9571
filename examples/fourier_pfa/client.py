"""One site's script (FLARE Client API): a personalized model and its deputy (DET), and the answers to
FLARE's cross-site evaluation.

The site keeps its personalized model P; the server's model for this site goes into the deputy D.
Each epoch DET compares the two on the site's validation images and decides which one distils from
the other. D's weights (without BatchNorm) go back to the server, with the site's class prototypes and
class counts; the global class counts the server returns weight the cross entropy (class balance).

The script answers FLARE's three tasks: train (above), evaluate (`flare.is_evaluate()`: the received
model scored on this site's validation images, metrics sent back, nothing trained) and submit_model
(`flare.is_submit_model()`: this site's best personalized model, by validation accuracy).

Data: --data_root holds one ImageFolder per site (<data_root>/<site>/train, <data_root>/<site>/valid);
without it, site-1 .. site-4 make the images prepare_data.py writes for them, in memory.
"""

import argparse

import nvflare.client as flare
import torch
import torch.nn.functional as F
from model import Net
from nvflare.client.tracking import SummaryWriter
from prepare_data import CLASSES, site_images
from torch.utils.data import DataLoader, Dataset
from torchvision import datasets, transforms

from prrfl.flare.components import NUM_SAMPLES, GlobalStatistics, PersonalizedPair, PrototypeTracker

TRANSFORM = transforms.Compose([transforms.ToTensor(), transforms.Normalize([0.5] * 3, [0.5] * 3)])


class GeneratedImages(Dataset):
    """One split of the images prepare_data.py writes for a site, made in memory; classes and targets as
    ImageFolder gives them for the written folder."""

    def __init__(self, images: list, transform):
        self.classes = list(CLASSES)
        self.samples = [(transform(image), self.classes.index(name)) for name, _, image in images]
        self.targets = [target for _, target in self.samples]

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int):
        return self.samples[index]


def load_data(data_root: str | None, site: str) -> tuple[Dataset, Dataset]:
    """(train, valid) of this site: its ImageFolders under data_root, or prepare_data.py's images in memory."""
    if data_root:
        return tuple(datasets.ImageFolder(f"{data_root}/{site}/{split}", TRANSFORM) for split in ("train", "valid"))
    images = site_images(site)
    print(f"{site}: no --data_root, training on prepare_data.py's images of {site}, made in memory")
    return GeneratedImages(images["train"], TRANSFORM), GeneratedImages(images["valid"], TRANSFORM)


def accuracy(model: torch.nn.Module, loader: DataLoader) -> float:
    model.eval()
    correct = total = 0
    with torch.no_grad():
        for images, labels in loader:
            correct += (model(images).argmax(dim=1) == labels).sum().item()
            total += len(labels)
    return correct / max(total, 1)


def score_received(params: dict, num_classes: int, loader: DataLoader) -> float:
    """Validation accuracy of a model sent for cross-site evaluation, as it came (its own BatchNorm included)."""
    net = Net(num_classes)
    net.load_state_dict({k: torch.as_tensor(v) for k, v in params.items()})
    return accuracy(net, loader)


def copy_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument(
        "--data_root",
        default=None,
        help="one ImageFolder per site: <site>/train, <site>/valid (default: prepare_data.py's images, made in memory)",
    )
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch_size", type=int, default=16)
    parser.add_argument("--lr", type=float, default=0.05)
    args = parser.parse_args()

    flare.init()
    site = flare.get_site_name()
    train_set, valid_set = load_data(args.data_root, site)
    train_loader = DataLoader(train_set, batch_size=args.batch_size, shuffle=True)
    valid_loader = DataLoader(valid_set, batch_size=64)
    num_classes = len(train_set.classes)
    class_counts = torch.bincount(torch.tensor(train_set.targets), minlength=num_classes)

    pair = PersonalizedPair(Net(num_classes), Net(num_classes))
    optimizers = [torch.optim.SGD(m.parameters(), lr=args.lr, momentum=0.9) for m in (pair.personal, pair.deputy)]
    prototypes = PrototypeTracker(num_classes)
    writer = SummaryWriter()  # FLARE's experiment tracking (add_experiment_tracking on the server)
    best_score, best_state = -1.0, None  # this site's best personalized model, by validation accuracy

    while flare.is_running():
        input_model = flare.receive()
        if flare.is_submit_model():  # cross-site evaluation asks for this site's own model
            flare.send(flare.FLModel(params=best_state or copy_state(pair.personal)))
            continue
        if flare.is_evaluate():  # cross-site evaluation: score the received model here, train nothing
            flare.send(flare.FLModel(metrics={"accuracy": score_received(input_model.params, num_classes, valid_loader)}))
            continue

        pair.receive(input_model)
        received = accuracy(pair.deputy, valid_loader)  # the server's model for this site, with this site's BatchNorm
        counts = GlobalStatistics.from_model(input_model).class_counts  # None without a prototype exchange
        weight = None if counts is None else counts.sum() / (num_classes * counts.clamp(min=1).float())

        for epoch in range(args.epochs):
            deputy_score = received if epoch == 0 else accuracy(pair.deputy, valid_loader)
            pair.phase(accuracy(pair.personal, valid_loader), deputy_score, just_downloaded=epoch == 0)
            prototypes.reset()  # the prototypes sent are those of the last epoch
            pair.personal.train(), pair.deputy.train()
            for images, labels in train_loader:
                embedding = pair.personal.features(images)
                z_personal, z_deputy = pair.personal.fc2(embedding), pair.deputy(images)
                extra_personal, extra_deputy = pair.distillation(z_personal, z_deputy)
                loss = (
                    F.cross_entropy(z_personal, labels, weight=weight)
                    + extra_personal
                    + F.cross_entropy(z_deputy, labels, weight=weight)
                    + extra_deputy
                )
                for optimizer in optimizers:
                    optimizer.zero_grad()
                loss.backward()
                for optimizer in optimizers:
                    optimizer.step()
                prototypes.update(embedding, labels)

        score = accuracy(pair.personal, valid_loader)
        if score > best_score:
            best_score, best_state = score, copy_state(pair.personal)
        round_idx = input_model.current_round
        print(f"{site} round {round_idx}: phase {pair.current_phase.name}, personal valid accuracy {score:.3f}")
        writer.add_scalar("personal_accuracy", score, round_idx)
        writer.add_scalar("received_accuracy", received, round_idx)
        # metrics: the score of the model received (the server keeps each site's best model by it), and P's
        output = pair.to_send(metrics={"accuracy": received, "personal_accuracy": score}, meta={NUM_SAMPLES: len(train_set)})
        flare.send(prototypes.attach(output, class_counts))


if __name__ == "__main__":
    main()
