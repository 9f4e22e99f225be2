"""Structured outputs inside continuous batching: each row with a response format has an llguidance
matcher; every step fills one mask row per such row (the grammar's state is per row) and applies
them to the batch's logits in one array operation, after the penalties and before sampling. The
chosen token then advances the row's matcher; a matcher that has stopped ends its sequence.

Plain numpy, as the rest of token choice (sampler.py): llguidance.torch would import torch, and
at import it applies torch.compile (torch._dynamo, networkx, functorch, inductor: +45 MB more) for
two one-line helpers, written out here (_allocate_masks, _fill_mask).
"""

from __future__ import annotations

import math
import threading
from typing import Any

import numpy as np
from llguidance import LLMatcher, LLTokenizer

from shared.structured import grammar
from workers.engine.tokenizer import tokenizer_json
from workers.engine.types import ErrorType, RequestError


class Grammars:
    """Compiles response formats for one model's tokenizer.

    llguidance's view of the tokenizer (~35 MiB resident for SmolLM2's 49k tokens) is built by the
    first response format, as vLLM's structured-output manager builds its backend on first use: a
    worker that serves none never holds it. The price, once per worker: that request's thread builds
    it (~0.3 s) holding the GIL, so the engine loop's next step waits as long. The tokenizer's JSON
    is taken at start (~4 MB), so building the view later reads nothing the engine's threads share."""

    def __init__(self, tokenizer: Any, vocab_size: int) -> None:
        # llguidance.hf.from_tokenizer does the same from a transformers tokenizer only (and its
        # isinstance check imports transformers' tokenizer classes, torch with them).
        self._source: tuple[str, int, int | None] | None = (
            tokenizer_json(tokenizer), vocab_size, tokenizer.eos_token_id
        )  # fmt: skip
        self._view: LLTokenizer | None = None
        self._lock = threading.Lock()  # two first response formats at once build one view

    @property
    def built(self) -> bool:
        """Whether llguidance's view of the tokenizer exists (a response format was compiled)."""
        return self._view is not None

    def matcher(self, schema: str) -> LLMatcher:
        """A fresh matcher for this JSON schema (cheap); RequestError when it cannot be enforced."""
        matcher = LLMatcher(self._tokenizer(), grammar(schema))
        if matcher.is_error():
            raise RequestError(ErrorType.INVALID_REQUEST, f"response_format: {matcher.get_error()}")
        return matcher

    def _tokenizer(self) -> LLTokenizer:
        with self._lock:
            if self._view is None:
                assert self._source is not None
                text, vocab_size, eos = self._source
                try:
                    self._view = LLTokenizer(text, n_vocab=vocab_size, eos_token=eos)
                except Exception as exc:  # this tokenizer: no response format can run, all else can
                    message = f"response_format: llguidance cannot read this model's tokenizer: {exc}"
                    raise RequestError(ErrorType.INVALID_REQUEST, message) from exc
                self._source = None  # the view holds what it needs
            return self._view


def mask_logits(logits: np.ndarray, raw: np.ndarray, matchers: list[LLMatcher | None]) -> np.ndarray:
    """logits [rows, vocab] with every constrained row's disallowed tokens at -inf. Never writes
    into `raw` (the model's logits, which logprobs read): a copy is made when logits is raw."""
    constrained = [(row, matcher) for row, matcher in enumerate(matchers) if matcher is not None]
    if not constrained:
        return logits
    masks = _allocate_masks(len(constrained), logits.shape[1])
    for slot, (_, matcher) in enumerate(constrained):
        _fill_mask(matcher, masks[slot])
    rows = [row for row, _ in constrained]
    masked = logits.astype(np.float32, copy=True) if logits is raw else logits
    selected = masked[rows]
    selected[~_unpack(masks, selected.shape[1])] = -math.inf
    masked[rows] = selected
    return masked


def _allocate_masks(rows: int, vocab: int) -> np.ndarray:
    """llguidance's bitmask layout: one bit per token, 32 to an int32, all allowed to start with."""
    return np.full((rows, (vocab + 31) // 32), -1, dtype=np.int32)


def _fill_mask(matcher: LLMatcher, mask: np.ndarray) -> None:
    """The matcher's allowed next tokens written into one (contiguous) row of the bitmask."""
    matcher.unsafe_compute_mask_ptr(mask.ctypes.data, mask.nbytes)


def _unpack(masks: np.ndarray, vocab: int) -> np.ndarray:
    """llguidance's bitmask [rows, vocab / 32] int32 as allowed-token booleans [rows, vocab]: token
    t is bit t % 32 of word t // 32, so on a little-endian host bit t % 8 of byte t // 8."""
    bits = np.unpackbits(masks.view(np.uint8), axis=1, bitorder="little")
    allowed: np.ndarray = bits[:, :vocab].astype(bool)
    return allowed
