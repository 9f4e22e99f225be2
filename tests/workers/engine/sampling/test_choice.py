"""workers/engine/sampling/choice.py: one token per row, each row under its own parameters whatever shares
the step; log-probabilities scored on the raw logits, which are never written; mask time counted
and handed over once."""

from __future__ import annotations

import concurrent.futures
import time

import numpy as np

from workers.engine.detokenizer import IncrementalText
from workers.engine.sampling.choice import TokenChooser
from workers.engine.sequence import Sequence, SequenceStatus
from workers.engine.types import GenerationRequest, GenerationResult, SamplingParams

EOS = 0


def _decode(ids: list[int], skip_special_tokens: bool) -> str:
    return " ".join(map(str, ids))


def _sequence(**params: object) -> Sequence:
    request = GenerationRequest("r", SamplingParams(**{"max_tokens": 8, **params}), prompt="x")
    future: concurrent.futures.Future[GenerationResult] = concurrent.futures.Future()
    return Sequence(
        request=request, future=future, prompt_ids=[5, 6], reservation=0, generator=None,
        submitted_at=time.monotonic(), text=IncrementalText(_decode),
        status=SequenceStatus.RUNNING,
    )  # fmt: skip


def _logits(rows: int, vocab: int = 32) -> np.ndarray:
    return np.random.default_rng(rows).standard_normal((rows, vocab), dtype=np.float32)


def test_greedy_rows_take_their_argmax_and_the_logits_stay_as_they_were() -> None:
    logits = _logits(3)
    before = logits.copy()
    tokens = TokenChooser({EOS}).choose(logits, [_sequence() for _ in range(3)])
    assert tokens == logits.argmax(axis=-1).tolist()
    assert np.array_equal(logits, before)  # logprobs are scored on these: nothing may adjust them in place


def test_each_row_follows_its_own_parameters() -> None:
    """A logit bias on one row moves that row's choice only."""
    logits = _logits(2)
    target = int(logits[0].argmin())
    biased, plain = _sequence(logit_bias={target: 100.0}), _sequence()
    tokens = TokenChooser({EOS}).choose(logits, [biased, plain])
    assert tokens == [target, int(logits[1].argmax())]


def test_min_tokens_keeps_eos_out_until_reached() -> None:
    logits = np.zeros((1, 8), dtype=np.float32)
    logits[0, EOS] = 10.0  # the model wants to stop
    chooser = TokenChooser({EOS})
    assert chooser.choose(logits, [_sequence(min_tokens=2)]) != [EOS]
    assert chooser.choose(logits, [_sequence()]) == [EOS]


def test_logprobs_are_kept_only_for_rows_that_ask_and_score_the_raw_logits() -> None:
    logits = _logits(2)
    asking, silent = _sequence(logprobs=0, logit_bias={3: 50.0}), _sequence()
    tokens = TokenChooser({EOS}).choose(logits, [asking, silent])
    assert tokens[0] == 3 and silent.scores == []
    (score,) = asking.scores
    raw = float(logits[0, 3] - np.log(np.exp(logits[0].astype(np.float64)).sum()))
    assert score.logprob is not None and abs(score.logprob - raw) < 1e-5  # before the bias, as vLLM scores


def test_mask_stats_count_nothing_without_a_response_format_and_reset_when_taken() -> None:
    chooser = TokenChooser({EOS})
    chooser.choose(_logits(2), [_sequence(), _sequence()])
    assert chooser.take_mask_stats() == (0.0, 0)
