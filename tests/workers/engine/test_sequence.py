"""workers/engine/sequence.py: a sequence's status says whether it ended, its future is settled
once (the first outcome wins), its result's timings come from its own timestamps, and the text
rules: the earliest stop string wins, and a stream never shows what the result will drop."""

from __future__ import annotations

import concurrent.futures

import pytest

from workers.engine.detokenizer import IncrementalText
from workers.engine.sequence import Sequence, SequenceStatus, find_stop, streamable
from workers.engine.types import ErrorType, GenerationRequest, GenerationResult, RequestError, SamplingParams


def _sequence() -> Sequence:
    future: concurrent.futures.Future[GenerationResult] = concurrent.futures.Future()
    return Sequence(
        request=GenerationRequest("r1", SamplingParams(max_tokens=4), prompt="a b c"),
        future=future, prompt_ids=[0, 1, 2], reservation=7, generator=None, submitted_at=10.0,
        text=IncrementalText(lambda tokens, skip: ""),
    )  # fmt: skip


def test_only_waiting_and_running_are_unfinished() -> None:
    unfinished = {SequenceStatus.WAITING, SequenceStatus.RUNNING}
    for status in SequenceStatus:
        assert status.is_finished == (status not in unfinished)
    assert _sequence().status is SequenceStatus.WAITING


def test_succeed_reports_tokens_and_timings_from_admission() -> None:
    sequence = _sequence()
    sequence.admitted_at, sequence.first_token_at = 10.5, 10.7
    sequence.completion = [0, 1]
    sequence.batch_size = 3
    sequence.succeed("a b", "length", now=11.5)
    result = sequence.future.result(0)
    assert (result.text, result.finish_reason, result.prompt_tokens, result.completion_tokens) == (
        "a b", "length", 3, 2,
    )  # fmt: skip
    assert result.queued_ms == pytest.approx(500)
    assert result.time_to_first_token_ms == pytest.approx(200)
    assert result.inference_ms == pytest.approx(1000)
    assert result.batch_size == 3 and sequence.request_id == "r1"


def test_the_first_outcome_wins() -> None:
    failed = _sequence()
    failed.fail(RequestError(ErrorType.CANCELED, "canceled"))
    failed.succeed("late", "stop", now=11.0)  # a result after a cancel changes nothing
    with pytest.raises(RequestError):
        failed.future.result(0)
    done = _sequence()
    done.succeed("text", "stop", now=11.0)
    done.fail(RequestError(ErrorType.TIMEOUT, "late"))
    assert done.future.result(0).text == "text"


@pytest.mark.parametrize(
    ("text", "stops", "start", "found"),
    [
        ("hello world", ("wor",), 0, 6),
        ("hello world", ("o", "ll"), 0, 2),  # the earliest wins, whatever the list order
        ("hello world", ("xyz",), 0, None),
        ("hello world", ("hello",), 6, None),  # ends before start: searched already
        ("hello world", ("lo w",), 5, 3),  # straddles start: still found
    ],
)
def test_find_stop(text: str, stops: tuple[str, ...], start: int, found: int | None) -> None:
    assert find_stop(text, stops, start) == found


@pytest.mark.parametrize(
    ("text", "stops", "shown"),
    [
        ("hello wo", ("world",), "hello "),  # could still become the stop string
        ("hello wx", ("world",), "hello wx"),
        ("hello ", (), "hello "),
        ("caf\ufffd", (), "caf"),  # half a character
        ("abc", ("cd", "bcd"), "a"),  # the longest partial stop is held
    ],
)
def test_streamable_holds_back_partial_stops_and_characters(
    text: str, stops: tuple[str, ...], shown: str
) -> None:
    assert streamable(text, stops) == shown
