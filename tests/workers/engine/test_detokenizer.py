"""workers/engine/detokenizer.py: the text a completion's tokens add, decoded a window at a time,
adds up to the full decode, and a multi-byte character split over tokens is emitted whole, once
its last byte arrives. The decoder here is byte-level (one token per byte, as in byte-level BPE's
byte tokens), with one special token; tests/workers/engine/test_output.py checks the same on the
real tokenizer."""

from __future__ import annotations

from workers.engine.detokenizer import IncrementalText

SPECIAL = 256  # an end-of-text token: no bytes, skipped when asked


def _decode(tokens: list[int], skip_special_tokens: bool) -> str:
    raw = b"".join(
        b"<eos>" if t == SPECIAL else bytes([t]) for t in tokens if not (skip_special_tokens and t == SPECIAL)
    )
    return raw.decode("utf-8", errors="replace")


def _feed(tokens: list[int]) -> tuple[IncrementalText, list[str]]:
    text = IncrementalText(_decode)
    added = [text.update(tokens[: i + 1]) for i in range(len(tokens))]
    return text, added


def test_the_pieces_add_up_to_the_full_decode() -> None:
    tokens = list("Grüße aus Zürich — 東京 🙂, and a long tail of plain words".encode())
    text, added = _feed(tokens)
    assert "".join(added) == text.text == _decode(tokens, True)
    assert text.length == len(text.text)


def test_a_character_split_over_tokens_is_held_until_complete() -> None:
    tokens = list("a🙂".encode())  # 'a' then the emoji's 4 bytes, one token each
    _, added = _feed(tokens)
    assert added == ["a", "", "", "", "🙂"]  # never a U+FFFD, never revised


def test_special_tokens_add_nothing() -> None:
    tokens = [*b"hi", SPECIAL, *b" there"]
    text, added = _feed(tokens)
    assert added[2] == "" and text.text == "hi there"


def test_several_new_tokens_at_once_and_repeated_calls() -> None:
    text = IncrementalText(_decode)
    tokens = list("Grüße".encode())
    assert text.update(tokens[:2]) == "Gr"
    assert text.update(tokens[:3]) == ""  # 'ü' is half there: held, not emitted as U+FFFD
    assert text.update(tokens) == "üße"
    assert text.update(tokens) == ""  # nothing new
    assert text.text == "Grüße"


def test_each_step_decodes_a_bounded_window() -> None:
    """Decoding cost per token stays flat however long the completion grows."""
    longest: list[int] = []

    def counting(tokens: list[int], skip: bool) -> str:
        longest.append(len(tokens))
        return _decode(tokens, skip)

    text = IncrementalText(counting)
    tokens = list(b"x" * 500)
    for i in range(len(tokens)):
        text.update(tokens[: i + 1])
    assert max(longest) <= 8 and text.text == "x" * 500
