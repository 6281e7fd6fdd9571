"""Slim VGG-16-BN of the PRR papers for 128x128 RGB dermoscopy.

13 bias-free 3x3 conv units (conv -> BN -> ReLU) in five blocks, global average pooling, then
fc1 (256 -> 64, BN, ReLU) whose output is the 64-d embedding used for class prototypes, and the
classifier fc2 (64 -> classes). About 2.37 M parameters (9.1 MB in float32), as in the paper.
Global pooling makes the network usable at smaller inputs (the quick default runs at 64 px).
"""

from __future__ import annotations

import torch
from torch import nn

# (in, out) of every conv unit, grouped by block; each block ends with a 2x2 max-pool.
_BLOCKS: tuple[tuple[tuple[int, int], ...], ...] = (
    ((3, 32), (32, 32)),
    ((32, 64), (64, 64)),
    ((64, 128), (128, 128), (128, 128)),
    ((128, 128), (128, 128), (128, 128)),
    ((128, 256), (256, 256), (256, 256)),
)


class ConvUnit(nn.Module):
    def __init__(self, cin: int, cout: int):
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, kernel_size=3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(cout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.bn(self.conv(x)))


class SlimVGG16BN(nn.Module):
    """forward(x) -> (logits [B, classes], embedding [B, embed_dim])."""

    classifier_key = "fc2.weight"

    def __init__(self, num_classes: int = 3, embed_dim: int = 64, in_channels: int = 3):
        super().__init__()
        blocks = []
        for i, units in enumerate(_BLOCKS):
            layers = [ConvUnit(in_channels if (i == 0 and j == 0) else cin, cout) for j, (cin, cout) in enumerate(units)]
            blocks.append(nn.Sequential(*layers, nn.MaxPool2d(2)))
        self.features = nn.Sequential(*blocks)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc1 = nn.Linear(_BLOCKS[-1][-1][1], embed_dim, bias=False)
        self.fc1_bn = nn.BatchNorm1d(embed_dim)
        self.fc2 = nn.Linear(embed_dim, num_classes, bias=False)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        pooled = self.pool(self.features(x)).flatten(1)
        embedding = torch.relu(self.fc1_bn(self.fc1(pooled)))
        return self.fc2(embedding), embedding
