"""How a site's models compute, as the run's config says (`precision`, `channels_last`, `torch_compile`): faster
arithmetic on a GPU, with the same weights.

* `precision` "bf16": each model's forward runs under bfloat16 autocast (autocast chooses per operation: matrix
  products and convolutions in bfloat16, softmax and the like in float32) and its outputs come back as float32,
  so the losses, the prototypes, the metrics and the backward pass outside the forward are float32 computations.
  Parameters, gradients, optimiser state, uploads and checkpoints stay float32. bfloat16 has float32's range, so
  no loss scaling is needed.
* `channels_last`: the models' 4-D weights and inputs in channels-last memory order (N, H, W, C), the order of a
  GPU's fastest convolution kernels (tensor cores). Values and shapes are unchanged; state dicts keep the order,
  and load into any model of the architecture.
* `torch_compile`: the forward of each model a site trains, with the above, compiled by torch.compile (its
  backward too, through AOTAutograd); the optimiser steps and the method's own arithmetic stay eager. Compiling
  takes its time in the first batches (and again for evaluation mode and other batch sizes).

A model is set up once, where it is built for a site (`prepare_model`): the site's trained models
(`SiteRuntime.start`), and every model rebuilt to be evaluated, so that evaluation, cross-site evaluation,
`prrfl evaluate` and `prrfl predict` compute as training did. With the defaults (float32, neither option) a
model is left exactly as it was built: the default numbers are those of plain PyTorch.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from prrfl.config import RunConfig

AUTOCAST_DTYPES: dict[str, torch.dtype] = {"bf16": torch.bfloat16}  # config `precision` -> autocast dtype; float32: none
FIELDS = ("precision", "channels_last", "torch_compile")  # the config fields of the numerics


def numerics(cfg: RunConfig) -> dict[str, Any]:
    """The run's numerics by config field, as a site's results record them."""
    return {name: getattr(cfg, name) for name in FIELDS}


def prepare_model(model: torch.nn.Module, cfg: RunConfig, compiled: bool = False) -> torch.nn.Module:
    """`model`, already on its device, set up in place for the run's numerics, and returned. `compiled`: the
    model is one a site trains, whose forward is compiled when the config says `torch_compile` (a model that is
    only evaluated once is not worth compiling)."""
    dtype = AUTOCAST_DTYPES.get(cfg.precision)
    compile_it = compiled and cfg.torch_compile
    if cfg.channels_last:
        model.to(memory_format=torch.channels_last)
    if dtype is not None or cfg.channels_last or compile_it:
        model.forward = NumericsForward(model.forward, dtype, cfg.channels_last, compile_it)
    return model


class NumericsForward:
    """A model's own forward under the run's numerics, put in its place by `prepare_model`: a 4-D input in
    channels-last order, the forward under autocast to `dtype` (None: none), floating outputs back in float32,
    and all of it compiled by torch.compile when `compiled` (at the first call). The model's state dict is
    untouched. A copy of the model (copy.deepcopy) computes with the same numerics, uncompiled: a compiled
    function belongs to the model it was compiled for."""

    def __init__(self, forward: Callable[..., Any], dtype: torch.dtype | None, channels_last: bool, compiled: bool):
        self.forward, self.dtype, self.channels_last, self.compiled = forward, dtype, channels_last, compiled
        self.compiled_forward: Callable[..., Any] | None = None

    def __call__(self, x: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        if not self.compiled:
            return self.numerics(x, *args, **kwargs)
        if self.compiled_forward is None:
            self.compiled_forward = torch.compile(self.numerics)
        return self.compiled_forward(x, *args, **kwargs)

    def numerics(self, x: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        if self.channels_last and x.dim() == 4:
            x = x.contiguous(memory_format=torch.channels_last)
        if self.dtype is None:
            return self.forward(x, *args, **kwargs)
        with torch.autocast(x.device.type, dtype=self.dtype):
            out = self.forward(x, *args, **kwargs)
        return as_float32(out)

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "compiled": False, "compiled_forward": None}


def as_float32(out: Any) -> Any:
    """A model's output (a tensor, or a tuple or list of them and other values) with its floating tensors in float32."""
    if isinstance(out, torch.Tensor):
        return out.float() if out.is_floating_point() else out
    if isinstance(out, (tuple, list)):
        return type(out)(as_float32(o) for o in out)
    return out
