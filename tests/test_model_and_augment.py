"""The paper's slim VGG-16BN and the on-tensor augmentation."""

from __future__ import annotations

import pytest
import torch

from prrfl.data.augment import DermAugment, normalize
from prrfl.models import SlimVGG16BN


def test_slim_vgg_matches_the_paper_size_and_outputs():
    model = SlimVGG16BN(num_classes=3)
    convs = [m for m in model.modules() if isinstance(m, torch.nn.Conv2d)]
    assert len(convs) == 13 and all(c.bias is None for c in convs)
    params = sum(p.numel() for p in model.parameters())
    assert params == 2_371_104  # conv 2,350,944 + fc 16,576 + BN 3,584 (docs/authors_code.md §4.1)
    assert params * 4 / 2**20 == pytest.approx(9.04, abs=0.01)  # the paper's "9.1 MB"
    model.eval()
    for size in (128, 64):
        logits, embedding = model(torch.randn(2, 3, size, size))
        assert logits.shape == (2, 3) and embedding.shape == (2, 64)
        assert (embedding >= 0).all()  # ReLU'd fc1 output, the prototype feature
        torch.testing.assert_close(logits, embedding @ model.fc2.weight.T)


def test_augmentation_is_per_sample_reproducible_and_in_range():
    images = torch.randint(0, 256, (32, 3, 24, 24), dtype=torch.uint8)
    aug = DermAugment()
    a = aug(images, torch.Generator().manual_seed(1))
    b = aug(images, torch.Generator().manual_seed(1))
    c = aug(images, torch.Generator().manual_seed(2))
    assert a.shape == (32, 3, 24, 24) and a.dtype == torch.float32
    assert torch.equal(a, b) and not torch.equal(a, c)
    assert a.min() >= -1 and a.max() <= 1
    # samples draw their own parameters: identical inputs come out differently
    same = images[:1].expand(16, -1, -1, -1).contiguous()
    out = aug(same, torch.Generator().manual_seed(3))
    assert len({tuple(o.flatten()[:50].tolist()) for o in out}) > 8


def test_augmentation_off_is_plain_normalisation():
    images = torch.randint(0, 256, (4, 3, 8, 8), dtype=torch.uint8)
    off = DermAugment(flip_p=0, brightness_p=0, blur_noise_p=0, affine_p=0)
    torch.testing.assert_close(off(images, torch.Generator().manual_seed(0)), normalize(images), atol=1e-5, rtol=0)
    assert normalize(torch.tensor([[[[0, 255]]]], dtype=torch.uint8)).tolist() == [[[[-1.0, 1.0]]]]
