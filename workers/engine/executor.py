"""The executor interface: runs a step plan's forward passes and owns which row holds which sequence.

`Executor` is the seam where a backend plugs in: the transformers model (model_executor.py), the
placeholder's echo (placeholder.py), or another set of kernels. The engine core (core.py) calls it on
its loop thread only: prepare() once, then per step prefill() and join() for each admitted sequence,
decode() for every row, release() for the sequences that ended.
"""

from __future__ import annotations

from typing import Protocol

from workers.engine.sequence import Sequence


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

    def decode(self) -> list[tuple[Sequence, int]]:
        """One step for every row: each row's sequence and its next token, in row order."""

    def release(self, sequences: list[Sequence]) -> None:
        """Free the rows of these sequences (they ended)."""

    def take_mask_stats(self) -> tuple[float, int]:
        """Seconds spent on structured-output masks and rows masked since the last call."""
