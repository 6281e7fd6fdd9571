"""DeepLab-v2 / ResNet-18 for prostate MRI: shapes, atrous rates, size, BN keys, determinism, PFA.

`python tests/test_deeplab.py` prints the CPU forward+backward throughput (slices/s, 2 threads).
"""

from __future__ import annotations

import math
import statistics
import time

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from prrfl.algorithms.pfa import batchnorm_keys, fourier_mix, pfa_aggregate
from prrfl.models.deeplab import DeepLabV2ResNet18, feature_size


def build(seed: int = 0, **kwargs) -> DeepLabV2ResNet18:
    torch.manual_seed(seed)
    return DeepLabV2ResNet18(**{"width": 16, **kwargs})


def conv_dilations(module: nn.Module) -> set[tuple[int, int]]:
    return {m.dilation for m in module.modules() if isinstance(m, nn.Conv2d) and m.kernel_size == (3, 3)}


@pytest.mark.parametrize("size", [(64, 64), (96, 96), (97, 97), (72, 57)])
def test_output_shapes_and_feature_stride(size):
    model = build().eval()
    x = torch.randn(2, 1, *size)
    with torch.no_grad():
        logits, features = model(x)
    assert logits.shape == (2, 2, *size)
    assert features.shape == (2, 128, math.ceil(size[0] / 8), math.ceil(size[1] / 8))
    assert features.shape[-2:] == tuple(feature_size(s) for s in size)
    assert (features >= 0).all()  # the ReLU'd layer4 output, the prototype feature map
    assert model.feature_dim == 8 * model.width == 128 and DeepLabV2ResNet18.feature_dim == 512


def test_options_classes_channels_stride_and_width():
    torch.manual_seed(0)
    model = DeepLabV2ResNet18(num_classes=3, in_channels=2, feature_dim=64, output_stride=16).eval()
    assert model.width == 8 and model.feature_dim == 64
    with torch.no_grad():
        logits, features = model(torch.randn(1, 2, 64, 80))
    assert logits.shape == (1, 3, 64, 80) and features.shape == (1, 64, 4, 5)
    assert DeepLabV2ResNet18().feature_dim == 512  # width 64 by default
    with pytest.raises(ValueError):
        DeepLabV2ResNet18(width=16, feature_dim=256)
    with pytest.raises(ValueError):
        DeepLabV2ResNet18(width=16, output_stride=4)


def test_atrous_rates_and_strides():
    model = build()
    assert conv_dilations(model.layer1) == conv_dilations(model.layer2) == {(1, 1)}
    assert conv_dilations(model.layer3) == {(2, 2)}
    assert conv_dilations(model.layer4) == {(4, 4)}
    for layer in (model.layer3, model.layer4):  # dilation instead of stride, "same" padding
        for m in layer.modules():
            if isinstance(m, nn.Conv2d):
                assert m.stride == (1, 1) and m.padding == (m.dilation[0] * (m.kernel_size[0] // 2),) * 2
    assert model.layer2[0].conv1.stride == (2, 2)
    assert [m.dilation for m in model.aspp] == [(6, 6), (12, 12), (18, 18), (24, 24)]
    assert [m.padding for m in model.aspp] == [(6, 6), (12, 12), (18, 18), (24, 24)]
    assert all(m.kernel_size == (3, 3) and m.bias is not None and m.out_channels == 2 for m in model.aspp)
    backbone_convs = [m for n, m in model.named_modules() if isinstance(m, nn.Conv2d) and not n.startswith("aspp")]
    assert len(backbone_convs) == 20 and all(m.bias is None for m in backbone_convs)  # 17 3x3/7x7 + 3 downsample


def test_initialisation():
    model = build(width=32)
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            assert torch.equal(m.weight, torch.ones_like(m.weight)) and torch.equal(m.bias, torch.zeros_like(m.bias))
    aspp = torch.cat([m.weight.flatten() for m in model.aspp])
    assert aspp.std().item() == pytest.approx(0.01, rel=0.05) and abs(aspp.mean().item()) < 1e-3
    assert all(torch.equal(m.bias, torch.zeros_like(m.bias)) for m in model.aspp)
    w = model.layer4[1].conv2.weight  # kaiming normal, fan_out: std sqrt(2 / (256 * 9))
    assert w.std().item() == pytest.approx(math.sqrt(2 / (256 * 9)), rel=0.05)


def test_batchnorm_keys_are_all_found_by_type():
    model = build()
    expected = {
        f"{name}.{leaf}"
        for name, m in model.named_modules()
        if isinstance(m, nn.BatchNorm2d)
        for leaf in ("weight", "bias", "running_mean", "running_var", "num_batches_tracked")
    }
    assert len(expected) == 20 * 5  # bn1 + 2 per block x 8 blocks + 3 downsample.1
    assert {k for k in expected if "downsample.1" in k}
    assert batchnorm_keys(model) == expected
    conv_keys = {f"{n}.{p}" for n, m in model.named_modules() if isinstance(m, nn.Conv2d) for p, _ in m.named_parameters()}
    assert len(conv_keys) == 20 + 8 and not conv_keys & expected
    assert set(model.state_dict()) == expected | conv_keys


def test_parameter_count_of_the_paper_width():
    import torchvision

    model = DeepLabV2ResNet18(num_classes=2, in_channels=1)
    count = sum(p.numel() for p in model.parameters())
    assert count == 11_207_112  # 42.75 MiB in float32
    resnet18 = torchvision.models.resnet18(weights=None)
    fc = sum(p.numel() for p in resnet18.fc.parameters())
    conv1_rgb_vs_gray = 64 * 7 * 7 * (3 - 1)
    aspp = 4 * (2 * 512 * 3 * 3 + 2)
    assert sum(p.numel() for p in resnet18.parameters()) == 11_689_512 and fc == 513_000 and aspp == 36_872
    assert count == 11_689_512 - fc - conv1_rgb_vs_gray + aspp
    # the backbone is torchvision's resnet18, key for key and shape for shape (with 3 input channels)
    ours = {k: v.shape for k, v in DeepLabV2ResNet18(in_channels=3).state_dict().items() if not k.startswith("aspp.")}
    assert ours == {k: v.shape for k, v in resnet18.state_dict().items() if not k.startswith("fc.")}
    assert sum(p.numel() for p in build(width=32).parameters()) == 2_814_184
    assert sum(p.numel() for p in build(width=16).parameters()) == 709_752


def test_same_seed_same_model_and_output():
    x = torch.randn(2, 1, 64, 64, generator=torch.Generator().manual_seed(5))
    a, b, c = build(seed=1), build(seed=1), build(seed=2)
    assert all(torch.equal(v, b.state_dict()[k]) for k, v in a.state_dict().items())
    assert not torch.equal(a.layer1[0].conv1.weight, c.layer1[0].conv1.weight)
    for mode in (False, True):
        a.train(mode), b.train(mode)
        la, fa = a(x)
        lb, fb = b(x)
        assert torch.equal(la, lb) and torch.equal(fa, fb)


def test_gradients_reach_every_parameter():
    model = build().train()
    x = torch.randn(2, 1, 64, 64)
    target = torch.randint(0, 2, (2, 64, 64))
    logits, _ = model(x)
    F.cross_entropy(logits, target).backward()
    for name, p in model.named_parameters():
        assert p.grad is not None, name
        assert torch.isfinite(p.grad).all() and p.grad.abs().sum() > 0, name


def test_pfa_runs_on_three_sites():
    model = build(width=16)
    sites = [build(seed=s, width=16).state_dict() for s in (1, 2, 3)]
    key = model.classifier_key
    assert key == "aspp.0.weight" and sites[0][key].shape == (2, 128, 3, 3)
    assert model.classifier_keys == tuple(f"aspp.{i}.weight" for i in range(4))
    bn = batchnorm_keys(model)
    out = pfa_aggregate(sites, 0.35, classifier_key=key, bn_keys=bn)  # BN found by layer type
    assert len(out) == 3
    for new, old in zip(out, sites):
        assert set(new) == set(old)
        for k, v in new.items():
            assert v.shape == old[k].shape and v.dtype == old[k].dtype, k
            if v.is_floating_point():
                assert torch.isfinite(v).all(), k
            if k in bn:
                assert torch.equal(v, old[k]), k  # BN stays at its site
    for k in ("aspp.0.bias", "aspp.3.bias"):  # biases: plain average
        torch.testing.assert_close(out[0][k], sum(s[k] for s in sites) / 3)
    # the classifier key is mixed as one row of D*3*3 per class
    stack = torch.stack([s[key].double() for s in sites]).flatten(2)
    rows = fourier_mix(stack, 0.35, ndim=1).view(3, *sites[0][key].shape)
    for k in range(3):
        torch.testing.assert_close(out[k][key], rows[k].float())
    # the mixed states load and run
    model.load_state_dict(out[1])
    logits, _ = model.eval()(torch.randn(1, 1, 64, 64))
    assert torch.isfinite(logits).all()


def test_pfa_classifier_rows_do_not_mix_across_classes():
    sites = [build(seed=1).state_dict() for _ in range(3)]
    key = DeepLabV2ResNet18.classifier_key
    for s, k in zip(sites, (0.0, 1.0, 2.0)):
        s[key] = s[key].clone()
        s[key][1] += k  # the sites differ in the foreground row only
    out = pfa_aggregate(sites, 0.45, classifier_key=key, bn_keys=batchnorm_keys(build()))
    for new, old in zip(out, sites):
        torch.testing.assert_close(new[key][0], old[key][0])  # the background row is untouched
    assert not torch.allclose(out[0][key][1], sites[0][key][1])
    same = pfa_aggregate([build(seed=4).state_dict() for _ in range(3)], 0.45, classifier_key=key, bn_keys=batchnorm_keys(build()))
    for k, v in build(seed=4).state_dict().items():  # identical sites: PFA gives them back
        torch.testing.assert_close(same[0][k], v, atol=1e-6, rtol=0)


def throughput(width: int, size: int, batch: int = 8, steps: int = 5) -> tuple[float, float]:
    """Forward + backward slices per second in training mode: (median, best) over `steps` timed
    steps after one warm-up step; the best is the figure least disturbed by a busy host."""
    model = build(width=width).train()
    x = torch.randn(batch, 1, size, size)
    target = torch.randint(0, 2, (batch, size, size))
    times = []
    for i in range(steps + 1):
        start = time.perf_counter()
        model.zero_grad(set_to_none=True)
        F.cross_entropy(model(x)[0], target).backward()
        if i:
            times.append(time.perf_counter() - start)
    return batch / statistics.median(times), batch / min(times)


if __name__ == "__main__":
    torch.set_num_threads(2)
    sizes = (64, 128, 256)
    print(f"forward+backward, batch 8, {torch.get_num_threads()} threads: slices/s, median / best step")
    print("width" + "".join(f"{s:>14d}px" for s in sizes))
    for width in (16, 32, 64):
        rates = [throughput(width, s) for s in sizes]
        print(f"{width:>5d}" + "".join(f"{m:>9.1f} /{b:>6.1f}" for m, b in rates), flush=True)
