"""Log-probabilities of chosen (and prompt) tokens, and the top alternatives, for each row that asks.

They are the log-softmax of the model's raw logits, before logit_bias, penalties and temperature:
vLLM's default (`logprobs_mode="raw_logprobs"`), so a score does not depend on how the token was
sampled. The numbers are computed on the loop thread as arrays (one log-softmax and one top-k over
the rows that ask); the token strings are decoded once, when the sequence ends.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from workers.engine.types import TokenLogprob

#: Prompt positions scored per log-softmax: bounds the fp32 [positions, vocab] buffer (~100 MB).
_PROMPT_CHUNK = 512
#: Tokens decoded together to find what the newest one adds to the text (enough for any UTF-8
#: character split over byte tokens, and for tokenizers whose leading space depends on context).
_DECODE_WINDOW = 6


@dataclass(frozen=True, slots=True)
class RawLogprob:
    """A position's numbers before decoding: the token's log-probability and the top (id, logprob)s."""

    logprob: float | None
    top: tuple[tuple[int, float], ...] = ()


def step_logprobs(
    logits: np.ndarray, tokens: Sequence[int], tops: Sequence[int | None]
) -> list[RawLogprob | None]:
    """For each row of logits [rows, vocab] whose tops entry is not None: its token's log-probability
    and its tops[row] most likely tokens. Rows with None get None."""
    rows = [row for row, top in enumerate(tops) if top is not None]
    found: list[RawLogprob | None] = [None] * len(tops)
    if not rows:
        return found
    chosen = np.asarray([tokens[row] for row in rows], dtype=np.int64)
    scores = _score(logits[rows], chosen, [tops[row] or 0 for row in rows])
    for row, raw in zip(rows, scores, strict=True):
        found[row] = raw
    return found


def prompt_logprobs(logits: np.ndarray, prompt_ids: Sequence[int], top: int) -> list[RawLogprob]:
    """Each prompt token's log-probability given the tokens before it, from the prefill's logits
    [prompt, vocab] (row i predicts token i + 1); the first token has none."""
    found = [RawLogprob(None)]
    targets = np.asarray(list(prompt_ids[1:]), dtype=np.int64)
    for start in range(0, len(targets), _PROMPT_CHUNK):
        end = start + _PROMPT_CHUNK
        found.extend(_score(logits[start:end], targets[start:end], [top] * len(targets[start:end])))
    return found


def log_softmax(logits: np.ndarray) -> np.ndarray:
    """log_softmax over the last axis of logits [rows, vocab], fp32 out. The sum of exponentials
    accumulates in fp64: numpy sums a strided axis one element after another, and 49,152 fp32
    additions in a row drift by ~1e-4 (a transposed logits tensor from the torch path is strided)."""
    rows = np.ascontiguousarray(logits, dtype=np.float32)
    shifted = rows - rows.max(axis=-1, keepdims=True)
    total = np.exp(shifted).sum(axis=-1, keepdims=True, dtype=np.float64)
    result: np.ndarray = shifted - np.log(total).astype(np.float32)
    return result


def _score(logits: np.ndarray, chosen: np.ndarray, tops: list[int]) -> list[RawLogprob]:
    logprobs = log_softmax(logits)
    values = np.take_along_axis(logprobs, chosen[:, None], axis=1)[:, 0].tolist()
    most = max(tops, default=0)
    if not most:
        return [RawLogprob(value) for value in values]
    top_ids = _top_ids(logprobs, most)
    top_values = np.take_along_axis(logprobs, top_ids, axis=1).tolist()
    return [
        RawLogprob(value, tuple(zip(ids[:top], row_values[:top], strict=True)))
        for value, ids, row_values, top in zip(values, top_ids.tolist(), top_values, tops, strict=True)
    ]


def _top_ids(logprobs: np.ndarray, most: int) -> np.ndarray:
    """The `most` largest entries' ids per row, largest first (ties: the lower id first)."""
    most = min(most, logprobs.shape[1])
    candidates = np.argpartition(-logprobs, most - 1, axis=1)[:, :most]
    candidates.sort(axis=1)  # ascending ids, so the stable sort below puts a tie's lower id first
    order = np.argsort(-np.take_along_axis(logprobs, candidates, axis=1), axis=1, kind="stable")
    ranked: np.ndarray = np.take_along_axis(candidates, order, axis=1)
    return ranked


Decode = Callable[[list[int], bool], str]


def describe(
    decode: Decode, ids: Sequence[int], raws: Sequence[RawLogprob], text: str, skip_special: bool
) -> tuple[TokenLogprob, ...]:
    """The TokenLogprobs of `ids`, whose text (decoded, possibly cut at a stop string) is `text`.
    decode(ids, skip_special_tokens) is the tokenizer's decode."""
    pieces = _pieces(decode, ids, text, skip_special)
    return tuple(
        _entry(decode, token, raw, piece) for token, raw, piece in zip(ids, raws, pieces, strict=True)
    )


def describe_streamed(
    decode: Decode, ids: Sequence[int], raws: Sequence[RawLogprob], text: str, described: list[TokenLogprob]
) -> None:
    """Streaming: append to `described` (the entries streamed so far) those of the next tokens whose
    piece lies wholly inside `text`, the visible text so far. The newest token is left for later:
    only the last token of a result takes the text's remainder, so every entry appended here is
    the one describe() gives the finished completion."""
    used = sum(len(entry.text) for entry in described)
    for index in range(len(described), len(ids) - 1):
        added = _added(decode, ids, index, True)
        if used + added > len(text):
            return
        described.append(_entry(decode, ids[index], raws[index], text[used : used + added]))
        used += added


def _entry(decode: Decode, token: int, raw: RawLogprob, piece: str) -> TokenLogprob:
    return TokenLogprob(
        token_id=token,
        token=decode([token], False),
        text=piece,
        logprob=raw.logprob,
        top=tuple((top_id, decode([top_id], False), value) for top_id, value in raw.top),
    )


def _pieces(decode: Decode, ids: Sequence[int], text: str, skip_special: bool) -> list[str]:
    """What each token adds to `text`; the pieces concatenate to `text` exactly."""
    pieces, used = [], 0
    for index in range(len(ids)):
        end = min(len(text), used + _added(decode, ids, index, skip_special))
        pieces.append(text[used:end])
        used = end
    if pieces and used < len(text):
        pieces[-1] += text[used:]
    return pieces


def _added(decode: Decode, ids: Sequence[int], index: int, skip_special: bool) -> int:
    """Characters token `index` adds to the decoded text (decoded with the few tokens before it)."""
    window = list(ids[max(0, index - _DECODE_WINDOW) : index + 1])
    # A trailing U+FFFD is half a character: it is added by the token that completes it.
    added = len(decode(window, skip_special).rstrip("\ufffd")) - len(
        decode(window[:-1], skip_special).rstrip("\ufffd")
    )
    return max(0, added)


def finite(value: float) -> float:
    """A log-probability JSON can carry (-inf, from a banned token, becomes vLLM's -9999.0)."""
    return value if math.isfinite(value) else -9999.0
