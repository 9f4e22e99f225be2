"""The placeholder engine runs the real engine loop (scheduler, output processor) over its echo:
stop strings, cancel, deadlines, batch bounds and death behave as on a model."""

from __future__ import annotations

import concurrent.futures
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from workers.engine.config import PLACEHOLDER_MODEL, EngineConfig
from workers.engine.placeholder.engine import PlaceholderEngine
from workers.engine.types import (
    ErrorType,
    FatalEngineError,
    GenerationRequest,
    GenerationResult,
    RequestError,
    SamplingParams,
)

CONFIG = EngineConfig(model=PLACEHOLDER_MODEL, placeholder_step_s=0.002, max_batch_size=2)


@pytest.fixture
def engines() -> Iterator[list[PlaceholderEngine]]:
    started: list[PlaceholderEngine] = []
    yield started
    for engine in started:
        engine.shutdown(timeout=5)


def _engine(engines: list[PlaceholderEngine], **overrides: object) -> PlaceholderEngine:
    engine = PlaceholderEngine(replace(CONFIG, **overrides))  # type: ignore[arg-type]
    engine.start()
    engines.append(engine)
    return engine


def _request(request_id: str, max_tokens: int = 5, **params: object) -> GenerationRequest:
    deadline = params.pop("deadline", None)
    sampling = SamplingParams(max_tokens=max_tokens, **params)
    return GenerationRequest(request_id, sampling, prompt="hello big world", deadline=deadline)  # type: ignore[arg-type]


def _error(future: concurrent.futures.Future[GenerationResult]) -> RequestError:
    with pytest.raises(RequestError) as caught:
        future.result(10)
    return caught.value


def test_echoes_words_until_max_tokens(engines: list[PlaceholderEngine]) -> None:
    result = _engine(engines).submit(_request("a")).result(10)
    assert (result.text, result.finish_reason) == ("hello big world hello big", "length")
    assert (result.prompt_tokens, result.completion_tokens) == (3, 5)


def test_a_stop_string_across_words_cuts_the_text(engines: list[PlaceholderEngine]) -> None:
    result = _engine(engines).submit(_request("a", max_tokens=50, stop=("world hello",))).result(10)
    assert (result.text, result.finish_reason, result.completion_tokens) == ("hello big ", "stop", 4)


def test_at_zero_cost_many_words_a_step_cut_as_one_a_step(engines: list[PlaceholderEngine]) -> None:
    """At placeholder_step_s 0 a decode step gives each row 16 words: max_tokens, stop strings and
    the token counts still cut where one word a step would, and each word counts once."""
    counted: list[int] = []
    engine = _engine(engines, placeholder_step_s=0.0, on_step=lambda step: counted.append(step.tokens))
    futures = [engine.submit(_request("a", max_tokens=21)),
               engine.submit(_request("b", max_tokens=50, stop=("world hello",)))]  # fmt: skip
    long, stopped = (future.result(10) for future in futures)
    assert (long.text, long.finish_reason, long.completion_tokens) == (
        " ".join(["hello big world"] * 7), "length", 21)  # fmt: skip
    assert (stopped.text, stopped.finish_reason, stopped.completion_tokens) == ("hello big ", "stop", 4)
    assert sum(counted) == 21 + 4 and len(counted) < 21


def test_cancel_and_deadline_stop_running_and_waiting_jobs(engines: list[PlaceholderEngine]) -> None:
    engine = _engine(engines, max_batch_size=1)
    running = engine.submit(_request("running", max_tokens=100_000))
    waiting = engine.submit(_request("waiting"))
    late = engine.submit(_request("late", deadline=time.monotonic() + 0.05))
    time.sleep(0.1)
    engine.cancel("waiting")
    assert _error(waiting).type is ErrorType.CANCELED
    assert _error(late).message == "job deadline passed before it started"
    engine.cancel("running")
    assert _error(running).type is ErrorType.CANCELED
    assert engine.submit(_request("after")).result(10).finish_reason == "length"  # its row was freed


def test_the_batch_is_bounded_by_max_batch_size(engines: list[PlaceholderEngine]) -> None:
    engine = _engine(engines, max_batch_size=2)
    futures = [engine.submit(_request(f"j{i}", max_tokens=20)) for i in range(5)]
    assert max(future.result(10).batch_size for future in futures) == 2


def test_model_features_are_refused(engines: list[PlaceholderEngine]) -> None:
    assert _error(_engine(engines).submit(_request("a", logprobs=1))).type is ErrorType.INVALID_REQUEST


def test_shutdown_fails_held_jobs_and_later_submits(engines: list[PlaceholderEngine]) -> None:
    engine = _engine(engines)
    held = engine.submit(_request("held", max_tokens=100_000))
    engine.shutdown(timeout=5)
    assert _error(held).type is ErrorType.UNAVAILABLE
    assert _error(engine.submit(_request("late"))).type is ErrorType.UNAVAILABLE


def test_an_injected_fault_is_fatal_to_everything_held(
    engines: list[PlaceholderEngine], tmp_path: Path
) -> None:
    seen: list[bool] = []
    fault = tmp_path / "fault"
    held: concurrent.futures.Future[GenerationResult] = concurrent.futures.Future()
    engine = _engine(engines, fault_file=fault, on_fatal=lambda _: seen.append(held.done()))
    held = engine.submit(_request("held", max_tokens=100_000))
    time.sleep(0.05)
    fault.touch()
    with pytest.raises(FatalEngineError):
        held.result(10)
    assert seen == [False]  # on_fatal ran before the held job failed
    with pytest.raises(FatalEngineError):
        engine.submit(_request("after")).result(10)
