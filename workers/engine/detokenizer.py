"""A completion's text, decoded incrementally: each step decodes a few tokens, never the whole completion.

The method is vLLM's incremental detokenizer: decode a short window of tokens ending at the newest
one, and the same window without the new ones; the text the new tokens add is the difference. Text
already emitted is never revised: while the window's text ends with U+FFFD (half of a multi-byte
character split over byte tokens), the new tokens are held until a later token completes it. For
decoders where decoding is local at token boundaries (byte-level BPE, as SmolLM2's; the echo of the
placeholder engine) the emitted text equals a full decode of the tokens, minus such a trailing half
character (tests/workers/engine/test_output.py checks this on the real tokenizer).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

#: decode(token ids, skip_special_tokens) -> text: a tokenizer's decode.
Decode = Callable[[list[int], bool], str]

#: Tokens decoded before the new ones, as context (leading spaces, characters split over tokens).
_CONTEXT_TOKENS = 6


class IncrementalText:
    """The decoded text of one completion (special tokens skipped), kept up to date token by token."""

    def __init__(self, decode: Decode) -> None:
        self.decode = decode
        self._prefix_offset = 0  # first token of the context window
        self._read_offset = 0  # first token whose text is not emitted yet
        self._pieces: list[str] = []
        self.length = 0

    def update(self, tokens: Sequence[int]) -> str:
        """Decode the tokens past those already decoded (`tokens` is the whole completion so far);
        returns the text they add ("" while they end in half a character or are special)."""
        if self._read_offset >= len(tokens):
            return ""
        window = list(tokens[self._prefix_offset :])
        done = self._read_offset - self._prefix_offset
        before = self.decode(window[:done], True) if done else ""
        after = self.decode(window, True)
        if len(after) <= len(before) or after.endswith("\ufffd"):
            return ""
        added = after[len(before) :]
        self._read_offset = len(tokens)
        self._prefix_offset = max(0, len(tokens) - _CONTEXT_TOKENS)
        self._pieces.append(added)
        self.length += len(added)
        return added

    @property
    def text(self) -> str:
        """The text emitted so far (joined once; later calls reuse the join)."""
        if len(self._pieces) > 1:
            self._pieces = ["".join(self._pieces)]
        return self._pieces[0] if self._pieces else ""
