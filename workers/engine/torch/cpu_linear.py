"""A faster CPU path for the small matrix products of decode steps.

A decode step multiplies a handful of rows (one per running sequence) by each weight matrix.
`F.linear(x, W)` hands MKL the product x @ W^T, and for few rows MKL picks a slow kernel on AVX2
CPUs, where the same product computed as (W @ x^T)^T is several times faster. So plain fp32
`nn.Linear` layers on CPU compute small batches that way and keep F.linear for prefill-sized
inputs. Quantized layers (AWQ) and other devices are left alone. Results equal F.linear's up to
float rounding."""

from __future__ import annotations

import types

import torch
import torch.nn.functional as F
from torch import nn

#: Rows up to which the transposed product wins (decode batches); prefills use F.linear.
_MAX_ROWS = 64


def _transposed_linear(self: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    rows = x.numel() // x.shape[-1] if x.numel() else 0
    if rows == 0 or rows > _MAX_ROWS or x.dtype != self.weight.dtype:
        return F.linear(x, self.weight, self.bias)
    out = torch.mm(self.weight, x.reshape(rows, x.shape[-1]).t()).t()
    if self.bias is not None:
        out = out + self.bias
    return out.reshape(*x.shape[:-1], self.out_features)


def use_transposed_linear(model: nn.Module) -> int:
    """Route small-batch products of the model's plain fp32 CPU nn.Linear layers; returns how many."""
    patched = 0
    for module in model.modules():
        weight = getattr(module, "weight", None)
        if type(module) is not nn.Linear or not isinstance(weight, torch.Tensor):
            continue
        if weight.device.type != "cpu" or weight.dtype != torch.float32:
            continue
        module.forward = types.MethodType(_transposed_linear, module)  # type: ignore[method-assign]
        patched += 1
    return patched
