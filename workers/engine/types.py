"""The engine's small, closed message set: what a worker hands in and gets back.

Nothing here imports Celery, Redis or FastAPI: the engine is a library a Celery task
thread calls, and these types are the whole contract between the two.
"""

from __future__ import annotations

import concurrent.futures
import enum
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, Protocol

from shared.jobspec import PromptTemplate, Sampling
from shared.logging import fields

FinishReason = Literal["stop", "length"]


@dataclass(frozen=True, slots=True)
class OutputUpdate:
    """A running request's output so far, as its on_output callback receives it."""

    #: The text generated so far that is safe to show (no trailing partial stop string).
    text: str
    #: Completion tokens generated so far.
    tokens: int
    #: With SamplingParams.logprobs: the entries of the tokens streamed so far, each one's text
    #: wholly inside `text` (the newest token waits for the next update or the result, whose
    #: entries repeat these exactly). None when the request asked for no log-probabilities.
    logprobs: tuple[TokenLogprob, ...] | None = None
    #: Which of the request's completions this is (OpenAI's n; see parallel.py).
    index: int = 0


#: Called from the engine thread with the request's OutputUpdate. It must be cheap and must not
#: raise; throttling is the callee's business.
OutputCallback = Callable[[OutputUpdate], None]


class SamplingParams(Sampling):
    """How to pick tokens: the job's Sampling (shared/jobspec.py, which declares each parameter's
    bounds and default and checks them as it is built) plus what only the engine sets.
    temperature == 0 means greedy. Raw log-probabilities (logprobs) are before penalties and
    temperature, as vLLM's default."""

    #: Keep generating past the end-of-sequence token (benchmarks use it to fix the work per job).
    ignore_eos: bool = False
    #: A JSON schema (serialized) every completion must match, enforced by token masks
    #: (sampling/structured.py); None: free text. OpenAI's json_object is shared.structured.ANY_OBJECT.
    json_schema: str | None = None


@dataclass(slots=True)
class GenerationRequest:
    """One job's generation, as the engine sees it: exactly one of prompt/messages."""

    request_id: str
    params: SamplingParams
    prompt: str | None = None
    messages: list[dict[str, str]] | None = None
    #: For a `prompt` only: "chat" wraps it as one user message of the chat template, "none" tokenizes
    #: it verbatim (OpenAI's /v1/completions); None: EngineConfig.prompt_as_chat.
    template: PromptTemplate | None = None
    #: time.monotonic() after which the engine stops the sequence with a `timeout` error.
    deadline: float | None = None
    on_output: OutputCallback | None = field(default=None, repr=False)


@dataclass(frozen=True, slots=True)
class TokenLogprob:
    """One token of a completion (or prompt) with its log-probability under the model."""

    token_id: int
    #: The token alone, decoded (special tokens shown).
    token: str
    #: What this token added to the returned text (may be "" for a half character or a cut stop string);
    #: the texts of a result's tokens concatenate to its text.
    text: str
    #: log-softmax of the model's logits at this position; None for a prompt's first token.
    logprob: float | None
    #: The most likely tokens at this position, most likely first: (token id, token, logprob).
    top: tuple[tuple[int, str, float], ...] = ()


@dataclass(frozen=True, slots=True)
class GenerationResult:
    text: str
    finish_reason: FinishReason
    prompt_tokens: int
    completion_tokens: int
    #: Wall time from admission into the running batch to the last token.
    inference_ms: float
    #: Largest number of sequences that shared a step with this one.
    batch_size: int
    time_to_first_token_ms: float
    #: Wall time from submit() to admission into the running batch (waiting behind a full batch).
    queued_ms: float = 0.0
    #: One per completion token when SamplingParams.logprobs was set.
    logprobs: tuple[TokenLogprob, ...] | None = None
    #: One per prompt token when SamplingParams.prompt_logprobs was set.
    prompt_logprobs: tuple[TokenLogprob, ...] | None = None
    #: Prompt tokens whose KV cells the prefix cache held: not computed for this request.
    cached_prompt_tokens: int = 0
    #: With n or best_of > 1: the n completions returned, best first for best_of, in sample order
    #: otherwise (the fields above describe the first; completion_tokens counts every sample).
    choices: tuple[GenerationResult, ...] = ()


@dataclass(frozen=True, slots=True)
class CacheStats:
    """The prefix cache (a backend's KV cells kept for later prompts) over some steps."""

    #: Prompt tokens whose KV cells a prefill found in the cache (not computed again).
    cached_prompt_tokens: int = 0
    #: Rows whose kept cells were dropped to keep the cache within its bound.
    evictions: int = 0
    #: Tokens the cache keeps now, at the end of the last of these steps.
    kept_tokens: int = 0

    def since(self, earlier: CacheStats) -> CacheStats:
        """These running totals less `earlier` ones: what the steps between them did."""
        cached, evictions = earlier.cached_prompt_tokens, earlier.evictions
        return CacheStats(self.cached_prompt_tokens - cached, self.evictions - evictions, self.kept_tokens)


#: What a backend without a prefix cache reports.
NO_CACHE = CacheStats()


@dataclass(frozen=True, slots=True)
class StepStats:
    """What one engine step did; handed to EngineConfig.on_step for metrics (e.g. Prometheus histograms)."""

    #: Sequences decoded together in this step (0 for a prefill-only step).
    batch_size: int
    #: Tokens generated in this step: one per decoded sequence plus one per prefilled prompt.
    tokens: int
    #: Prompt tokens of the prompts prefilled in this step (those the prefix cache held included).
    prefill_tokens: int
    #: Wall seconds the step took.
    duration_s: float
    #: Time to first token (ms, from submit(), queueing included) of each request whose first token came
    #: in this step.
    first_token_ms: tuple[float, ...] = ()
    #: Wall seconds spent computing and applying structured-output masks in this step.
    mask_s: float = 0.0
    #: Rows whose logits were masked in this step (0: no structured output ran).
    masked_rows: int = 0
    #: The prefix cache in this step (CacheStats; all 0 on a backend without one).
    cache: CacheStats = NO_CACHE


@dataclass(frozen=True, slots=True)
class EngineStats:
    """A snapshot of the engine's counters (engine.stats())."""

    steps: int
    tokens_generated: int
    prompt_tokens: int
    requests_finished: int
    requests_failed: int
    running: int
    waiting: int


class EngineError(Exception):
    """Base of everything the engine raises."""


class ErrorType(enum.StrEnum):
    """Why a request failed: the job's `error.type`, as the client sees it."""

    INVALID_REQUEST = "invalid_request"  # the request cannot run on this model (a 400 at the API)
    UNAVAILABLE = "unavailable"  # the engine could not run it now (not running, prefill failed)
    CANCELED = "canceled"
    TIMEOUT = "timeout"


class RequestError(EngineError):
    """A per-request failure: it fails this job only. `type` is what the client sees."""

    def __init__(self, type_: ErrorType, message: str) -> None:
        super().__init__(message)
        self.type = type_
        self.message = message


class FatalEngineError(EngineError):
    """The engine cannot go on (OOM that does not clear, broken device): the process must exit.
    The futures of requests in flight fail with it: they did not fail, their engine did."""


def call_on_fatal(on_fatal: Callable[[FatalEngineError], None] | None, error: FatalEngineError) -> None:
    """Run the engine's on_fatal hook; a failing hook is logged (the engine is dead either way)."""
    if on_fatal is None:
        return
    try:
        on_fatal(error)
    except Exception as hook_exc:
        logging.getLogger(__name__).error("on_fatal_failed", extra=fields(error=repr(hook_exc)))


class InjectedFault(RuntimeError):
    """Raised by an engine step when the test-only fault file exists (EngineConfig.fault_file)."""


def check_fault_file(path: Path | None) -> None:
    """Raise InjectedFault once per creation of the fault file (it is deleted here)."""
    if path is None:
        return
    try:
        path.unlink()
    except FileNotFoundError:
        return
    raise InjectedFault(f"fault injected through {path}")


class Engine(Protocol):
    """What a worker needs from an engine. Implementations own one model and one loop thread."""

    #: The model id jobs name (e.g. "smollm2-135m-instruct").
    model_id: str
    #: A digest of the weights and chat template; part of every cache key.
    fingerprint: str
    #: Human-readable description, stamped on every job it serves (e.g. "random weights").
    label: str

    def start(self) -> None:
        """Load (if not loaded), warm up, and start the loop thread."""

    def submit(self, request: GenerationRequest) -> concurrent.futures.Future[GenerationResult]:
        """Queue a request; the future resolves with a result or a RequestError."""

    def cancel(self, request_id: str) -> None:
        """Stop a request at the next step; its future fails with RequestError('canceled')."""

    def shutdown(self, timeout: float | None = None) -> None:
        """Stop the loop; pending futures fail with RequestError('unavailable')."""
