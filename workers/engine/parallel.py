"""Several samples for one request (OpenAI's n and best_of): each sample is a sequence of its own in
the continuous batch (its own row, generator and reservation; the chat template's shared prefix is
reused by each prefill), and one future gathers them.

Sample i of a seeded request is seeded with seed + i (what vLLM does for n > 1), so the samples
differ and the whole request is still reproducible. best_of generates best_of samples and returns
the n with the highest cumulative log-probability (raw, like every logprob here), best first;
usage counts every sample generated. A failing sample fails the request and cancels its siblings.
Samples stream (on_output) with their index, unless they are ranked.
"""

from __future__ import annotations

import concurrent.futures
import threading
from collections.abc import Callable
from dataclasses import replace

from workers.engine.types import GenerationRequest, GenerationResult, OutputCallback, SamplingParams


def sample_count(params: SamplingParams) -> int:
    """Sequences a request runs."""
    return params.best_of if params.best_of is not None else params.n


def ranks(params: SamplingParams) -> bool:
    """Whether samples are ranked (more generated than returned)."""
    return sample_count(params) > params.n


def child_requests(request: GenerationRequest) -> list[GenerationRequest]:
    """The single-sample requests a multi-sample request runs as."""
    params = request.params
    # Ranking needs each sample's log-probabilities even when the client did not ask for them.
    logprobs = 0 if params.logprobs is None and ranks(params) else params.logprobs
    return [
        replace(
            request,
            request_id=f"{request.request_id}/{index}",
            params=params.model_copy(
                update={
                    "n": 1,
                    "best_of": None,
                    "seed": None if params.seed is None else params.seed + index,
                    "logprobs": logprobs,
                    "prompt_logprobs": params.prompt_logprobs if index == 0 else None,  # scored once
                }
            ),
            # Each sample streams as its own completion (OpenAI's choice index); ranked samples
            # do not: which of them are returned is known only once all have ended.
            on_output=None if ranks(params) else _indexed(request.on_output, index),
        )
        for index in range(sample_count(params))
    ]


def _indexed(callback: OutputCallback | None, index: int) -> OutputCallback | None:
    if callback is None:
        return None
    return lambda update: callback(replace(update, index=index))


class SampleGroup:
    """Gathers the futures of a request's samples into the request's one future."""

    def __init__(self, request: GenerationRequest, cancel: Callable[[str], None]) -> None:
        self.future: concurrent.futures.Future[GenerationResult] = concurrent.futures.Future()
        self._params = request.params
        self._children = child_requests(request)
        self._results: list[GenerationResult | None] = [None] * len(self._children)
        self._cancel = cancel
        self._lock = threading.Lock()

    @property
    def children(self) -> list[GenerationRequest]:
        return list(self._children)

    def watch(self, index: int, future: concurrent.futures.Future[GenerationResult]) -> None:
        future.add_done_callback(lambda done: self._settle(index, done))

    def _settle(self, index: int, done: concurrent.futures.Future[GenerationResult]) -> None:
        error = done.exception()
        with self._lock:
            if self.future.done():
                return
            if error is not None:
                self.future.set_exception(error)
            else:
                self._results[index] = done.result()
                if any(result is None for result in self._results):
                    return
                self.future.set_result(combine([r for r in self._results if r is not None], self._params))
        if error is not None:
            for child in self._children:  # its siblings' work is wasted now
                self._cancel(child.request_id)


def combine(results: list[GenerationResult], params: SamplingParams) -> GenerationResult:
    """The request's result from its samples' (in sample order)."""
    chosen = list(results)
    if ranks(params):
        chosen = sorted(chosen, key=_cumulative_logprob, reverse=True)[: params.n]  # stable: ties by index
    if params.logprobs is None:
        chosen = [replace(result, logprobs=None) for result in chosen]
    first = chosen[0]
    return replace(
        first,
        completion_tokens=sum(result.completion_tokens for result in results),
        inference_ms=max(result.inference_ms for result in results),
        batch_size=max(result.batch_size for result in results),
        time_to_first_token_ms=min(result.time_to_first_token_ms for result in results),
        queued_ms=min(result.queued_ms for result in results),
        prompt_logprobs=results[0].prompt_logprobs,
        cached_prompt_tokens=results[0].cached_prompt_tokens,  # the prompt counts once, as the first's
        choices=tuple(replace(result, prompt_logprobs=None) for result in chosen),
    )


def _cumulative_logprob(result: GenerationResult) -> float:
    return sum(entry.logprob or 0.0 for entry in result.logprobs or ())
