"""PLACEHOLDER engine: a deterministic text generator, not a model.

It exists so the job service's plumbing (queue, store, cancel, deadlines, batching bookkeeping) can
be exercised without loading weights. Every job it serves says "placeholder" in its model label. It
"generates" by echoing the prompt's words back, one word per token, through the same engine loop as
the real engine (workers/engine/core.py: the same Scheduler and OutputProcessor, so cancel, deadlines, stop
strings, max_tokens and streaming behave as they do there); only its executor differs: `EchoExecutor`,
whose every forward pass (each prefill, which gives a job its first token, and each decode step of
the whole batch) takes `placeholder_step_s`. At 0 s a decode step gives each row ZERO_COST_TOKENS
words at once (the engine applies them as one run, so stop strings and max_tokens cut exactly).

Its tokens are word positions: a prompt of N words is N tokens (prompt_tokens), token i of the
completion is word i mod N, and a completion's text is its words joined by single spaces. It has no
end-of-sequence token, no context limit and no KV cache (a request reserves none of max_batch_tokens).
"""

from __future__ import annotations

import concurrent.futures
import hashlib
import time

from workers.engine.config import PLACEHOLDER_MODEL, EngineConfig
from workers.engine.core import EngineCore
from workers.engine.detokenizer import IncrementalText
from workers.engine.output import NO_CONTEXT_LIMIT
from workers.engine.sequence import Sequence
from workers.engine.types import (
    NO_CACHE,
    CacheStats,
    EngineStats,
    ErrorType,
    FatalEngineError,
    GenerationRequest,
    GenerationResult,
    RequestError,
)

#: Words a zero-cost step (placeholder_step_s 0) gives each row.
ZERO_COST_TOKENS = 16


class EchoExecutor:
    """The placeholder's executor: no model, no rows to move; the next word instead of a forward pass."""

    eos_token_ids: frozenset[int] = frozenset()
    context_tokens: float = NO_CONTEXT_LIMIT

    def __init__(self, step_s: float) -> None:
        self._step_s = step_s
        self._members: dict[Sequence, None] = {}  # insertion-ordered: the "rows"

    @property
    def rows(self) -> int:
        return len(self._members)

    def prepare(self) -> None:
        return None

    def prefill(self, sequence: Sequence) -> int | None:
        # A prompt's first token costs a step, as the old echo's first word did: a job of N tokens
        # takes about N steps (tests hold jobs running for a known while through placeholder_step_s).
        self._pace()
        return _next_word(sequence)

    def join(self, sequence: Sequence) -> None:
        self._members[sequence] = None

    def decode(self) -> list[tuple[Sequence, list[int]]]:
        if self._step_s:
            time.sleep(self._step_s)
            return [(sequence, [_next_word(sequence)]) for sequence in self._members]
        # At zero cost a step gives each row a run of ZERO_COST_TOKENS words, which the engine
        # applies as one (OutputProcessor.apply_run): an engine loop turn, or an apply, per word
        # would make the machinery benchmark (bench/machinery.py) measure this echo's bookkeeping,
        # not the machinery. The engine drops a row's words after the one that ended it.
        return [(sequence, _words_after(sequence)) for sequence in self._members]

    def release(self, sequences: list[Sequence]) -> None:
        for sequence in sequences:
            del self._members[sequence]

    def take_mask_stats(self) -> tuple[float, int]:
        return 0.0, 0

    def take_cache_stats(self) -> CacheStats:
        return NO_CACHE  # every prompt is prefilled whole

    def close(self) -> None:
        """Nothing to free outside Python's heap."""

    def _pace(self) -> None:
        if self._step_s:
            time.sleep(self._step_s)  # a model's forward pass takes time; the echo's would take none


def _next_word(sequence: Sequence) -> int:
    return len(sequence.completion) % len(sequence.prompt_ids)


def _words_after(sequence: Sequence) -> list[int]:
    """The ZERO_COST_TOKENS words that follow the sequence's completion."""
    words, start = len(sequence.prompt_ids), len(sequence.completion)
    return [(start + i) % words for i in range(ZERO_COST_TOKENS)]


class _Words:
    """decode() of one request's words: token i is words[i]."""

    def __init__(self, words: list[str]) -> None:
        self._words = words

    def __call__(self, tokens: list[int], skip_special_tokens: bool) -> str:
        return " ".join(self._words[token] for token in tokens)


class PlaceholderEngine:
    """Echo generator over the real engine loop (see the module docstring). Not a language model."""

    label = "placeholder (echoes the prompt; not a model)"

    def __init__(self, config: EngineConfig) -> None:
        self.model_id = PLACEHOLDER_MODEL
        self.fingerprint = hashlib.sha256(b"placeholder-echo/v1").hexdigest()[:16]
        self._core = EngineCore(config, EchoExecutor(config.placeholder_step_s))

    @property
    def fatal_error(self) -> FatalEngineError | None:
        return self._core.fatal_error

    def start(self) -> None:
        self._core.start()

    def submit(self, request: GenerationRequest) -> concurrent.futures.Future[GenerationResult]:
        future: concurrent.futures.Future[GenerationResult] = concurrent.futures.Future()
        try:
            self._core.check_running()  # as the real engine: a dead one's worker hands the job back
            self._core.submit(_sequence(request, future))
        except (RequestError, FatalEngineError) as error:
            future.set_exception(error)
        return future

    def cancel(self, request_id: str) -> None:
        self._core.cancel([request_id])

    def shutdown(self, timeout: float | None = None) -> None:
        self._core.shutdown(timeout)

    def stats(self) -> EngineStats:
        return self._core.stats()


def _sequence(request: GenerationRequest, future: concurrent.futures.Future[GenerationResult]) -> Sequence:
    params = request.params
    scores = params.logprobs is not None or params.prompt_logprobs is not None
    several = params.n != 1 or (params.best_of or 1) > 1  # best_of 1 is one sample, as by default
    if scores or several or params.json_schema is not None:
        # An echo has no model, so no probabilities, samples or grammar: say so rather than fake them.
        message = "logprobs, n, best_of and response_format need a model; the placeholder engine has none"
        raise RequestError(ErrorType.INVALID_REQUEST, message)
    text = request.prompt or " ".join(m["content"] for m in request.messages or [])
    words = text.split() or ["..."]
    return Sequence(
        request=request,
        future=future,
        prompt_ids=list(range(len(words))),
        reservation=0,  # no KV cache: max_batch_tokens does not bind an echo
        generator=None,
        submitted_at=time.monotonic(),
        text=IncrementalText(_Words(words)),
    )
