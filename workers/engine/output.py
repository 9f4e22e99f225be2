"""What a sampled token does to its request: the only place a sequence ends, well or not.

apply() appends the token and then, in this order: advances the response format's grammar (a
refused token fails the request, `unavailable`); the end-of-sequence token ends it with "stop"
(counted in completion_tokens, not shown in text; ignored with ignore_eos); a complete grammar ends
it with "stop"; a stop string ends it with "stop", cut from the text with everything after it (one
completed before min_tokens is not a stop, nor later); max_tokens, or the context filling up, ends it
with "length". Otherwise its on_output callback may be called. apply_run() applies the tokens one
step gave a sequence as apply() would one by one (a run of several, from the zero-cost echo, that
only length can end is appended at once).

Stop strings are matched incrementally: each step decodes only the newest tokens (detokenizer.py)
and searches them together with the end of the text already searched (as long as the longest stop
string, less one), so a step's cost does not grow with the completion. A result's text is the
tokenizer's decode of the completion (once, at the end), or for a stop string the incremental text
up to it.

Streaming: on_output(OutputUpdate: text so far, completion tokens so far, and with logprobs the
entries of the tokens streamed so far) at most once per output_interval_s per request, never after
the result, with any trailing partial stop string held back. It runs inline on the engine thread,
so it must be cheap; it may raise without harming the engine.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass

from shared.logging import fields
from workers.engine.sampling.logprobs import describe, describe_streamed
from workers.engine.sequence import Sequence, SequenceStatus, find_stop, streamable
from workers.engine.types import (
    ErrorType,
    FatalEngineError,
    FinishReason,
    OutputUpdate,
    RequestError,
    TokenLogprob,
)

logger = logging.getLogger(__name__)

_ABORTS = (ErrorType.CANCELED, ErrorType.TIMEOUT)


@dataclass(frozen=True, slots=True)
class OutputRules:
    """What the processor needs to know of the model and the engine's settings."""

    #: Token ids that end a sequence (unless SamplingParams.ignore_eos).
    eos_token_ids: frozenset[int]
    #: The model's context in tokens (prompt + completion); math.inf for no limit.
    context_tokens: float
    #: Least seconds between two on_output calls for one request.
    output_interval_s: float


@dataclass
class OutputCounters:
    tokens_generated: int = 0
    requests_finished: int = 0
    requests_failed: int = 0


class OutputProcessor:
    """Applies tokens to sequences and resolves their futures (see the module docstring)."""

    def __init__(self, rules: OutputRules, on_end: Callable[[Sequence], None]) -> None:
        self.counters = OutputCounters()
        # Read for every token: kept as plain attributes (a zero-cost engine's step is mostly this).
        self._eos = rules.eos_token_ids
        self._context = rules.context_tokens
        self._interval = rules.output_interval_s
        #: Called when a sequence ends, before its future resolves (the engine forgets its id there).
        self._on_end = on_end

    def apply(self, sequence: Sequence, token: int) -> bool:
        """Append a generated token; resolve the sequence when it is done. True when done."""
        sequence.completion.append(token)
        self.counters.tokens_generated += 1
        matcher = sequence.matcher
        if matcher is not None and not matcher.consume_token(token):
            message = f"the response format's grammar refused token {token}: {matcher.get_error()}"
            self.fail(sequence, RequestError(ErrorType.UNAVAILABLE, message))
            return True
        ending = self._ending(sequence, token)
        if ending is not None:
            self.finish(sequence, *ending)
            return True
        if sequence.request.on_output is not None:
            self._maybe_stream(sequence)
        return False

    def apply_run(self, sequence: Sequence, tokens: list[int]) -> bool:
        """Apply a step's tokens for one sequence, in order, as apply() would one at a time: those
        after the token that ends it are dropped. True when it ended. A run that cannot end but by
        length (no grammar, stop strings or end-of-sequence token in play) is appended at once."""
        if len(tokens) > 1 and self._only_length_ends(sequence, tokens):
            return self._extend(sequence, tokens)
        return any(self.apply(sequence, token) for token in tokens)

    def _only_length_ends(self, sequence: Sequence, tokens: list[int]) -> bool:
        params = sequence.request.params
        no_eos = params.ignore_eos or self._eos.isdisjoint(tokens)
        return no_eos and sequence.matcher is None and not params.stop

    def _extend(self, sequence: Sequence, tokens: list[int]) -> bool:
        """apply_run for a run that only max_tokens or the context can end."""
        completion = sequence.completion
        room = min(
            sequence.request.params.max_tokens - len(completion),
            self._context - len(sequence.prompt_ids) - len(completion),
        )  # >= 1: a running sequence has not reached either
        if len(tokens) < room:
            completion.extend(tokens)
            self.counters.tokens_generated += len(tokens)
            if sequence.request.on_output is not None:
                self._maybe_stream(sequence)
            return False
        taken = max(1, int(room))
        completion.extend(tokens[:taken])
        self.counters.tokens_generated += taken
        self.finish(sequence, sequence.text.decode(completion, True), "length")
        return True

    def finish(self, sequence: Sequence, text: str, reason: FinishReason) -> None:
        """Resolve the sequence's future with its result."""
        stopped = reason == "stop"
        self._end(sequence, SequenceStatus.FINISHED_STOPPED if stopped else SequenceStatus.FINISHED_LENGTH)
        self.counters.requests_finished += 1
        logprobs, prompt_scores = _describe_scores(sequence, text)
        sequence.succeed(text, reason, time.monotonic(), logprobs, prompt_scores)

    def fail(self, sequence: Sequence, error: RequestError | FatalEngineError) -> None:
        """Fail the sequence's future with `error` (canceled and timeout are aborts)."""
        aborted = isinstance(error, RequestError) and error.type in _ABORTS
        self._end(sequence, SequenceStatus.FINISHED_ABORTED if aborted else SequenceStatus.FINISHED_FAILED)
        self.counters.requests_failed += 1
        sequence.fail(error)

    def drop(self, sequence: Sequence) -> None:
        """End a sequence whose caller cancelled its future (there is no one to tell)."""
        self._end(sequence, SequenceStatus.FINISHED_ABORTED)

    def _end(self, sequence: Sequence, status: SequenceStatus) -> None:
        sequence.status = status
        self._on_end(sequence)

    def _ending(self, sequence: Sequence, token: int) -> tuple[str, FinishReason] | None:
        """The text and finish reason when `token` ends the sequence, else None."""
        params, completion = sequence.request.params, sequence.completion
        if token in self._eos and not params.ignore_eos:
            return sequence.text.decode(completion[:-1], True), "stop"
        if sequence.matcher is not None and sequence.matcher.is_stopped():  # the JSON is complete
            return sequence.text.decode(completion, True), "stop"
        if params.stop:
            index = _stop_index(sequence, params.stop)
            # Like vLLM, a stop string completed before min_tokens is not a stop (nor later).
            if index is not None and len(completion) >= params.min_tokens:
                return sequence.text.text[:index], "stop"
        generated = len(completion)
        if generated >= params.max_tokens or len(sequence.prompt_ids) + generated >= self._context:
            return sequence.text.decode(completion, True), "length"
        return None

    def _maybe_stream(self, sequence: Sequence) -> None:
        callback = sequence.request.on_output
        now = time.monotonic()
        if callback is None:
            return
        if now - sequence.last_output_at < self._interval:
            return
        sequence.last_output_at = now
        sequence.text.update(sequence.completion)
        params = sequence.request.params
        visible = streamable(sequence.text.text, params.stop)
        logprobs = None
        if params.logprobs is not None:  # describes only the tokens not streamed yet
            scores, decode = sequence.scores, sequence.text.decode
            describe_streamed(decode, sequence.completion, scores, visible, sequence.streamed)
            logprobs = tuple(sequence.streamed)
        try:
            callback(OutputUpdate(visible, len(sequence.completion), logprobs))
        except Exception as exc:  # a broken publisher must not stop generation
            log_failure("on_output_failed", sequence, exc)


def _stop_index(sequence: Sequence, stops: tuple[str, ...]) -> int | None:
    """Where the earliest stop string that ends in the newest text starts (an index into the
    sequence's text), or None. Searches the new text and the tail searched before it only."""
    text = sequence.text
    start = text.length
    added = text.update(sequence.completion)
    if not added:
        return None
    tail = sequence.stop_tail
    window = tail + added
    index = find_stop(window, stops, len(tail))
    keep = max(len(stop) for stop in stops) - 1
    sequence.stop_tail = window[max(0, len(window) - keep) :] if keep else ""
    return None if index is None else start - len(tail) + index


def _describe_scores(
    sequence: Sequence, text: str
) -> tuple[tuple[TokenLogprob, ...] | None, tuple[TokenLogprob, ...] | None]:
    """The sequence's log-probabilities with their token strings (decoded once, at the end)."""
    decode = sequence.text.decode
    logprobs = prompt_scores = None
    if sequence.request.params.logprobs is not None:
        logprobs = describe(decode, sequence.completion, sequence.scores, text, True)
    if sequence.prompt_scores is not None:
        prompt = sequence.prompt_ids
        prompt_scores = describe(decode, prompt, sequence.prompt_scores, decode(prompt, False), False)
    return logprobs, prompt_scores


def log_failure(event: str, sequence: Sequence, exc: Exception) -> None:
    """A request-scoped failure that does not stop the engine, as one log line with the job id."""
    logger.warning(event, extra=fields(job_id=sequence.request_id, error=repr(exc)))


#: OutputRules.context_tokens of an engine without a context limit.
NO_CONTEXT_LIMIT = math.inf
