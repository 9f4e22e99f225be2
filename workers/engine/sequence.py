"""One request's state inside the engine, and the text rules applied to it (stops, streaming)."""

from __future__ import annotations

import concurrent.futures
import enum
import math
from dataclasses import dataclass, field
from typing import Any

from workers.engine.detokenizer import IncrementalText
from workers.engine.sampling.logprobs import RawLogprob
from workers.engine.sampling.sampler import Generator
from workers.engine.types import (
    FatalEngineError,
    FinishReason,
    GenerationRequest,
    GenerationResult,
    RequestError,
    TokenLogprob,
)


class SequenceStatus(enum.Enum):
    """Where a sequence is in its life: the scheduler and the executor act on this, not on which
    container holds it."""

    #: Submitted, not admitted yet (the scheduler's queue).
    WAITING = "waiting"
    #: Admitted: prefilled (or being prefilled) and decoded every step, holding a row of the executor.
    RUNNING = "running"
    #: Ended by the end-of-sequence token, a stop string or a complete response format.
    FINISHED_STOPPED = "finished_stopped"
    #: Ended by max_tokens or the model's context.
    FINISHED_LENGTH = "finished_length"
    #: Canceled (by the client or its caller) or past its deadline.
    FINISHED_ABORTED = "finished_aborted"
    #: Failed: its prefill, a grammar refusal, or the engine itself.
    FINISHED_FAILED = "finished_failed"

    @property
    def is_finished(self) -> bool:
        return self not in (SequenceStatus.WAITING, SequenceStatus.RUNNING)


@dataclass(eq=False)
class Sequence:
    """A request from submit() to its result. Only the engine thread mutates it (cancel sets a flag)."""

    request: GenerationRequest
    future: concurrent.futures.Future[GenerationResult]
    prompt_ids: list[int]
    #: Tokens this sequence may hold at most (prompt + max_tokens, capped by the context): its share
    #: of EngineConfig.max_batch_tokens while it runs.
    reservation: int
    generator: Generator | None
    submitted_at: float
    #: The completion's text, decoded a few tokens at a time (for stop strings and streaming).
    text: IncrementalText
    status: SequenceStatus = SequenceStatus.WAITING
    completion: list[int] = field(default_factory=list)
    admitted_at: float = 0.0
    first_token_at: float | None = None
    batch_size: int = 1
    last_output_at: float = -math.inf
    #: The end of the text already searched for stop strings (as long as the longest stop, less one).
    stop_tail: str = ""
    #: Set by cancel() from a caller thread; a plain bool store is atomic, and the engine reads it each step.
    cancel_requested: bool = False
    #: The llguidance matcher of the request's response format (SamplingParams.json_schema).
    matcher: Any = None
    #: Log-probabilities of the completion's tokens so far (when SamplingParams.logprobs is set).
    scores: list[RawLogprob] = field(default_factory=list)
    #: Log-probabilities of the prompt's tokens (when SamplingParams.prompt_logprobs is set).
    prompt_scores: list[RawLogprob] | None = None
    #: The completion's log-probability entries streamed so far (logprobs.describe_streamed).
    streamed: list[TokenLogprob] = field(default_factory=list)
    #: Prompt tokens whose KV cells its prefill found in the prefix cache (not computed).
    cached_tokens: int = 0

    @property
    def request_id(self) -> str:
        return self.request.request_id

    def fail(self, error: RequestError | FatalEngineError) -> None:
        if not self.future.done():
            self.future.set_exception(error)

    def succeed(
        self,
        text: str,
        reason: FinishReason,
        now: float,
        logprobs: tuple[TokenLogprob, ...] | None = None,
        prompt_logprobs: tuple[TokenLogprob, ...] | None = None,
    ) -> None:
        first = self.first_token_at if self.first_token_at is not None else now
        result = GenerationResult(
            text=text,
            finish_reason=reason,
            prompt_tokens=len(self.prompt_ids),
            cached_prompt_tokens=self.cached_tokens,
            completion_tokens=len(self.completion),
            inference_ms=(now - self.admitted_at) * 1000,
            batch_size=self.batch_size,
            time_to_first_token_ms=(first - self.admitted_at) * 1000,
            queued_ms=(self.admitted_at - self.submitted_at) * 1000,
            logprobs=logprobs,
            prompt_logprobs=prompt_logprobs,
        )
        if not self.future.done():
            self.future.set_result(result)


def find_stop(text: str, stops: tuple[str, ...], start: int) -> int | None:
    """Index of the earliest stop string in text that ends at or after `start` (None if none)."""
    found: int | None = None
    for stop in stops:
        index = text.find(stop, max(0, start - len(stop) + 1))
        if index >= 0 and (found is None or index < found):
            found = index
    return found


def streamable(text: str, stops: tuple[str, ...]) -> str:
    """Text safe to publish mid-generation: without a trailing partial stop string or partial character.

    A stream must never show what the final result will drop: a suffix that could still grow into a
    stop string is held back, and so is a trailing U+FFFD (half of a multi-byte character).
    """
    text = text.rstrip("\ufffd")
    held = 0
    for stop in stops:
        for size in range(min(len(stop) - 1, len(text)), held, -1):
            if text.endswith(stop[:size]):
                held = size
                break
    return text[: len(text) - held] if held else text
