"""n and best_of: several samples per request, each its own sequence in the batch (random-tiny)."""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any

import pydantic
import pytest

from tests.workers.engine.conftest import EngineFactory
from workers.engine import GenerationRequest, RequestError, SamplingParams
from workers.engine.types import GenerationResult, OutputUpdate


def _request(request_id: str, **params: Any) -> GenerationRequest:
    sampling = SamplingParams(**{"max_tokens": 10, "temperature": 1.0, "seed": 40, **params})
    return GenerationRequest(request_id, sampling, prompt="tell me something")


def _cumulative(result: GenerationResult) -> float:
    return sum(entry.logprob or 0.0 for entry in result.logprobs or ())


def test_n_samples_are_the_seeded_solo_samples(random_engine: EngineFactory) -> None:
    engine = random_engine(max_batch_size=8)
    result = engine.submit(_request("three", n=3)).result(30)
    solo = [engine.submit(_request(f"solo{i}", seed=40 + i)).result(30) for i in range(3)]
    assert [choice.text for choice in result.choices] == [r.text for r in solo]  # sample i: seed + i
    assert len({choice.text for choice in result.choices}) == 3
    assert result.text == result.choices[0].text
    assert result.completion_tokens == sum(choice.completion_tokens for choice in result.choices) == 30
    assert result.batch_size >= 3  # the samples ran together


def test_best_of_returns_the_most_likely_samples(random_engine: EngineFactory) -> None:
    engine = random_engine(max_batch_size=8)
    result = engine.submit(_request("best", n=2, best_of=4)).result(30)
    solo = [engine.submit(_request(f"s{i}", seed=40 + i, logprobs=0)).result(30) for i in range(4)]
    ranked = sorted(solo, key=_cumulative, reverse=True)
    assert [choice.text for choice in result.choices] == [r.text for r in ranked[:2]]
    assert all(choice.logprobs is None for choice in result.choices)  # ranked on them, not asked for
    assert result.completion_tokens == 40  # all four generated count


def test_cancel_stops_every_sample(random_engine: EngineFactory) -> None:
    engine = random_engine(max_batch_size=8)
    future = engine.submit(_request("many", n=4, max_tokens=100_000 - 1, ignore_eos=True))
    time.sleep(0.2)
    engine.cancel("many")
    with pytest.raises(RequestError) as caught:
        future.result(30)
    assert caught.value.type == "canceled"
    deadline = time.monotonic() + 5
    while engine.stats().running and time.monotonic() < deadline:
        time.sleep(0.01)
    assert engine.stats().running == 0


def test_n_above_best_of_is_refused() -> None:
    with pytest.raises(pydantic.ValidationError, match=r"best_of \(2\) must be at least n \(3\)"):
        _request("bad", n=3, best_of=2)


def test_each_sample_streams_as_its_own_completion(random_engine: EngineFactory) -> None:
    """on_output carries the sample's index (OpenAI's choice index); ranked samples do not stream."""
    engine = random_engine(max_batch_size=8, output_interval_s=0.0)
    updates: list[OutputUpdate] = []
    request = _request("streamed", n=3, max_tokens=12, ignore_eos=True)
    result = engine.submit(replace(request, on_output=updates.append)).result(30)
    for index, choice in enumerate(result.choices):
        texts = [update.text for update in updates if update.index == index]
        assert texts and all(choice.text.startswith(text) for text in texts), index
    ranked: list[OutputUpdate] = []
    best = _request("ranked", n=1, best_of=2, max_tokens=12, ignore_eos=True)
    engine.submit(replace(best, on_output=ranked.append)).result(30)
    assert ranked == []
