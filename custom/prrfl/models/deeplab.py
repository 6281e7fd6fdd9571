"""DeepLab-v2 with a ResNet-18 backbone, the segmentation network of PRR's prostate MRI experiment.

Backbone: a ResNet-18 trained from scratch (no pretrained weights), torchvision naming (conv1, bn1,
layer1 .. layer4 of two basic blocks each; a block has conv1/bn1/conv2/bn2 and, where the shape
changes, downsample.0 (1x1 conv) / downsample.1 (BN)). As in DeepLab-v2 (Chen et al., TPAMI 2018)
the last strides are replaced by atrous convolutions: at output stride 8, layer3 runs at stride 1 with
dilation 2 and layer4 at stride 1 with dilation 4 (every 3x3 conv of the layer, first block included).
Head: the DeepLab-v2 ASPP classifier, four parallel 3x3 atrous convs (rates 6/12/18/24) from the
layer4 features straight to class logits, summed; the logits are upsampled bilinearly to the input.

forward(x [B, in_channels, H, W]) -> (logits [B, num_classes, H, W], features [B, 8*width, h, w]),
h = ceil(H/8) at output stride 8. The features are the layer4 output, from which masked average
pooling gives class prototypes (512-d at the paper's width 64).

Size at width 64, 1 input channel, 2 classes: 11,207,112 parameters (42.8 MiB in float32) = the
backbone 11,170,240 (torchvision's ResNet-18 11,689,512, minus its fc 513,000, minus 6,272 for a
1-channel conv1) + the ASPP 36,872 (4 x (512*9*2 weights + 2 biases)); BN buffers not counted.
Width 32: 2,814,184 (10.7 MiB); width 16: 709,752 (2.7 MiB); feature dims 256 and 128, for CPU runs.
The backbone's state-dict keys and shapes are torchvision's resnet18 ones (fc aside).

PFA (`prrfl.algorithms.pfa`): every BN is an nn.BatchNorm2d (named bn1/bn2 or downsample.1), which
`batchnorm_keys(model)` finds by layer type. Backbone convs are
bias-free; the ASPP convs keep DeepLab-v2's biases (averaged by PFA as 1-D tensors). All four ASPP
branches [classes, D, 3, 3] output class logits, which are summed: `classifier_keys` names the four and PFA
mixes each row by row, one row of D*9 per class. `classifier_key` is "aspp.0.weight", the rate-6 branch
(the one layer a method that needs a single classifier uses).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

OUTPUT_STRIDES: tuple[int, ...] = (8, 16, 32)


class BasicBlock(nn.Module):
    """ResNet basic block (two 3x3 convs) whose convs may be atrous; torchvision's state-dict names."""

    expansion = 1

    def __init__(self, inplanes: int, planes: int, stride: int = 1, dilation: int = 1, downsample: nn.Module | None = None):
        super().__init__()
        self.conv1 = nn.Conv2d(inplanes, planes, 3, stride=stride, padding=dilation, dilation=dilation, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(planes, planes, 3, padding=dilation, dilation=dilation, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.downsample = downsample
        self.stride = stride

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + identity)


class DeepLabV2ResNet18(nn.Module):
    """DeepLab-v2 / ResNet-18: forward(x) -> (logits [B, classes, H, W], layer4 features [B, 8*width, h, w]).

    num_classes: segmentation classes (background included). in_channels: 1 for MRI slices.
    width: channels of layer1 (64 = ResNet-18; layer2..4 have 2x, 4x, 8x). feature_dim: 8*width, an
    alternative way to give the width (both may be given if they agree). atrous_rates: the ASPP
    dilations. output_stride: 8 (DeepLab-v2: layer3 dilation 2, layer4 dilation 4), 16 (layer4
    dilation 2) or 32 (plain ResNet strides). align_corners of the final bilinear upsampling: False.
    """

    classifier_key = "aspp.0.weight"  # the first (rate 6) ASPP branch; PFA mixes all four (classifier_keys) per class
    feature_dim = 512  # at the default width 64; instances hold 8 * width

    def __init__(
        self,
        num_classes: int = 2,
        in_channels: int = 1,
        feature_dim: int | None = None,
        atrous_rates: Sequence[int] = (6, 12, 18, 24),
        output_stride: int = 8,
        width: int | None = None,
    ):
        super().__init__()
        width = _resolve_width(width, feature_dim)
        if output_stride not in OUTPUT_STRIDES:
            raise ValueError(f"output_stride must be one of {OUTPUT_STRIDES}, got {output_stride}")
        rates = tuple(int(r) for r in atrous_rates)
        if not rates or any(r < 1 for r in rates):
            raise ValueError(f"atrous_rates must be positive integers, got {tuple(atrous_rates)}")
        if num_classes < 1 or in_channels < 1:
            raise ValueError(f"need num_classes >= 1 and in_channels >= 1, got {num_classes}, {in_channels}")
        self.num_classes = num_classes
        self.in_channels = in_channels
        self.width = width
        self.feature_dim = 8 * width
        self.atrous_rates = rates
        self.output_stride = output_stride

        # (stride, dilation) of layer3 and layer4 for each output stride
        (s3, d3), (s4, d4) = {8: ((1, 2), (1, 4)), 16: ((2, 1), (1, 2)), 32: ((2, 1), (2, 1))}[output_stride]
        self.inplanes = width
        self.conv1 = nn.Conv2d(in_channels, width, kernel_size=7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(kernel_size=3, stride=2, padding=1)
        self.layer1 = self._make_layer(width, 2)
        self.layer2 = self._make_layer(2 * width, 2, stride=2)
        self.layer3 = self._make_layer(4 * width, 2, stride=s3, dilation=d3)
        self.layer4 = self._make_layer(8 * width, 2, stride=s4, dilation=d4)
        self.aspp = nn.ModuleList(nn.Conv2d(self.feature_dim, num_classes, 3, padding=r, dilation=r, bias=True) for r in rates)
        self._init_weights()

    @property
    def classifier_keys(self) -> tuple[str, ...]:
        """State-dict keys of every ASPP branch weight (all of them produce class logits)."""
        return tuple(f"aspp.{i}.weight" for i in range(len(self.aspp)))

    def _make_layer(self, planes: int, blocks: int, stride: int = 1, dilation: int = 1) -> nn.Sequential:
        downsample = None
        if stride != 1 or self.inplanes != planes:
            downsample = nn.Sequential(nn.Conv2d(self.inplanes, planes, kernel_size=1, stride=stride, bias=False), nn.BatchNorm2d(planes))
        layers = [BasicBlock(self.inplanes, planes, stride, dilation, downsample)]
        self.inplanes = planes
        layers += [BasicBlock(planes, planes, dilation=dilation) for _ in range(1, blocks)]
        return nn.Sequential(*layers)

    def _init_weights(self) -> None:
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            elif isinstance(m, nn.BatchNorm2d):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)
        for conv in self.aspp:  # DeepLab-v2's classifier init
            nn.init.normal_(conv.weight, 0.0, 0.01)
            nn.init.zeros_(conv.bias)

    def features(self, x: torch.Tensor) -> torch.Tensor:
        """The layer4 feature map [B, 8*width, h, w]."""
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        return self.layer4(self.layer3(self.layer2(self.layer1(x))))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        feats = self.features(x)
        logits = self.aspp[0](feats)
        for branch in self.aspp[1:]:
            logits = logits + branch(feats)
        logits = F.interpolate(logits, size=x.shape[-2:], mode="bilinear", align_corners=False)
        return logits, feats


def feature_size(size: int, output_stride: int = 8) -> int:
    """Side of the feature map for an input side `size`: every stride-2 stage rounds up."""
    for _ in range(int(math.log2(output_stride))):
        size = (size + 1) // 2
    return size


def _resolve_width(width: int | None, feature_dim: int | None) -> int:
    if feature_dim is not None:
        if feature_dim < 8 or feature_dim % 8:
            raise ValueError(f"feature_dim must be a positive multiple of 8 (8 * width), got {feature_dim}")
        if width is not None and 8 * width != feature_dim:
            raise ValueError(f"width {width} and feature_dim {feature_dim} disagree (feature_dim = 8 * width)")
        return feature_dim // 8
    width = 64 if width is None else width
    if width < 1:
        raise ValueError(f"width must be positive, got {width}")
    return width
