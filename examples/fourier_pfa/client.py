"""One site's training script (FLARE Client API): a personalized model and its deputy (DET).

The site keeps its personalized model P; the server's model for this site goes into the deputy D.
Each epoch DET compares the two on the site's validation images and decides which one distils from
the other. D's weights (without BatchNorm) go back to the server, with the site's class prototypes and
class counts; the global class counts the server returns weight the cross entropy (class balance).
"""

import argparse

import nvflare.client as flare
import torch
import torch.nn.functional as F
from model import Net
from torch.utils.data import DataLoader
from torchvision import datasets, transforms

from prrfl.flare.components import NUM_SAMPLES, GlobalStatistics, PersonalizedPair, PrototypeTracker


def accuracy(model: torch.nn.Module, loader: DataLoader) -> float:
    model.eval()
    correct = total = 0
    with torch.no_grad():
        for images, labels in loader:
            correct += (model(images).argmax(dim=1) == labels).sum().item()
            total += len(labels)
    return correct / max(total, 1)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--data_root", required=True, help="folder with one ImageFolder per site: <site>/train, <site>/valid")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch_size", type=int, default=16)
    parser.add_argument("--lr", type=float, default=0.05)
    args = parser.parse_args()

    flare.init()
    site = flare.get_site_name()
    transform = transforms.Compose([transforms.ToTensor(), transforms.Normalize([0.5] * 3, [0.5] * 3)])
    train_set = datasets.ImageFolder(f"{args.data_root}/{site}/train", transform)
    valid_set = datasets.ImageFolder(f"{args.data_root}/{site}/valid", transform)
    train_loader = DataLoader(train_set, batch_size=args.batch_size, shuffle=True)
    valid_loader = DataLoader(valid_set, batch_size=64)
    num_classes = len(train_set.classes)
    class_counts = torch.bincount(torch.tensor(train_set.targets), minlength=num_classes)

    pair = PersonalizedPair(Net(num_classes), Net(num_classes))
    optimizers = [torch.optim.SGD(m.parameters(), lr=args.lr, momentum=0.9) for m in (pair.personal, pair.deputy)]
    prototypes = PrototypeTracker(num_classes)

    while flare.is_running():
        input_model = flare.receive()
        pair.receive(input_model)
        counts = GlobalStatistics.from_model(input_model).class_counts  # None in the first round
        weight = None if counts is None else counts.sum() / (num_classes * counts.clamp(min=1).float())

        for epoch in range(args.epochs):
            pair.phase(accuracy(pair.personal, valid_loader), accuracy(pair.deputy, valid_loader), just_downloaded=epoch == 0)
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
        print(f"{site} round {input_model.current_round}: phase {pair.current_phase.name}, personal valid accuracy {score:.3f}")
        output = pair.to_send(metrics={"accuracy": score}, meta={NUM_SAMPLES: len(train_set)})
        flare.send(prototypes.attach(output, class_counts))


if __name__ == "__main__":
    main()
