"""One step's token choice for a batch of rows, shared by every executor that has logits.

Each row's logits are first adjusted by its own min_tokens, logit_bias and penalties (penalties.py,
vLLM's order), then masked by its response format's grammar (structured.py), then greedy at
temperature 0, else temperature + top-p with its per-request generator (sampler.py). With
SamplingParams.logprobs each chosen token's raw log-probability is kept (logprobs.py: before any
adjustment, as vLLM). One function for every backend, so a request samples, masks and scores the
same whichever kernels computed its logits.
"""

from __future__ import annotations

import time
from collections.abc import Collection

import numpy as np

from workers.engine.sampling.logprobs import step_logprobs
from workers.engine.sampling.penalties import adjust_logits
from workers.engine.sampling.sampler import choose_tokens
from workers.engine.sampling.structured import mask_logits
from workers.engine.sequence import Sequence


class TokenChooser:
    """Chooses each row's next token and counts the time spent on structured-output masks."""

    def __init__(self, eos_token_ids: Collection[int]) -> None:
        self._eos_token_ids = eos_token_ids
        self._mask_s = 0.0
        self._masked_rows = 0

    def choose(self, logits: np.ndarray, sequences: list[Sequence]) -> list[int]:
        """One token per row of logits [rows, vocab]: each row's adjustments, then its sampling.
        `logits` is read, never written (logprobs score it raw)."""
        params = [sequence.request.params for sequence in sequences]
        adjusted = adjust_logits(
            logits,
            params,
            [sequence.prompt_ids for sequence in sequences],
            [sequence.completion for sequence in sequences],
            self._eos_token_ids,
        )
        matchers = [sequence.matcher for sequence in sequences]
        if any(matcher is not None for matcher in matchers):
            began = time.perf_counter()
            adjusted = mask_logits(adjusted, logits, matchers)
            self._mask_s += time.perf_counter() - began
            self._masked_rows += sum(matcher is not None for matcher in matchers)
        tokens = choose_tokens(adjusted, params, [sequence.generator for sequence in sequences])
        # Scored on the raw logits: vLLM's default, independent of penalties and temperature.
        scores = step_logprobs(logits, tokens, [row_params.logprobs for row_params in params])
        for sequence, score in zip(sequences, scores, strict=True):
            if score is not None:
                sequence.scores.append(score)
        return tokens

    def take_mask_stats(self) -> tuple[float, int]:
        """Seconds spent on structured-output masks and rows masked since the last call."""
        stats = self._mask_s, self._masked_rows
        self._mask_s, self._masked_rows = 0.0, 0
        return stats
