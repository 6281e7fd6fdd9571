"""Batch augmentation on uint8 image tensors, on whatever device they live (no per-epoch decoding).

Each sample draws its own parameters, vectorised over the batch: vertical/horizontal flips,
brightness, blur or noise, and a shift-scale-rotate affine (the authors' pipeline, docs/authors_code.md
§4.2), then normalisation to [-1, 1]. torchvision's functional ops do the pixel work.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torchvision.transforms.v2 import functional as TF


def normalize(images: torch.Tensor) -> torch.Tensor:
    """uint8 [B,3,H,W] -> float in [-1, 1] (mean 0.5, std 0.5 per channel)."""
    return images.float().div_(127.5).sub_(1.0)


@dataclass(frozen=True)
class DermAugment:
    flip_p: float = 0.5
    brightness: float = 0.2
    brightness_p: float = 0.75
    blur_noise_p: float = 0.7
    shift: float = 0.1
    scale: float = 0.1
    rotate_deg: float = 15.0
    affine_p: float = 0.85

    def __call__(self, images: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        """uint8 [B,3,H,W] -> augmented float [B,3,H,W] in about [-1, 1]. `generator` lives on the CPU."""
        b = images.shape[0]
        dev = images.device

        def draw(*shape: int) -> torch.Tensor:
            return torch.rand(*shape, generator=generator).to(dev)

        x = images.float().div_(255.0)
        vflip = draw(b) < self.flip_p
        hflip = draw(b) < self.flip_p
        x = torch.where(vflip[:, None, None, None], x.flip(-2), x)
        x = torch.where(hflip[:, None, None, None], x.flip(-1), x)

        factor = 1.0 + self.brightness * (2 * draw(b) - 1)
        factor = torch.where(draw(b) < self.brightness_p, factor, torch.ones_like(factor))
        x = x * factor[:, None, None, None]

        # one of {blur, noise} for a fraction of the batch
        choose = draw(b)
        apply = draw(b) < self.blur_noise_p
        blurred = TF.gaussian_blur(x, kernel_size=[5, 5], sigma=[1.0, 1.0])
        noisy = x + torch.randn(x.shape, generator=generator).to(dev) * (draw(b) * 0.05 + 0.01)[:, None, None, None]
        mixed = torch.where((choose < 0.5)[:, None, None, None], blurred, noisy)
        x = torch.where(apply[:, None, None, None], mixed, x)

        x = self._affine(x, draw)
        return x.clamp_(0.0, 1.0).sub_(0.5).div_(0.5)

    def _affine(self, x: torch.Tensor, draw) -> torch.Tensor:
        b = x.shape[0]
        angle = (2 * draw(b) - 1) * math.radians(self.rotate_deg)
        scale = 1.0 + (2 * draw(b) - 1) * self.scale
        tx, ty = ((2 * draw(b) - 1) * self.shift * 2 for _ in range(2))  # grid units span [-1, 1]
        active = draw(b) < self.affine_p
        angle = torch.where(active, angle, torch.zeros_like(angle))
        scale = torch.where(active, scale, torch.ones_like(scale))
        tx = torch.where(active, tx, torch.zeros_like(tx))
        ty = torch.where(active, ty, torch.zeros_like(ty))
        cos, sin = torch.cos(angle) / scale, torch.sin(angle) / scale
        theta = torch.stack([torch.stack([cos, -sin, tx], 1), torch.stack([sin, cos, ty], 1)], 1)
        grid = F.affine_grid(theta, list(x.shape), align_corners=False)
        return F.grid_sample(x, grid, mode="bilinear", padding_mode="zeros", align_corners=False)
