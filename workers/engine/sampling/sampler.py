"""Token choice for a batch: greedy rows in one argmax, sampled rows each with their own generator
(temperature, then top-k, then top-p).

A per-request generator (numpy's PCG64, seeded from SamplingParams.seed) is drawn from exactly once
per generated token, whatever else shares the batch, so the same seed and prompt give the same text
batched or alone. The one exception: batched logits can differ from solo ones in the last float
bits (matrix kernels block differently per batch size), which can flip a draw that lands exactly
on a boundary between two tokens; greedy ties are exposed the same way.

Plain numpy on the host, not torch: the llama.cpp worker never imports torch (~200 MB of resident
memory for a few vector operations per step); the torch executor hands its logits over as numpy.
"""

from __future__ import annotations

import math
import random

import numpy as np

from workers.engine.types import SamplingParams

Generator = np.random.Generator


def make_generator(params: SamplingParams) -> Generator | None:
    """The request's generator; None for greedy."""
    if params.temperature == 0:
        return None
    return np.random.default_rng(params.seed if params.seed is not None else random.getrandbits(63))


def choose_tokens(
    logits: np.ndarray, params: list[SamplingParams], generators: list[Generator | None]
) -> list[int]:
    """One token per row of logits [rows, vocab]."""
    tokens: list[int] = logits.argmax(axis=-1).tolist()
    for row, (row_params, generator) in enumerate(zip(params, generators, strict=True)):
        if generator is not None:
            tokens[row] = _sample(logits[row], row_params, generator)
    return tokens


def _sample(logits: np.ndarray, params: SamplingParams, generator: Generator) -> int:
    scaled = logits.astype(np.float64) / params.temperature
    if 0 < params.top_k < len(scaled):
        # Top-k first (vLLM's order): tokens below the k-th largest logit get no probability
        # (ties with it stay), so top_k 1 draws the greedy token.
        scaled[scaled < np.partition(scaled, -params.top_k)[-params.top_k]] = -math.inf
    probs = np.exp(scaled - scaled.max())
    probs /= probs.sum()
    order: np.ndarray | None = None
    if params.top_p < 1.0:
        order, cumulative = _nucleus_candidates(scaled, probs, params.top_p)
        probs = probs[order]
        # Keep the smallest prefix whose mass reaches top_p (the first token always stays).
        cumulative = cumulative[: int(np.count_nonzero(cumulative - probs < params.top_p))]
    else:
        cumulative = np.cumsum(probs)
    # One draw per token, inverted through the cumulative mass: a token of zero probability (a
    # banned or masked one) spans no interval and cannot be drawn.
    chosen = int(np.searchsorted(cumulative, generator.random() * cumulative[-1], side="right"))
    if chosen == len(cumulative):  # the draw rounded up to the total: the last token with any mass
        chosen = int(np.flatnonzero(probs[: len(cumulative)])[-1])
    return int(order[chosen]) if order is not None else chosen


#: The nucleus search's first threshold, and each next one, as a factor of the last: tokens at
#: most 9 nats less likely than the likeliest (a few dozen, for a language model's distribution).
_NUCLEUS_STEP = math.exp(-9)


def _nucleus_candidates(scaled: np.ndarray, probs: np.ndarray, top_p: float) -> tuple[np.ndarray, np.ndarray]:
    """Token ids most likely first (ties by id: a stable sort of the whole vocabulary), a prefix of
    that sort long enough to hold top_p's nucleus, and their cumulative probabilities. Sorting the
    whole vocabulary costs more than the rest of a row's sampling; this sorts only the tokens at
    least as likely as a threshold, lowered until their cumulative mass reaches top_p. The nucleus
    then lies within them: every token outside is less likely than all of them, so in the whole
    sort it comes after them, where the mass before it is already at least top_p."""
    threshold = float(probs.max())
    while True:
        threshold *= _NUCLEUS_STEP  # underflows to 0 at last: then every token is a candidate
        candidates = np.flatnonzero(probs >= threshold)
        order = candidates[np.argsort(-scaled[candidates], kind="stable")]
        cumulative = np.cumsum(probs[order])
        if len(order) == len(probs) or cumulative[-1] >= top_p:
            return order, cumulative
