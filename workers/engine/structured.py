"""Structured outputs inside continuous batching: each row with a response format has an llguidance
matcher; every step fills one mask row per such row (the grammar's state is per row) and applies
them to the batch's logits in one tensor operation, after the penalties and before sampling. The
chosen token then advances the row's matcher; a matcher that has stopped ends its sequence.

llguidance.torch is not imported: its module applies torch.compile at import, which imports
torch._dynamo and its dependencies (networkx, functorch, inductor): +45 MB of worker RSS for two
one-line helpers, written out here (_allocate_masks, _fill_mask).
"""

from __future__ import annotations

import math
from typing import Any

import llguidance.hf
import torch
from llguidance import LLMatcher, LLTokenizer

from shared.structured import grammar
from workers.engine.types import ErrorType, RequestError


class Grammars:
    """Compiles response formats for one model's tokenizer (its llguidance view takes ~0.4 s)."""

    def __init__(self, tokenizer: Any, vocab_size: int) -> None:
        self._tokenizer: LLTokenizer = llguidance.hf.from_tokenizer(tokenizer, n_vocab=vocab_size)

    def matcher(self, schema: str) -> LLMatcher:
        """A fresh matcher for this JSON schema (~1 ms); RequestError when it cannot be enforced."""
        matcher = LLMatcher(self._tokenizer, grammar(schema))
        if matcher.is_error():
            raise RequestError(ErrorType.INVALID_REQUEST, f"response_format: {matcher.get_error()}")
        return matcher


def mask_logits(logits: torch.Tensor, raw: torch.Tensor, matchers: list[LLMatcher | None]) -> torch.Tensor:
    """logits [rows, vocab] with every constrained row's disallowed tokens at -inf. Never writes
    into `raw` (the model's logits, which logprobs read): a copy is made when logits is raw."""
    constrained = [(row, matcher) for row, matcher in enumerate(matchers) if matcher is not None]
    if not constrained:
        return logits
    masks = _allocate_masks(len(constrained), logits.shape[1])
    for slot, (_, matcher) in enumerate(constrained):
        _fill_mask(matcher, masks[slot])
    index = torch.tensor([row for row, _ in constrained], device=logits.device)
    selected = logits.index_select(0, index).float()
    selected.masked_fill_(~_unpack(masks, selected.shape[1]).to(selected.device), -math.inf)
    masked = logits.float().clone() if logits is raw else logits
    masked.index_copy_(0, index, selected)
    return masked


def _allocate_masks(rows: int, vocab: int) -> torch.Tensor:
    """llguidance's bitmask layout: one bit per token, 32 to an int32, all allowed to start with."""
    return torch.full((rows, (vocab + 31) // 32), -1, dtype=torch.int32)


def _fill_mask(matcher: LLMatcher, mask: torch.Tensor) -> None:
    """The matcher's allowed next tokens written into one (contiguous, CPU) row of the bitmask."""
    matcher.unsafe_compute_mask_ptr(mask.data_ptr(), mask.numel() * mask.element_size())


def _unpack(masks: torch.Tensor, vocab: int) -> torch.Tensor:
    """llguidance's bitmask [rows, vocab / 32] int32 as allowed-token booleans [rows, vocab].

    llguidance.torch.apply_token_bitmask_inplace does this under torch.compile, which on CPU
    compiles C++ with a pool of worker processes at first use (seconds of stalled steps, and CPU
    taken from the forward pass); four plain tensor operations cost well under a millisecond here.
    """
    bits = torch.arange(32, dtype=torch.int32)
    allowed = (masks[:, :, None] >> bits) & 1
    return allowed.reshape(masks.shape[0], -1)[:, :vocab].bool()
