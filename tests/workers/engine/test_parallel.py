"""workers/engine/parallel.py: a request with n or best_of runs as single-sample children (sample i
seeded seed + i, the prompt scored once), and their results gather into one: best_of keeps the n
with the highest cumulative log-probability, usage counts every sample, a failing sample fails the
request and cancels its siblings. (Engine runs: tests/workers/engine/test_samples.py.)"""

from __future__ import annotations

import concurrent.futures
from dataclasses import replace

import pytest

from workers.engine.parallel import SampleGroup, child_requests, combine, ranks, sample_count
from workers.engine.types import (
    ErrorType,
    GenerationRequest,
    GenerationResult,
    OutputUpdate,
    RequestError,
    SamplingParams,
    TokenLogprob,
)


def _request(**params: object) -> GenerationRequest:
    return GenerationRequest("r1", SamplingParams(max_tokens=4, **params), prompt="hi")


def _result(text: str, logprob: float, tokens: int = 2, **timings: float) -> GenerationResult:
    entry = TokenLogprob(0, text, text, logprob)
    values = {"inference_ms": 10.0, "time_to_first_token_ms": 5.0, "queued_ms": 1.0} | timings
    return GenerationResult(text, "length", 3, tokens, batch_size=2, logprobs=(entry,), **values)  # type: ignore[arg-type]


def test_counts_and_ranking() -> None:
    assert sample_count(SamplingParams(max_tokens=1)) == 1
    assert sample_count(SamplingParams(max_tokens=1, n=3)) == 3 and not ranks(
        SamplingParams(max_tokens=1, n=3)
    )
    assert sample_count(SamplingParams(max_tokens=1, n=2, best_of=5)) == 5
    assert ranks(SamplingParams(max_tokens=1, n=2, best_of=5))


def test_children_are_seeded_in_turn_and_the_prompt_is_scored_once() -> None:
    seen: list[OutputUpdate] = []
    request = replace(_request(n=3, seed=10, prompt_logprobs=2, temperature=1.0), on_output=seen.append)
    children = child_requests(request)
    assert [c.request_id for c in children] == ["r1/0", "r1/1", "r1/2"]
    assert [c.params.seed for c in children] == [10, 11, 12]
    assert [c.params.prompt_logprobs for c in children] == [2, None, None]
    assert all(c.params.n == 1 and c.params.best_of is None for c in children)
    # Each streams as its own choice index.
    for child in children:
        assert child.on_output is not None
        child.on_output(OutputUpdate("x", 1))
    assert [u.index for u in seen] == [0, 1, 2]


def test_ranked_children_score_their_tokens_and_do_not_stream() -> None:
    request = replace(_request(n=1, best_of=3, temperature=1.0), on_output=lambda _: None)
    children = child_requests(request)
    assert all(c.params.logprobs == 0 and c.on_output is None and c.params.seed is None for c in children)


def test_best_of_returns_the_most_likely_and_counts_every_sample() -> None:
    params = SamplingParams(max_tokens=4, n=2, best_of=3)
    results = [_result("a", -3.0, inference_ms=30), _result("b", -1.0, queued_ms=0.5), _result("c", -2.0)]
    results[0] = replace(results[0], cached_prompt_tokens=2)  # the first sample found the prompt cached
    combined = combine(results, params)
    assert [c.text for c in combined.choices] == ["b", "c"] and combined.text == "b"
    assert combined.cached_prompt_tokens == 2  # the prompt counts once, as the first sample's
    assert combined.completion_tokens == 6 and combined.inference_ms == 30 and combined.queued_ms == 0.5
    # The client asked for no logprobs: the ranking's own are not returned.
    assert combined.logprobs is None and all(c.logprobs is None for c in combined.choices)


def test_n_keeps_sample_order() -> None:
    combined = combine(
        [_result("a", -3.0), _result("b", -1.0)], SamplingParams(max_tokens=4, n=2, logprobs=0)
    )
    assert [c.text for c in combined.choices] == ["a", "b"] and combined.logprobs is not None


def test_the_group_resolves_once_every_sample_ended() -> None:
    group = SampleGroup(_request(n=2), cancel=lambda _: None)
    futures = [concurrent.futures.Future[GenerationResult]() for _ in group.children]
    for index, future in enumerate(futures):
        group.watch(index, future)
    futures[1].set_result(_result("b", -1.0))
    assert not group.future.done()
    futures[0].set_result(_result("a", -1.0))
    assert [c.text for c in group.future.result(0).choices] == ["a", "b"]


def test_a_failing_sample_fails_the_request_and_cancels_the_rest() -> None:
    cancelled: list[str] = []
    group = SampleGroup(_request(n=3), cancel=cancelled.append)
    futures = [concurrent.futures.Future[GenerationResult]() for _ in group.children]
    for index, future in enumerate(futures):
        group.watch(index, future)
    futures[0].set_result(_result("a", -1.0))
    futures[1].set_exception(RequestError(ErrorType.UNAVAILABLE, "prefill failed"))
    with pytest.raises(RequestError, match="prefill failed"):
        group.future.result(0)
    assert cancelled == ["r1/0", "r1/1", "r1/2"]
    futures[2].set_result(_result("c", -1.0))  # a late sibling changes nothing
    assert group.future.exception(0) is not None
