"""LocalEngine (workers/engine/local.py) over the torch executor on random-tiny: fast, real forward
passes, no trained weights needed."""

from __future__ import annotations

import concurrent.futures
import itertools
import threading
import time
from pathlib import Path
from typing import Any, cast

import pytest
import torch
from transformers import BatchEncoding

from tests.workers.engine.conftest import EngineFactory
from workers.engine import GenerationRequest, RequestError, SamplingParams, StepStats
from workers.engine.config import RANDOM_MODEL, EngineConfig
from workers.engine.torch.loading import LoadedModel, load_model
from workers.engine.types import FatalEngineError, GenerationResult, OutputUpdate


def _request(request_id: str, prompt: str, max_tokens: int = 12, **params: Any) -> GenerationRequest:
    return GenerationRequest(request_id, SamplingParams(max_tokens=max_tokens, **params), prompt=prompt)


def _error(future: concurrent.futures.Future[GenerationResult], timeout: float = 30) -> RequestError:
    with pytest.raises(RequestError) as caught:
        future.result(timeout)
    return caught.value


def test_label_and_fingerprint_say_random_weights(
    random_engine: EngineFactory, random_model: LoadedModel
) -> None:
    engine = random_engine()
    assert "random weights" in engine.label
    assert engine.model_id == RANDOM_MODEL
    reloaded = load_model(EngineConfig(model=RANDOM_MODEL, model_cache=_cache_of(random_engine)))
    assert reloaded.fingerprint == engine.fingerprint  # stable across loads (fixed seed)
    for name, weight in random_model.model.state_dict().items():
        torch.testing.assert_close(reloaded.model.state_dict()[name], weight, rtol=0, atol=0)


def _cache_of(factory: EngineFactory) -> Path:
    from tests.workers.engine.conftest import MODEL_CACHE

    return MODEL_CACHE


def test_batched_greedy_equals_solo(random_engine: EngineFactory) -> None:
    engine = random_engine(max_batch_size=8)
    prompts = [f"prompt {i} " + "word " * (i * 7) for i in range(8)]
    solo = [engine.submit(_request(f"solo-{i}", p)).result(30) for i, p in enumerate(prompts)]
    together = [engine.submit(_request(f"batch-{i}", p)) for i, p in enumerate(prompts)]
    batched = [future.result(30) for future in together]
    assert [r.text for r in batched] == [r.text for r in solo]
    assert max(r.batch_size for r in batched) > 1
    assert all(r.completion_tokens == 12 and r.finish_reason == "length" for r in batched)


def test_usage_counts_chat_template_tokens(random_engine: EngineFactory, random_model: LoadedModel) -> None:
    engine = random_engine()
    result = engine.submit(_request("usage", "hello there", max_tokens=5)).result(30)
    templated = cast(  # a BatchEncoding: return_dict defaults to True
        BatchEncoding,
        random_model.tokenizer.apply_chat_template(
            [{"role": "user", "content": "hello there"}], add_generation_prompt=True, tokenize=True
        ),
    )["input_ids"]
    assert result.prompt_tokens == len(templated)
    assert result.completion_tokens == 5


def test_raw_prompt_without_chat_wrapping(random_engine: EngineFactory, random_model: LoadedModel) -> None:
    engine = random_engine(prompt_as_chat=False)
    result = engine.submit(_request("raw", "hello there", max_tokens=3)).result(30)
    assert result.prompt_tokens == len(random_model.tokenizer("hello there").input_ids)


def test_template_none_continues_the_prompt_verbatim(
    random_engine: EngineFactory, random_model: LoadedModel
) -> None:
    engine = random_engine()  # prompt_as_chat on: the request's choice overrides it either way
    raw = GenerationRequest("raw", SamplingParams(max_tokens=4), prompt="hello there", template="none")
    chat = GenerationRequest("chat", SamplingParams(max_tokens=4), prompt="hello there", template="chat")
    raw_result, chat_result = engine.submit(raw).result(30), engine.submit(chat).result(30)
    assert raw_result.prompt_tokens == len(random_model.tokenizer("hello there").input_ids)
    assert chat_result.prompt_tokens > raw_result.prompt_tokens
    messages = GenerationRequest(
        "m", SamplingParams(max_tokens=1), messages=[{"role": "user", "content": "x"}], template="none"
    )
    error = _error(engine.submit(messages))
    assert error.type == "invalid_request" and "template" in error.message


def test_bad_requests_fail_alone(random_engine: EngineFactory) -> None:
    engine = random_engine()
    both = GenerationRequest(
        "both", SamplingParams(max_tokens=3), prompt="a", messages=[{"role": "user", "content": "b"}]
    )
    assert _error(engine.submit(both)).type == "invalid_request"
    assert _error(engine.submit(_request("zero", "a", max_tokens=0))).type == "invalid_request"
    long_prompt = "hello " * 5000
    error = _error(engine.submit(_request("long", long_prompt)))
    assert error.type == "invalid_request"
    assert "tokens; the model's context is 4096 tokens" in error.message
    assert engine.submit(_request("fine", "still works", max_tokens=2)).result(30).completion_tokens == 2


def test_cancel_waiting_and_running(random_engine: EngineFactory) -> None:
    engine = random_engine(max_batch_size=1)
    running = engine.submit(_request("long", "a", max_tokens=100_000 - 1, ignore_eos=True))
    queued = engine.submit(_request("queued", "b"))
    engine.cancel("queued")
    assert _error(queued).type == "canceled"
    time.sleep(0.2)
    assert not running.done()
    engine.cancel("long")
    assert _error(running).type == "canceled"
    assert engine.submit(_request("after", "c", max_tokens=2)).result(30).completion_tokens == 2
    assert engine.stats().running == 0


def test_deadline_times_out_running_and_waiting(random_engine: EngineFactory) -> None:
    engine = random_engine(max_batch_size=1)
    deadline = time.monotonic() + 0.3
    running = engine.submit(
        GenerationRequest(
            "slow", SamplingParams(max_tokens=100_000, ignore_eos=True), prompt="a", deadline=deadline
        )
    )
    waiting = engine.submit(
        GenerationRequest("late", SamplingParams(max_tokens=5), prompt="b", deadline=deadline)
    )
    assert _error(running).type == "timeout"
    assert _error(waiting).type == "timeout"
    assert time.monotonic() - deadline < 2.0


def test_on_output_is_throttled_and_never_after_the_result(random_engine: EngineFactory) -> None:
    engine = random_engine(output_interval_s=0.05)
    calls: list[tuple[float, str, int]] = []
    request = GenerationRequest(
        "stream",
        SamplingParams(max_tokens=200, ignore_eos=True),
        prompt="stream me",
        on_output=lambda update: calls.append((time.monotonic(), update.text, update.tokens)),
    )
    result = engine.submit(request).result(60)
    count = len(calls)
    time.sleep(0.2)
    assert len(calls) == count  # nothing after the result
    assert count >= 2
    gaps = [later[0] - earlier[0] for earlier, later in itertools.pairwise(calls)]
    assert min(gaps) >= 0.05 - 0.002  # each call stamps its own clock a moment after the engine's check
    assert [c[2] for c in calls] == sorted(c[2] for c in calls)
    assert calls[-1][2] < result.completion_tokens
    assert result.text.startswith(calls[-1][1])


def test_failing_on_output_does_not_stop_generation(random_engine: EngineFactory) -> None:
    engine = random_engine(output_interval_s=0.0)

    def explode(update: OutputUpdate) -> None:
        raise ValueError("publisher is down")

    request = GenerationRequest("boom", SamplingParams(max_tokens=5), prompt="x", on_output=explode)
    assert engine.submit(request).result(30).completion_tokens == 5


def test_stop_string_cuts_text(random_engine: EngineFactory) -> None:
    engine = random_engine()
    full = engine.submit(_request("full", "stop test", max_tokens=30, ignore_eos=True)).result(30)
    stop = full.text[len(full.text) // 2 :][:3]
    assert stop.strip(), f"random text too uniform to pick a stop string: {full.text!r}"
    cut = engine.submit(_request("cut", "stop test", max_tokens=30, ignore_eos=True, stop=(stop,))).result(30)
    assert cut.finish_reason == "stop"
    assert cut.text == full.text[: full.text.index(stop)]
    assert cut.completion_tokens < full.completion_tokens


def test_seeded_sampling_is_reproducible_batched_or_not(random_engine: EngineFactory) -> None:
    engine = random_engine(max_batch_size=4)

    def sampled(request_id: str, seed: int) -> GenerationRequest:
        return _request(request_id, "sample me", max_tokens=20, temperature=1.0, top_p=0.9, seed=seed)

    alone = engine.submit(sampled("a", 7)).result(30).text
    again = engine.submit(sampled("b", 7)).result(30).text
    crowd = [engine.submit(sampled(f"c{i}", i)) for i in range(3)]
    batched = engine.submit(sampled("d", 7))
    assert alone == again == batched.result(30).text
    assert alone != engine.submit(sampled("e", 8)).result(30).text
    for future in crowd:
        future.result(30)


def test_max_batch_tokens_limits_the_running_batch(random_engine: EngineFactory) -> None:
    engine = random_engine(max_batch_size=8, max_batch_tokens=100)
    futures = [engine.submit(_request(f"t{i}", "hi", max_tokens=40, ignore_eos=True)) for i in range(4)]
    results = [future.result(60) for future in futures]  # ~31 prompt + 40 tokens each: one fits at a time
    assert max(r.batch_size for r in results) == 1


def test_on_step_reports_batches(random_engine: EngineFactory) -> None:
    steps: list[StepStats] = []
    engine = random_engine(max_batch_size=4, on_step=steps.append)
    futures = [engine.submit(_request(f"s{i}", "count", max_tokens=6)) for i in range(4)]
    for future in futures:
        future.result(30)
    deadline = time.monotonic() + 5  # a step reports after it resolved its futures
    while sum(step.tokens for step in steps) < 24 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert sum(step.tokens for step in steps) == 24
    assert max(step.batch_size for step in steps) >= 2
    assert len([ms for step in steps for ms in step.first_token_ms]) == 4
    stats = engine.stats()
    assert stats.requests_finished == 4 and stats.tokens_generated >= 24


def test_fatal_forward_error_fails_everything(
    random_engine: EngineFactory, random_model: LoadedModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    """on_fatal runs before anything in flight fails (a worker hands its jobs back there), and
    what was in flight fails with the FatalEngineError, never as a failure of its own."""
    fatal: list[FatalEngineError] = []
    running_done_at_fatal: list[bool] = []

    def on_fatal(error: FatalEngineError) -> None:
        running_done_at_fatal.append(running.done())
        fatal.append(error)

    engine = random_engine(on_fatal=on_fatal)
    running = engine.submit(_request("victim", "a", max_tokens=100_000 - 1, ignore_eos=True))
    time.sleep(0.1)
    broken = threading.Event()

    def broken_device(*args: object, **kwargs: object) -> None:
        broken.set()
        raise RuntimeError("device lost")

    # Fault injection, not a model mock: the real model ran until now and the next step fails.
    monkeypatch.setattr(random_model.model, "forward", broken_device)
    with pytest.raises(FatalEngineError):
        running.result(timeout=30)
    assert broken.is_set()
    assert isinstance(engine.fatal_error, FatalEngineError)
    assert fatal == [engine.fatal_error]
    assert running_done_at_fatal == [False]
    with pytest.raises(FatalEngineError):  # its worker hands such a job back instead of failing it
        engine.submit(_request("after", "b")).result(timeout=30)


def test_submit_after_shutdown_is_unavailable(random_engine: EngineFactory) -> None:
    engine = random_engine()
    engine.shutdown(timeout=10)
    assert _error(engine.submit(_request("late", "x"))).type == "unavailable"
