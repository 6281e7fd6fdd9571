"""Batch augmentation on uint8 image tensors, on whatever device they live (no per-epoch decoding).

Each sample draws its own parameters, vectorised over the batch. Dermoscopy (`DermAugment`):
vertical/horizontal flips, brightness, blur or noise, and a shift-scale-rotate affine (the authors'
pipeline, docs/authors_code.md §4.2), then normalisation to [-1, 1]. MRI slices (`SliceAugment`):
a left-right flip and a rotation applied jointly to the slice and its mask (the TMI paper's), or
`SliceAugment.extended()` with more geometry and grey-level changes of the slice.
torchvision's functional ops and torch's grid sampling do the pixel work.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

Draw = Callable[..., torch.Tensor]  # draw(*shape): uniform [0, 1) numbers from the augmentation's generator


def to_device(values: torch.Tensor, device: torch.device) -> torch.Tensor:
    """Host values (random draws made on the CPU, so that a run repeats on any device) onto `device` without
    waiting for it: a blocking copy to a GPU would first wait for every kernel queued there. The copy from pageable
    memory is staged before the call returns, so `values` may be freed at once; on the CPU it is `values` itself."""
    return values.to(device, non_blocking=True)


def normalize(images: torch.Tensor) -> torch.Tensor:
    """uint8 [B,C,H,W] -> float in [-1, 1] (mean 0.5, std 0.5 per channel)."""
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
            return to_device(torch.rand(*shape, generator=generator), dev)

        x = images.float().div_(255.0)
        vflip = draw(b) < self.flip_p
        hflip = draw(b) < self.flip_p
        x = torch.where(vflip[:, None, None, None], x.flip(-2), x)
        x = torch.where(hflip[:, None, None, None], x.flip(-1), x)

        factor = 1.0 + self.brightness * (2 * draw(b) - 1)
        factor = torch.where(draw(b) < self.brightness_p, factor, torch.ones_like(factor))
        x = x * factor[:, None, None, None]

        # one of {blur, noise} for a fraction of the batch; the noise is drawn for every sample (the generator's
        # stream), the blur computed only for the samples it applies to (per sample the same values)
        # which samples are blurred is decided on the host (the draws are there), so that a GPU is not waited for
        choose = torch.rand(b, generator=generator)
        apply = torch.rand(b, generator=generator) < self.blur_noise_p
        noisy = x + to_device(torch.randn(x.shape, generator=generator), dev) * (draw(b) * 0.05 + 0.01)[:, None, None, None]
        blur = to_device((apply & (choose < 0.5)).nonzero().flatten(), dev)
        x = torch.where(to_device(apply & (choose >= 0.5), dev)[:, None, None, None], noisy, x)
        if len(blur):
            # imported here: torchvision's import costs seconds of CPU (it loads torch._dynamo), which a FLARE server
            # that builds the task but never augments should not pay before its sites can start
            from torchvision.transforms.v2 import functional as TF

            x[blur] = TF.gaussian_blur(x[blur], kernel_size=[5, 5], sigma=[1.0, 1.0])

        x = self._affine(x, draw)
        return x.clamp_(0.0, 1.0).sub_(0.5).div_(0.5)

    def _affine(self, x: torch.Tensor, draw: Draw) -> torch.Tensor:
        grid = random_affine_grid(x.shape, draw, self.rotate_deg, self.scale, self.shift, self.affine_p)
        return F.grid_sample(x, grid, mode="bilinear", padding_mode="zeros", align_corners=False)


def random_affine_grid(shape: torch.Size, draw: Draw, rotate_deg: float, scale: float, shift: float, p: float) -> torch.Tensor:
    """A sampling grid of one shift-scale-rotate per sample (applied with probability p), for
    `F.grid_sample`: rotation in [-rotate_deg, rotate_deg], zoom 1 +- scale, shift +- shift of the side."""
    b = shape[0]
    angle = (2 * draw(b) - 1) * math.radians(rotate_deg)
    zoom = 1.0 + (2 * draw(b) - 1) * scale
    tx, ty = ((2 * draw(b) - 1) * shift * 2 for _ in range(2))  # grid units span [-1, 1]
    active = draw(b) < p
    angle = torch.where(active, angle, torch.zeros_like(angle))
    zoom = torch.where(active, zoom, torch.ones_like(zoom))
    tx = torch.where(active, tx, torch.zeros_like(tx))
    ty = torch.where(active, ty, torch.zeros_like(ty))
    cos, sin = torch.cos(angle) / zoom, torch.sin(angle) / zoom
    theta = torch.stack([torch.stack([cos, -sin, tx], 1), torch.stack([sin, cos, ty], 1)], 1)
    return F.affine_grid(theta, list(shape), align_corners=False)


@dataclass(frozen=True)
class SliceAugment:
    """Joint augmentation of grey-level MRI slices and their masks, vectorised over the batch.

    The defaults are the TMI paper's "random flip and rotation": a left-right flip (the patient's
    sides mirrored, an anatomy that occurs) and a rotation within +-rotate_deg, one grid for slice
    (bilinear) and mask (nearest), so the mask's classes are kept exactly. `extended()` adds what
    the paper does not state: front-back flips (anatomically impossible), zoom and shift, and for the
    slice alone a gamma and contrast change and Gaussian noise, which shrink the very difference
    between the sites' scanners that the methods are compared on.
    """

    hflip_p: float = 0.5  # left-right
    vflip_p: float = 0.0  # front-back
    rotate_deg: float = 20.0
    shift: float = 0.0
    scale: float = 0.0
    affine_p: float = 0.8
    gamma: float = 0.0  # gamma drawn in [1 - gamma, 1 + gamma]
    contrast: float = 0.0
    noise_std: float = 0.0

    @classmethod
    def extended(cls) -> SliceAugment:
        """The paper's flip and rotation plus front-back flips, zoom, shift, gamma, contrast and noise."""
        return cls(vflip_p=0.5, shift=0.05, scale=0.1, gamma=0.3, contrast=0.15, noise_std=0.03)

    def __call__(self, images: torch.Tensor, masks: torch.Tensor, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        """uint8 images [B,1,H,W] (0..255) and int masks [B,H,W] -> float images in about [-1, 1]
        and int64 masks. `generator` lives on the CPU."""
        b, dev = images.shape[0], images.device

        def draw(*shape: int) -> torch.Tensor:
            return to_device(torch.rand(*shape, generator=generator), dev)

        x = images.float().div_(255.0)
        y = masks[:, None].float()
        for dim, flip in ((-1, draw(b) < self.hflip_p), (-2, draw(b) < self.vflip_p)):
            x = torch.where(flip[:, None, None, None], x.flip(dim), x)
            y = torch.where(flip[:, None, None, None], y.flip(dim), y)
        if self.gamma or self.contrast or self.noise_std:
            gamma = 1.0 + self.gamma * (2 * draw(b) - 1)
            x = x.clamp_(min=0.0).pow(gamma[:, None, None, None])
            mean = x.mean(dim=(1, 2, 3), keepdim=True)
            x = (x - mean) * (1.0 + self.contrast * (2 * draw(b) - 1))[:, None, None, None] + mean
            x = x + to_device(torch.randn(x.shape, generator=generator), dev) * self.noise_std * draw(b)[:, None, None, None]
        grid = random_affine_grid(x.shape, draw, self.rotate_deg, self.scale, self.shift, self.affine_p)
        x = F.grid_sample(x, grid, mode="bilinear", padding_mode="zeros", align_corners=False)
        y = F.grid_sample(y, grid, mode="nearest", padding_mode="zeros", align_corners=False)
        return x.clamp_(0.0, 1.0).sub_(0.5).div_(0.5), y[:, 0].long()
