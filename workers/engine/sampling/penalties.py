"""Per-row logit adjustments of one batched step: min_tokens, logit_bias, then the penalties.

The order is vLLM v1's sampler's: min_tokens masks the end-of-sequence tokens, logit_bias adds to
the named tokens, then repetition, frequency and presence penalties. Each is one array operation
over the rows that ask for it (no Python loop over tokens), and each row reads only its own
prompt and completion, so a row's adjusted logits do not depend on what shares its batch: batched
output stays equal to solo output.

repetition_penalty follows vLLM (and the CTRL paper): a token seen in the prompt or the completion
has a positive logit divided by it and a negative one multiplied by it. frequency_penalty and
presence_penalty follow OpenAI: logit -= frequency * count + presence * (count > 0), counting the
completion only.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Sequence

import numpy as np

from workers.engine.types import SamplingParams


def adjusts(params: SamplingParams) -> bool:
    """Whether these parameters change any logit (rows that do not skip all of this)."""
    return bool(
        params.min_tokens
        or params.logit_bias
        or params.presence_penalty
        or params.frequency_penalty
        or params.repetition_penalty != 1.0
    )


def adjust_logits(
    logits: np.ndarray,
    params: Sequence[SamplingParams],
    prompts: Sequence[Sequence[int]],
    completions: Sequence[Sequence[int]],
    eos_ids: Collection[int],
) -> np.ndarray:
    """The logits [rows, vocab] to choose from: `logits` itself when no row adjusts, else an fp32 copy."""
    rows = [row for row, row_params in enumerate(params) if adjusts(row_params)]
    if not rows:
        return logits
    chosen = [params[row] for row in rows]
    selected = logits[rows].astype(np.float32)  # a copy (fancy indexing)
    _mask_eos(selected, chosen, [len(completions[row]) for row in rows], eos_ids)
    _add_bias(selected, chosen)
    selected = _penalise(selected, chosen, [prompts[row] for row in rows], [completions[row] for row in rows])
    adjusted = logits.astype(np.float32, copy=True)
    adjusted[rows] = selected
    return adjusted


def _mask_eos(
    logits: np.ndarray, params: list[SamplingParams], generated: list[int], eos_ids: Collection[int]
) -> None:
    short = [row for row, (row_params, count) in enumerate(zip(params, generated, strict=True))
             if count < row_params.min_tokens]  # fmt: skip
    if not short or not eos_ids:
        return
    logits[np.ix_(short, sorted(eos_ids))] = -math.inf


def _add_bias(logits: np.ndarray, params: list[SamplingParams]) -> None:
    entries = [
        (row, token, bias)
        for row, row_params in enumerate(params)
        for token, bias in row_params.logit_bias.items()
    ]
    if not entries:
        return
    rows, tokens, biases = zip(*entries, strict=True)
    np.add.at(logits, (list(rows), list(tokens)), np.asarray(biases, dtype=logits.dtype))


def _penalise(
    logits: np.ndarray,
    params: list[SamplingParams],
    prompts: list[Sequence[int]],
    completions: list[Sequence[int]],
) -> np.ndarray:
    def column(values: list[float]) -> np.ndarray:
        return np.asarray(values, dtype=logits.dtype)[:, None]

    counts = token_counts(completions, logits.shape[1])
    repetition = column([p.repetition_penalty for p in params])
    if bool((repetition != 1.0).any()):
        seen = (token_counts(prompts, logits.shape[1]) > 0) | (counts > 0)
        penalised = np.where(logits > 0, logits / repetition, logits * repetition)
        logits = np.where(seen, penalised, logits)
    frequency = column([p.frequency_penalty for p in params])
    presence = column([p.presence_penalty for p in params])
    adjusted: np.ndarray = logits - frequency * counts - presence * (counts > 0).astype(logits.dtype)
    return adjusted


def token_counts(token_lists: Sequence[Sequence[int]], vocab: int) -> np.ndarray:
    """Occurrences of each token per row, [rows, vocab] fp32 (ids past the vocabulary are not counted)."""
    counts = np.zeros((len(token_lists), vocab), dtype=np.float32)
    for row, tokens in enumerate(token_lists):
        if len(tokens):
            counts[row] = np.bincount(np.asarray(tokens, dtype=np.int64), minlength=vocab)[:vocab]
    return counts
