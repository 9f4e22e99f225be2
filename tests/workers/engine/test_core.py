"""workers/engine/core.py, the engine loop, over the placeholder's EchoExecutor (the engine's test
double: words for tokens, no model). A failing prefill fails its own request only; an error
escaping a step is fatal, on_fatal runs before any future fails, and later submits fail at once; a
request id runs once at a time; a broken on_step hook stops nothing; short jobs join and leave a
running batch without waiting for long ones."""

from __future__ import annotations

import concurrent.futures
import threading
import time
from collections.abc import Iterator
from dataclasses import replace

import pytest

from workers.engine.config import PLACEHOLDER_MODEL, EngineConfig
from workers.engine.core import EngineCore
from workers.engine.detokenizer import IncrementalText
from workers.engine.placeholder.engine import EchoExecutor
from workers.engine.sequence import Sequence
from workers.engine.types import (
    ErrorType,
    FatalEngineError,
    GenerationRequest,
    GenerationResult,
    RequestError,
    SamplingParams,
    StepStats,
)

CONFIG = EngineConfig(model=PLACEHOLDER_MODEL, placeholder_step_s=0.002, output_interval_s=0)
Future = concurrent.futures.Future[GenerationResult]


class RefusingExecutor(EchoExecutor):
    """The echo, except that a prompt starting with "refuse" fails its prefill, and a decode step
    raises once `broken` is set (a device lost mid-batch)."""

    def __init__(self) -> None:
        super().__init__(CONFIG.placeholder_step_s)
        self.broken = threading.Event()

    def prefill(self, sequence: Sequence) -> int | None:
        if (sequence.request.prompt or "").startswith("refuse"):
            raise RuntimeError("prefill exploded")
        return super().prefill(sequence)

    def decode(self) -> list[tuple[Sequence, list[int]]]:
        if self.broken.is_set():
            raise RuntimeError("device lost")
        return super().decode()


class UnpreparedExecutor(EchoExecutor):
    def prepare(self) -> None:
        raise OSError("weights not found")


@pytest.fixture
def cores() -> Iterator[list[EngineCore]]:
    started: list[EngineCore] = []
    yield started
    for core in started:
        core.shutdown(timeout=5)


def _core(cores: list[EngineCore], executor: EchoExecutor | None = None, **overrides: object) -> EngineCore:
    core = EngineCore(replace(CONFIG, **overrides), executor or EchoExecutor(CONFIG.placeholder_step_s))  # type: ignore[arg-type]
    core.start()
    cores.append(core)
    return core


def _submit(core: EngineCore, request_id: str, prompt: str = "one two three", max_tokens: int = 3) -> Future:
    words = prompt.split()
    future: Future = concurrent.futures.Future()
    request = GenerationRequest(request_id, SamplingParams(max_tokens=max_tokens), prompt=prompt)
    text = IncrementalText(lambda tokens, _: " ".join(words[t] for t in tokens))
    core.submit(Sequence(request=request, future=future, prompt_ids=list(range(len(words))), reservation=0,
                         generator=None, submitted_at=time.monotonic(), text=text))  # fmt: skip
    return future


def _error(future: Future) -> BaseException:
    error = future.exception(10)
    assert error is not None
    return error


def test_a_failing_prefill_fails_its_own_request_only(cores: list[EngineCore]) -> None:
    core = _core(cores, RefusingExecutor())
    bad, good = _submit(core, "bad", "refuse this"), _submit(core, "good")
    error = _error(bad)
    assert isinstance(error, RequestError) and error.type is ErrorType.UNAVAILABLE
    assert "prefill failed" in error.message
    assert good.result(10).text == "one two three"
    assert core.fatal_error is None
    assert core.stats().requests_failed == 1 and core.stats().requests_finished >= 1


def test_an_error_in_a_step_is_fatal_and_on_fatal_runs_before_futures_fail(cores: list[EngineCore]) -> None:
    executor = RefusingExecutor()
    order: list[str] = []
    running: Future | None = None

    def on_fatal(error: FatalEngineError) -> None:
        assert running is not None and not running.done()  # the worker hands its jobs back here
        order.append("on_fatal")

    core = _core(cores, executor, on_fatal=on_fatal)
    running = _submit(core, "long", max_tokens=10_000)
    time.sleep(0.05)
    executor.broken.set()
    error = _error(running)
    assert isinstance(error, FatalEngineError) and "device lost" in str(error)
    assert order == ["on_fatal"] and core.fatal_error is error
    with pytest.raises(FatalEngineError):  # later submits fail at once, with the same error
        _submit(core, "later")
    with pytest.raises(FatalEngineError):
        core.check_running()


def test_start_raises_when_the_executor_cannot_prepare(cores: list[EngineCore]) -> None:
    core = EngineCore(CONFIG, UnpreparedExecutor(CONFIG.placeholder_step_s))
    cores.append(core)
    with pytest.raises(FatalEngineError, match="weights not found"):
        core.start()
    with pytest.raises(FatalEngineError):
        _submit(core, "r1")


def test_a_request_id_runs_once_at_a_time(cores: list[EngineCore]) -> None:
    core = _core(cores)
    first = _submit(core, "same", max_tokens=50)
    with pytest.raises(RequestError) as caught:
        _submit(core, "same")
    assert caught.value.type is ErrorType.INVALID_REQUEST and "already running" in caught.value.message
    first.result(10)
    deadline = time.monotonic() + 5
    while True:  # the id is free once its sequence is forgotten, right after its result
        try:
            assert _submit(core, "same").result(10).finish_reason == "length"
            break
        except RequestError:
            assert time.monotonic() < deadline
            time.sleep(0.01)


def test_a_broken_on_step_hook_stops_nothing(
    cores: list[EngineCore], caplog: pytest.LogCaptureFixture
) -> None:
    def broken(_: StepStats) -> None:
        raise ValueError("metrics backend down")

    core = _core(cores, on_step=broken)
    assert _submit(core, "r1").result(10).text == "one two three"
    assert "on_step_failed" in [r.getMessage() for r in caplog.records]


def test_on_step_and_stats_count_the_work(cores: list[EngineCore]) -> None:
    steps: list[StepStats] = []
    core = _core(cores, on_step=steps.append)
    results = [f.result(10) for f in [_submit(core, "a", max_tokens=4), _submit(core, "b", max_tokens=4)]]
    stats = core.stats()
    assert stats.tokens_generated == sum(r.completion_tokens for r in results) == 8
    assert stats.prompt_tokens == 6 and stats.requests_finished == 2 and stats.running == stats.waiting == 0
    assert stats.steps == len(steps) and sum(s.tokens for s in steps) == 8
    assert sum(s.prefill_tokens for s in steps) == 6 and max(s.batch_size for s in steps) == 2


def test_a_short_job_joins_a_running_batch_and_leaves_first(cores: list[EngineCore]) -> None:
    core = _core(cores)
    long = _submit(core, "long", max_tokens=400)
    time.sleep(0.05)
    short = _submit(core, "short", max_tokens=3)
    assert short.result(10).batch_size == 2
    assert not long.done()
    core.shutdown(timeout=5)
    error = _error(long)  # shut down: what was held fails as unavailable
    assert isinstance(error, RequestError) and error.type is ErrorType.UNAVAILABLE
