"""Token choice for a batch: greedy rows in one argmax, sampled rows each with their own generator.

A per-request `torch.Generator` (seeded from SamplingParams.seed) is drawn from exactly once per
generated token, whatever else shares the batch, so the same seed and prompt give the same text
batched or alone. The one exception: batched logits can differ from solo ones in the last float
bits (matrix kernels block differently per batch size), which can flip a draw that lands exactly
on a boundary between two tokens; greedy ties are exposed the same way.
"""

from __future__ import annotations

import random

import torch

from workers.engine.types import SamplingParams


def make_generator(params: SamplingParams) -> torch.Generator | None:
    """The request's generator (CPU: draws are cheap and device-independent); None for greedy."""
    if params.temperature == 0:
        return None
    generator = torch.Generator(device="cpu")
    generator.manual_seed(params.seed if params.seed is not None else random.getrandbits(63))
    return generator


def choose_tokens(
    logits: torch.Tensor, params: list[SamplingParams], generators: list[torch.Generator | None]
) -> list[int]:
    """One token per row of logits [rows, vocab]."""
    tokens: list[int] = logits.argmax(dim=-1).tolist()
    for row, (row_params, generator) in enumerate(zip(params, generators, strict=True)):
        if generator is not None:
            tokens[row] = _sample(logits[row], row_params, generator)
    return tokens


def _sample(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator) -> int:
    scaled = logits.float().cpu() / params.temperature
    if params.top_p >= 1.0:
        return int(torch.multinomial(torch.softmax(scaled, dim=-1), 1, generator=generator).item())
    ordered, order = torch.sort(scaled, descending=True)
    probs = torch.softmax(ordered, dim=-1)
    # Keep the smallest prefix whose mass reaches top_p (the first token always stays).
    outside = (torch.cumsum(probs, dim=-1) - probs) >= params.top_p
    probs = probs.masked_fill(outside, 0.0)
    choice = torch.multinomial(probs, 1, generator=generator)
    return int(order[choice].item())
