"""The OutputProcessor on the real tokenizer: tokens applied one at a time, as the engine loop does
for a model's steps, and as runs of several (a zero-cost echo's steps) that must end where one at a
time would.

The completions are tokenized texts, so a stop string can be made to straddle tokens on purpose.
"""

from __future__ import annotations

import concurrent.futures
import math
import random
import time
from collections.abc import Iterator

import pytest

from workers.engine.detokenizer import IncrementalText
from workers.engine.output import OutputProcessor, OutputRules
from workers.engine.sequence import Sequence, SequenceStatus
from workers.engine.torch.loading import LoadedModel
from workers.engine.types import GenerationRequest, GenerationResult, OutputUpdate, SamplingParams

TEXT = "The answer to the question is forty-two, said the computer. Everyone stared at it."


class Tokenizer:
    """The session model's tokenizer, with a record of how many tokens each decode() was given."""

    def __init__(self, loaded: LoadedModel) -> None:
        self.tokenizer = loaded.tokenizer
        self.eos = loaded.eos_token_ids
        self.decoded: list[int] = []

    def encode(self, text: str) -> list[int]:
        return [int(token) for token in self.tokenizer(text).input_ids]

    def decode(self, tokens: list[int], skip_special_tokens: bool) -> str:
        self.decoded.append(len(tokens))
        return str(self.tokenizer.decode(tokens, skip_special_tokens=skip_special_tokens))


@pytest.fixture
def tokenizer(random_model: LoadedModel) -> Tokenizer:
    return Tokenizer(random_model)


def _sequence(tokenizer: Tokenizer, max_tokens: int = 200, **params: object) -> Sequence:
    on_output = params.pop("on_output", None)
    request = GenerationRequest(
        "r",
        SamplingParams(max_tokens=max_tokens, **params),
        prompt="x",
        on_output=on_output,  # type: ignore[arg-type]
    )
    future: concurrent.futures.Future[GenerationResult] = concurrent.futures.Future()
    return Sequence(
        request=request,
        future=future,
        prompt_ids=[1, 2, 3],
        reservation=0,
        generator=None,
        submitted_at=time.monotonic(),
        text=IncrementalText(tokenizer.decode),
        status=SequenceStatus.RUNNING,
    )


def _processor(tokenizer: Tokenizer, interval: float = math.inf) -> tuple[OutputProcessor, list[Sequence]]:
    ended: list[Sequence] = []
    return OutputProcessor(OutputRules(tokenizer.eos, 2048, interval), ended.append), ended


def _feed(processor: OutputProcessor, sequence: Sequence, tokens: list[int]) -> int:
    """Apply tokens until the sequence ends; how many were applied."""
    for count, token in enumerate(tokens, start=1):
        if processor.apply(sequence, token):
            return count
    return len(tokens)


def _split_token(tokenizer: Tokenizer, tokens: list[int], stop: str) -> None:
    """Fail unless `stop` straddles two tokens of the text (what the test is about)."""
    pieces = [tokenizer.tokenizer.decode([token]) for token in tokens]
    assert not any(stop in piece for piece in pieces)


def test_a_stop_string_split_across_tokens_cuts_the_text(tokenizer: Tokenizer) -> None:
    tokens = tokenizer.encode(TEXT)
    _split_token(tokenizer, tokens, "forty-two")
    processor, ended = _processor(tokenizer)
    sequence = _sequence(tokenizer, stop=("nothing", "forty-two"))
    applied = _feed(processor, sequence, tokens)
    result = sequence.future.result(0)
    assert (result.text, result.finish_reason) == ("The answer to the question is ", "stop")
    assert tokenizer.decode(tokens[:applied], True).endswith("two")  # ended by the token completing it
    assert result.completion_tokens == applied < len(tokens)
    assert ended == [sequence] and sequence.status is SequenceStatus.FINISHED_STOPPED


def test_the_earliest_stop_string_wins(tokenizer: Tokenizer) -> None:
    processor, _ = _processor(tokenizer)
    sequence = _sequence(tokenizer, stop=("computer", "question is"))
    _feed(processor, sequence, tokenizer.encode(TEXT))
    assert sequence.future.result(0).text == "The answer to the "


def test_a_stop_string_before_min_tokens_is_no_stop_nor_later(tokenizer: Tokenizer) -> None:
    tokens = tokenizer.encode(TEXT)
    processor, _ = _processor(tokenizer)
    sequence = _sequence(tokenizer, max_tokens=len(tokens), min_tokens=len(tokens) - 2, stop=("answer",))
    _feed(processor, sequence, tokens)
    result = sequence.future.result(0)
    assert (result.text, result.finish_reason) == (tokenizer.tokenizer.decode(tokens), "length")


def test_stop_matching_decodes_a_bounded_window_per_token(tokenizer: Tokenizer) -> None:
    """The cost of a step does not grow with the completion: no decode sees more than a few tokens
    until the result's own decode at the end."""
    tokens = tokenizer.encode(TEXT * 20)
    processor, _ = _processor(tokenizer)
    sequence = _sequence(tokenizer, max_tokens=len(tokens), stop=("never in the text",))
    _feed(processor, sequence, tokens)
    assert sequence.future.result(0).finish_reason == "length"
    assert len(tokens) > 300 and max(tokenizer.decoded[:-1]) <= 8
    assert tokenizer.decoded[-1] == len(tokens)


def test_eos_ends_with_stop_and_is_counted_but_not_shown(tokenizer: Tokenizer) -> None:
    eos = min(tokenizer.eos)
    tokens = tokenizer.encode("Short answer.")
    processor, _ = _processor(tokenizer)
    sequence = _sequence(tokenizer)
    _feed(processor, sequence, [*tokens, eos, *tokens])
    result = sequence.future.result(0)
    assert (result.text, result.finish_reason) == ("Short answer.", "stop")
    assert result.completion_tokens == len(tokens) + 1
    ignoring = _sequence(tokenizer, ignore_eos=True, max_tokens=len(tokens) + 2)
    _feed(processor, ignoring, [*tokens, eos, *tokens])
    assert ignoring.future.result(0).finish_reason == "length"


def test_max_tokens_ends_with_length_and_the_full_text(tokenizer: Tokenizer) -> None:
    tokens = tokenizer.encode(TEXT)
    processor, _ = _processor(tokenizer)
    sequence = _sequence(tokenizer, max_tokens=7, stop=("zebra",))
    assert _feed(processor, sequence, tokens) == 7
    result = sequence.future.result(0)
    assert (result.text, result.finish_reason) == (tokenizer.tokenizer.decode(tokens[:7]), "length")
    assert sequence.status is SequenceStatus.FINISHED_LENGTH


def test_streaming_holds_back_a_partial_stop_string(tokenizer: Tokenizer) -> None:
    updates: list[OutputUpdate] = []
    tokens = tokenizer.encode(TEXT)
    processor, _ = _processor(tokenizer, interval=0.0)
    sequence = _sequence(
        tokenizer, max_tokens=len(tokens), stop=("forty-two, said the robot",), on_output=updates.append
    )
    _feed(processor, sequence, tokens)
    final = sequence.future.result(0).text
    assert final == TEXT and updates
    for update in updates:
        assert final.startswith(update.text)
        assert not update.text.endswith("forty")  # could still become the stop string: held back
    assert [update.tokens for update in updates] == list(range(1, len(updates) + 1))


RUNS = {
    "max_tokens within a run": ({"max_tokens": 10}, 4, 2048, False),
    "the context within a run": ({}, 4, 12, False),
    "end-of-sequence within a run": ({}, 4, 2048, True),
    "end-of-sequence ignored": ({"ignore_eos": True, "max_tokens": 9}, 4, 2048, True),
    "a stop string within a run": ({"stop": ("forty-two",)}, 5, 2048, False),
}


@pytest.mark.parametrize("case", RUNS.values(), ids=list(RUNS))
def test_a_run_of_tokens_ends_where_applying_them_one_at_a_time_would(
    tokenizer: Tokenizer, case: tuple[dict[str, object], int, int, bool]
) -> None:
    params, run, context, with_eos = case
    tokens = tokenizer.encode(TEXT)
    if with_eos:
        tokens[6:6] = [min(tokenizer.eos)]
    rules = OutputRules(tokenizer.eos, context, math.inf)
    one_by_one, in_runs = _sequence(tokenizer, **params), _sequence(tokenizer, **params)  # type: ignore[arg-type]
    _feed(OutputProcessor(rules, lambda _: None), one_by_one, tokens)
    processor = OutputProcessor(rules, lambda _: None)
    runs = [tokens[start : start + run] for start in range(0, len(tokens), run)]
    applied = 0  # runs, up to the one that ended the sequence (the engine then releases its row)
    while not processor.apply_run(in_runs, runs[applied]):
        applied += 1
    expected, got = one_by_one.future.result(0), in_runs.future.result(0)
    assert (got.text, got.finish_reason, got.completion_tokens) == (
        expected.text, expected.finish_reason, expected.completion_tokens
    )  # fmt: skip
    assert in_runs.completion == one_by_one.completion and in_runs.status is one_by_one.status
    assert applied == (expected.completion_tokens - 1) // run  # the run that ended it
    assert processor.counters.tokens_generated == expected.completion_tokens


def test_a_run_is_streamed_once_with_all_its_tokens(tokenizer: Tokenizer) -> None:
    updates: list[OutputUpdate] = []
    tokens = tokenizer.encode(TEXT)
    processor, _ = _processor(tokenizer, interval=0.0)
    sequence = _sequence(tokenizer, max_tokens=len(tokens) + 1, on_output=updates.append)
    assert not processor.apply_run(sequence, tokens[:5]) and not processor.apply_run(sequence, tokens[5:])
    assert [update.tokens for update in updates] == [5, len(tokens)]
    assert updates[-1].text == TEXT


def _random_ids(vocab: int) -> Iterator[list[int]]:
    rng = random.Random(0)
    for trial in range(60):
        high = vocab if trial % 2 else 300  # byte tokens: characters split over tokens
        yield [rng.randrange(high) for _ in range(rng.randint(1, 60))]


def test_incremental_text_is_the_full_decode(tokenizer: Tokenizer) -> None:
    """Emitted text is the tokenizer's decode of the tokens so far, minus a trailing half character."""
    for tokens in _random_ids(len(tokenizer.tokenizer)):
        text = IncrementalText(tokenizer.decode)
        for end in range(1, len(tokens) + 1):
            text.update(tokens[:end])
            full = tokenizer.decode(tokens[:end], True)
            assert full.startswith(text.text)
            assert "\ufffd" in full[len(text.text) :] or full == text.text
