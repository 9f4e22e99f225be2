"""workers/engine/torch/cpu_linear.py: only plain fp32 CPU nn.Linear layers are rerouted, and a rerouted
layer gives F.linear's result (up to float rounding) for decode-sized and prefill-sized inputs,
with and without bias, for any leading shape."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from workers.engine.torch.cpu_linear import use_transposed_linear


class _Subclass(nn.Linear):  # e.g. a quantized layer: its own forward must stay
    pass


def test_only_plain_fp32_linears_are_patched() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 8).double(), _Subclass(8, 8), nn.Embedding(4, 8))
    assert use_transposed_linear(model) == 1
    assert "forward" in vars(model[0]) and "forward" not in vars(model[1]) and "forward" not in vars(model[2])


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("shape", [(1, 64), (4, 64), (2, 3, 64), (1, 1, 64), (200, 64), (0, 64)])
def test_results_equal_f_linear(bias: bool, shape: tuple[int, ...]) -> None:
    torch.manual_seed(1)
    layer = nn.Linear(64, 96, bias=bias)
    x = torch.randn(*shape)
    expected = F.linear(x, layer.weight, layer.bias)
    use_transposed_linear(layer)
    got = layer(x)
    assert got.shape == expected.shape
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


def test_a_patched_model_keeps_its_outputs() -> None:
    torch.manual_seed(2)
    model = nn.Sequential(nn.Linear(32, 48), nn.GELU(), nn.Linear(48, 16))
    x = torch.randn(5, 32)
    with torch.no_grad():
        before = model(x)
        use_transposed_linear(model)
        torch.testing.assert_close(model(x), before, rtol=1e-5, atol=1e-5)
