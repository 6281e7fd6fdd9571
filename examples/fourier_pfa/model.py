"""A small CNN for 3-class 32 x 32 colour images: the same network at every site and on the server."""

import torch
from torch import nn


class Net(nn.Module):
    def __init__(self, num_classes: int = 3):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(8)
        self.conv2 = nn.Conv2d(8, 16, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(16)
        self.fc1 = nn.Linear(16, 32)
        self.fc2 = nn.Linear(32, num_classes)  # the classifier: one row per class

    def features(self, x: torch.Tensor) -> torch.Tensor:
        """The embedding (input of the classifier), from which the class prototypes are computed."""
        x = torch.max_pool2d(torch.relu(self.bn1(self.conv1(x))), 2)
        x = torch.max_pool2d(torch.relu(self.bn2(self.conv2(x))), 2)
        return torch.relu(self.fc1(x.mean(dim=(2, 3))))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.features(x))
