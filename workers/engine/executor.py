"""The executor interface: runs a step plan's forward passes and owns which row holds which sequence.

`Executor` is the seam where a backend plugs in: the transformers model (torch/executor.py),
llama.cpp's kernels (llamacpp/executor.py), the placeholder's echo (placeholder/engine.py). `ModelBackend`
adds what the local engine (local.py) needs of a real model: its tokenizer, vocabulary and
grammars, and how it names itself. The engine core (core.py) calls it on
its loop thread only: prepare() once, then per step prefill() and join() for each admitted sequence,
decode() for every row, release() for the sequences that ended; close() when the loop ends.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from workers.engine.sequence import Sequence
from workers.engine.types import CacheStats

if TYPE_CHECKING:
    from workers.engine.sampling.structured import Grammars


class Executor(Protocol):
    """What the engine core needs from a backend: forward passes and the row <-> sequence map."""

    @property
    def rows(self) -> int:
        """Sequences holding a row (decoded by the next decode())."""

    @property
    def eos_token_ids(self) -> frozenset[int]:
        """Tokens that end a sequence (valid after prepare())."""

    @property
    def context_tokens(self) -> float:
        """The most tokens (prompt + completion) a sequence may hold (valid after prepare())."""

    def prepare(self) -> None:
        """Load and warm up, on the loop thread; raises FatalEngineError when it cannot serve."""

    def prefill(self, sequence: Sequence) -> int | None:
        """Run the sequence's prompt; returns its first token (None when it asks for none: max_tokens
        0). Its state is kept for join() until the next prefill()."""

    def join(self, sequence: Sequence) -> None:
        """Give the sequence just prefilled a row."""

    def decode(self) -> list[tuple[Sequence, list[int]]]:
        """One step for every row: each row's sequence and the tokens the step gave it, in row
        order. A forward pass gives one; a zero-cost echo several, in order (speculative decoding
        would too): the engine applies a row's tokens as one run (OutputProcessor.apply_run) and
        drops those after the token that ended its sequence."""

    def release(self, sequences: list[Sequence]) -> None:
        """Free the rows of these sequences (they ended)."""

    def take_mask_stats(self) -> tuple[float, int]:
        """Seconds spent on structured-output masks and rows masked since the last call."""

    def take_cache_stats(self) -> CacheStats:
        """The prefix cache since the last call (NO_CACHE from a backend without one)."""

    def close(self) -> None:
        """Free what prepare() allocated outside Python's heap (the loop has ended; called once)."""


class ModelBackend(Executor, Protocol):
    """An Executor over a real model with a Hugging Face tokenizer (all valid after prepare())."""

    @property
    def tokenizer(self) -> Any:
        """The tokenizer: chat template, prompt tokens, detokenization."""

    @property
    def vocab_size(self) -> int:
        """Columns of the logits (token ids a request may name)."""

    @property
    def fingerprint(self) -> str:
        """Identity of the weights and template: changes whenever outputs may."""

    @property
    def label(self) -> str:
        """What runs, for people: source, format, kernels, device."""

    @property
    def grammars(self) -> Grammars:
        """The response-format compiler for this tokenizer."""
