"""The transformers engine: one loop thread doing iteration-level (continuous) batching.

Threads. Callers (Celery task threads) call submit(), which tokenizes on the caller's thread,
validates, and hands a Sequence to the loop through a queue; they wait on the returned future.
cancel() only sets a flag. The loop thread owns every other piece of state. Nothing here imports
Celery or Redis.

One step of the loop (`_step`), vLLM-style:
  1. take new sequences from the inbox;
  2. apply aborts: cancelled sequences fail with `canceled`, ones past their deadline with `timeout`,
     waiting or running alike, and their rows are freed before this step's forward pass;
  3. admit waiting sequences (FIFO) while the batch has fewer than max_batch_size rows, their
     reservations (prompt + max_tokens, capped by the context) fit in max_batch_tokens, and this
     step's prefill stays within max_prefill_tokens_per_step; each is prefilled alone and gets its
     first token;
  4. decode one token for every row together, then release finished rows.
So a short job joins at the next step and leaves as soon as it is done: it never waits for a long one.

Text rules. `messages` go through the chat template (add_generation_prompt=True). A raw `prompt` is
wrapped as one user message when the request's template is "chat" (or unset and
EngineConfig.prompt_as_chat, the default) and the tokenizer has a template; with template "none" it
is tokenized verbatim, as OpenAI's /v1/completions continues text. The end-of-sequence token ends
generation with finish_reason "stop" (it is counted in completion_tokens, not shown in text); a
stop string ends it with "stop" and is cut from the text with everything after it; max_tokens, or
the context filling up, ends it with "length". prompt_tokens counts the prompt after the chat template.

Sampling: each row's logits are first adjusted by its own min_tokens, logit_bias and penalties
(penalties.py, vLLM's order), then greedy at temperature 0, else temperature + top-p with a
per-request generator (see sampling.py for when batched and solo runs can differ). A request with
SamplingParams.logprobs gets each chosen token's raw log-probability (logprobs.py: before any
adjustment, as vLLM); one with prompt_logprobs is prefilled at every position (without the shared
prefix) to score its prompt, and with max_tokens 0 it ends there. A request with a json_schema
has its row's logits masked to what the grammar allows (structured.py); it ends with "stop" when
the grammar is complete.

Streaming: on_output(OutputUpdate: text so far, completion tokens so far, and with logprobs the
entries of the tokens streamed so far) is called from the loop thread at most once per
output_interval_s per request, never after the result, with any trailing partial stop string held
back. It runs inline, so it must be cheap (the worker hands it to a queue); it may raise
without harming the loop.

Metrics: EngineConfig.on_step receives a StepStats after every step (batch size, tokens generated,
prefill tokens, duration, first-token latencies from submit); engine.stats() returns counters.
Results carry queued_ms, time_to_first_token_ms (from admission) and the largest batch_size.

Failures: a bad request (prompt too long for the context, empty, bad parameters) fails that future
with `invalid_request` and nothing else. A failing prefill fails only its own request
(`unavailable`). A failing decode step (after one retry for an out-of-memory error) is fatal:
`engine.fatal_error` is set to a FatalEngineError, EngineConfig.on_fatal is called with it first
(a worker hands its jobs back to the queue and exits there, so no job is recorded as failed for
it), then every held future fails with that FatalEngineError, and so do later submits, at once
(a job its worker claimed in the moment before it exits is handed back too, not failed). start() raises
FatalEngineError when the model cannot load or its warm-up output is not finite.
"""

from __future__ import annotations

import concurrent.futures
import logging
import queue
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Any

import torch

from shared.logging import fields
from workers.engine.batch import RunningBatch
from workers.engine.config import EngineConfig
from workers.engine.cpu_linear import use_transposed_linear
from workers.engine.loading import LoadedModel, load_model
from workers.engine.logprobs import describe, describe_streamed, prompt_logprobs, step_logprobs
from workers.engine.parallel import SampleGroup, sample_count
from workers.engine.penalties import adjust_logits
from workers.engine.sampling import choose_tokens, make_generator
from workers.engine.sequence import Sequence, find_stop, streamable
from workers.engine.structured import Grammars, mask_logits
from workers.engine.types import (
    MAX_TOP_LOGPROBS,
    EngineStats,
    ErrorType,
    FatalEngineError,
    FinishReason,
    GenerationRequest,
    GenerationResult,
    OutputUpdate,
    RequestError,
    SamplingParams,
    StepStats,
    TokenLogprob,
    call_on_fatal,
    check_fault_file,
)

logger = logging.getLogger(__name__)

#: How long an idle loop blocks on its inbox before re-checking for shutdown.
_IDLE_WAIT_S = 0.05
#: Tokens generated per row in the warm-up step.
_WARMUP_STEPS = 2


@dataclass
class _Counters:
    steps: int = 0
    tokens_generated: int = 0
    prompt_tokens: int = 0
    requests_finished: int = 0
    requests_failed: int = 0


class TransformersEngine:
    """Continuous batching over a transformers causal LM (see the module docstring)."""

    def __init__(self, config: EngineConfig, loaded: LoadedModel | None = None) -> None:
        self.model_id = config.model
        self.fingerprint = loaded.fingerprint if loaded else ""
        self.label = loaded.label if loaded else ""
        #: Set (once) when the engine died; the worker should exit non-zero.
        self.fatal_error: FatalEngineError | None = None
        self._config = config
        self._loaded = loaded
        self._batch: RunningBatch | None = None
        self._inbox: queue.Queue[Sequence] = queue.Queue()
        self._waiting: deque[Sequence] = deque()
        self._running: list[Sequence] = []  # index == row in the batch
        self._live: dict[str, Sequence] = {}
        self._grammars: Grammars | None = None
        #: A multi-sample request's id -> its samples' ids (cancel() stops them all).
        self._groups: dict[str, list[str]] = {}
        self._lock = threading.Lock()  # guards _live and _accepting
        self._tokenizer_lock = threading.Lock()
        self._accepting = False
        self._stopping = threading.Event()
        self._ready = threading.Event()  # set once start-up finished, well or not
        self._thread = threading.Thread(target=self._loop, name="genq-engine", daemon=True)
        self._counters = _Counters()
        #: Structured-output mask time and rows of the step in progress (reported in its StepStats).
        self._step_mask_s = 0.0
        self._step_masked_rows = 0

    # ---- the Engine protocol -------------------------------------------------------------------

    def start(self) -> None:
        """Load the model (unless given), warm up at the largest batch shape, start the loop.

        All of it runs on the loop thread, which start() waits for: with GNU OpenMP, a thread's
        parallel regions run 1.5-2x slower while another thread's OpenMP team exists (measured here:
        90 vs 130-180 ms per 16-row decode step), so the engine keeps every torch call on one thread.
        Raises FatalEngineError when the model cannot load or its warm-up output is not finite.
        """
        if not self._ready.is_set() and not self._thread.is_alive():
            self._thread.start()
        self._ready.wait()
        if self.fatal_error is not None:
            raise self.fatal_error

    def submit(self, request: GenerationRequest) -> concurrent.futures.Future[GenerationResult]:
        if sample_count(request.params) != 1:
            return self._submit_group(request)
        return self._submit_one(request)

    def _submit_group(self, request: GenerationRequest) -> concurrent.futures.Future[GenerationResult]:
        """n or best_of samples: one sequence each, gathered into one future (parallel.py)."""
        params = request.params
        if params.n < 1 or (params.best_of is not None and params.best_of < params.n):
            failed: concurrent.futures.Future[GenerationResult] = concurrent.futures.Future()
            message = f"n ({params.n}) must be >= 1 and at most best_of ({params.best_of})"
            failed.set_exception(RequestError(ErrorType.INVALID_REQUEST, message))
            return failed
        group = SampleGroup(request, self.cancel)
        with self._lock:
            self._groups[request.request_id] = [child.request_id for child in group.children]
        group.future.add_done_callback(lambda _: self._forget_group(request.request_id))
        for index, child in enumerate(group.children):
            group.watch(index, self._submit_one(child))
        return group.future

    def _forget_group(self, request_id: str) -> None:
        with self._lock:
            self._groups.pop(request_id, None)

    def _submit_one(self, request: GenerationRequest) -> concurrent.futures.Future[GenerationResult]:
        future: concurrent.futures.Future[GenerationResult] = concurrent.futures.Future()
        try:
            sequence = self._sequence(request, future)
            with self._lock:  # register and enqueue atomically, so shutdown() never strands a sequence
                self._register(sequence)
                self._inbox.put(sequence)
        except (RequestError, FatalEngineError) as error:
            future.set_exception(error)
        return future

    def cancel(self, request_id: str) -> None:
        with self._lock:
            ids = [request_id, *self._groups.get(request_id, ())]
            sequences = [self._live[id_] for id_ in ids if id_ in self._live]
        for sequence in sequences:
            sequence.cancel_requested = True

    def shutdown(self, timeout: float | None = None) -> None:
        with self._lock:
            self._accepting = False
        self._stopping.set()
        if self._thread.is_alive():
            self._thread.join(timeout)

    def stats(self) -> EngineStats:
        counters = self._counters
        return EngineStats(
            steps=counters.steps,
            tokens_generated=counters.tokens_generated,
            prompt_tokens=counters.prompt_tokens,
            requests_finished=counters.requests_finished,
            requests_failed=counters.requests_failed,
            running=len(self._running),
            waiting=len(self._waiting) + self._inbox.qsize(),
        )

    # ---- caller side -----------------------------------------------------------------------------

    def _sequence(
        self, request: GenerationRequest, future: concurrent.futures.Future[GenerationResult]
    ) -> Sequence:
        loaded = self._require_loaded()
        _validate_params(request)
        _check_vocabulary(request.params, loaded)
        prompt_ids = self._encode(request, loaded)
        context = loaded.context_tokens
        if len(prompt_ids) >= context:
            message = f"prompt is {len(prompt_ids)} tokens; the model's context is {context} tokens"
            raise RequestError(ErrorType.INVALID_REQUEST, message)
        schema = request.params.json_schema
        return Sequence(
            request=request,
            future=future,
            matcher=None if schema is None else self._require_grammars().matcher(schema),
            prompt_ids=prompt_ids,
            reservation=min(len(prompt_ids) + request.params.max_tokens, context),
            generator=make_generator(request.params),
            submitted_at=time.monotonic(),
        )

    def _require_grammars(self) -> Grammars:
        if self._grammars is None:
            raise RuntimeError("the engine is not started")
        return self._grammars

    def _require_loaded(self) -> LoadedModel:
        if self.fatal_error is not None:
            raise self.fatal_error
        if self._loaded is None or not self._accepting:
            raise RequestError(ErrorType.UNAVAILABLE, "the engine is not running")
        return self._loaded

    def _register(self, sequence: Sequence) -> None:
        if not self._accepting:
            raise RequestError(ErrorType.UNAVAILABLE, "the engine is shutting down")
        if sequence.request_id in self._live:
            raise RequestError(
                ErrorType.INVALID_REQUEST, f"request {sequence.request_id!r} is already running"
            )
        self._live[sequence.request_id] = sequence

    def _encode(self, request: GenerationRequest, loaded: LoadedModel) -> list[int]:
        tokenizer = loaded.tokenizer
        has_template = bool(getattr(tokenizer, "chat_template", None))
        messages = request.messages
        if messages is None and self._wraps_prompt(request) and has_template:
            messages = [{"role": "user", "content": request.prompt or ""}]
        if messages is not None and not has_template:
            raise RequestError(ErrorType.INVALID_REQUEST, "this model has no chat template: send a prompt")
        try:
            with self._tokenizer_lock:
                ids = self._tokenize(tokenizer, request.prompt or "", messages)
        except Exception as exc:  # a template rejecting the messages (roles, order) is the client's error
            raise RequestError(ErrorType.INVALID_REQUEST, f"cannot apply the chat template: {exc}") from exc
        if not ids:
            raise RequestError(ErrorType.INVALID_REQUEST, "prompt is empty")
        return [int(token) for token in ids]

    def _wraps_prompt(self, request: GenerationRequest) -> bool:
        if request.template is None:
            return self._config.prompt_as_chat
        return request.template == "chat"

    @staticmethod
    def _tokenize(tokenizer: Any, prompt: str, messages: list[dict[str, str]] | None) -> list[int]:
        if messages is None:
            return list(tokenizer(prompt).input_ids)
        encoded = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        return list(encoded if isinstance(encoded, list) else encoded["input_ids"])

    # ---- the loop --------------------------------------------------------------------------------

    def _loop(self) -> None:
        with torch.inference_mode():
            try:
                self._prepare()
            except Exception as exc:
                error = (
                    exc
                    if isinstance(exc, FatalEngineError)
                    else FatalEngineError(f"start-up failed: {exc!r}")
                )
                self.fatal_error = error
                self._ready.set()
                return
            with self._lock:
                self._accepting = True
            self._ready.set()
            try:
                while not self._stopping.is_set():
                    self._step()
            except Exception as exc:  # anything escaping a step means the batch state is unknown
                self._die(exc)
                return
        self._fail_everything(RequestError(ErrorType.UNAVAILABLE, "engine shut down"))

    def _prepare(self) -> None:
        loaded = self._loaded = self._loaded or load_model(self._config)
        self.fingerprint, self.label = loaded.fingerprint, loaded.label
        if self._config.fast_cpu_linear:
            use_transposed_linear(loaded.model)
        self._batch = RunningBatch(loaded.model, max_rows=self._config.max_batch_size)
        self._batch.share_prefix(_template_prefix(loaded.tokenizer))
        # Built here (~0.4 s), not by the first structured request while it holds up the others.
        self._grammars = Grammars(loaded.tokenizer, int(loaded.model.config.get_text_config().vocab_size))
        self._warm_up(self._batch)

    def _step(self) -> None:
        check_fault_file(self._config.fault_file)
        self._take_new(block=not self._running and not self._waiting)
        now = time.monotonic()
        self._apply_aborts(now)
        started = time.perf_counter()
        prefill_tokens, first_token_ms = self._admit(now)
        batch_size = len(self._running)
        if batch_size:
            self._decode()
        if prefill_tokens or batch_size:
            self._record_step(batch_size, prefill_tokens, first_token_ms, time.perf_counter() - started)

    def _take_new(self, block: bool) -> None:
        try:
            if block:
                self._waiting.append(self._inbox.get(timeout=_IDLE_WAIT_S))
            while True:
                self._waiting.append(self._inbox.get_nowait())
        except queue.Empty:
            return

    def _apply_aborts(self, now: float) -> None:
        for sequence in list(self._waiting):
            error = _abort_reason(sequence, now, "before it started")
            if error is not None:
                self._waiting.remove(sequence)
                self._finish_failed(sequence, error)
        for row in range(len(self._running) - 1, -1, -1):  # descending: leave() moves the last row
            sequence = self._running[row]
            error = _abort_reason(sequence, now, "while running")
            if error is not None:
                self._leave(row)
                self._finish_failed(sequence, error)

    def _admit(self, now: float) -> tuple[int, list[float]]:
        """Prefill waiting sequences that fit; returns prompt tokens prefilled and first-token latencies."""
        prefill_tokens, first_token_ms = 0, []
        while self._waiting and self._fits(self._waiting[0], prefill_tokens):
            sequence = self._waiting.popleft()
            if not sequence.future.set_running_or_notify_cancel():  # the caller cancelled the future itself
                self._forget(sequence)
                continue
            sequence.admitted_at = now
            prefill_tokens += len(sequence.prompt_ids)
            if self._prefill(sequence):
                first_token_ms.append((time.monotonic() - sequence.submitted_at) * 1000)
        return prefill_tokens, first_token_ms

    def _fits(self, sequence: Sequence, prefill_tokens: int) -> bool:
        config = self._config
        if len(self._running) >= config.max_batch_size:
            return False
        if prefill_tokens and prefill_tokens + len(sequence.prompt_ids) > config.max_prefill_tokens_per_step:
            return False
        # A reservation larger than the whole budget still runs, alone, rather than never.
        reserved = sum(running.reservation for running in self._running)
        return not self._running or reserved + sequence.reservation <= config.max_batch_tokens

    def _prefill(self, sequence: Sequence) -> bool:
        """Prefill one sequence and give it its first token; True when it got one (False: the
        prefill failed, or the request only scores its prompt)."""
        batch = self._require_batch()
        params = sequence.request.params
        scored = params.prompt_logprobs
        try:
            cache, logits = batch.prefill(sequence.prompt_ids, every_position=scored is not None)
            if scored is not None:
                sequence.prompt_scores = prompt_logprobs(logits[:-1], sequence.prompt_ids, scored)
            token = self._choose(logits[-1:], [sequence])[0] if params.max_tokens else None
        except Exception as exc:  # a prefill failing is this request's failure alone
            self._log_failure("prefill_failed", sequence, exc)
            self._finish_failed(sequence, RequestError(ErrorType.UNAVAILABLE, f"prefill failed: {exc}"))
            return False
        self._counters.prompt_tokens += len(sequence.prompt_ids)
        sequence.first_token_at = time.monotonic()
        if token is None:  # max_tokens 0: the prompt's log-probabilities were all it asked for
            self._finish(sequence, "", "length")
            return False
        if not self._accept(sequence, token):
            batch.join(cache)
            self._running.append(sequence)
        return True

    def _decode(self) -> None:
        batch = self._require_batch()
        running = self._running
        last_tokens = [sequence.completion[-1] for sequence in running]
        logits = self._forward_with_retry(batch, last_tokens)
        tokens = self._choose(logits, running)
        size = len(running)
        finished = []
        for row, (sequence, token) in enumerate(zip(running, tokens, strict=True)):
            sequence.batch_size = max(sequence.batch_size, size)
            if self._accept(sequence, token):
                finished.append(row)
        for row in reversed(finished):
            self._leave(row)

    def _choose(self, logits: torch.Tensor, sequences: list[Sequence]) -> list[int]:
        """One token per row of logits [rows, vocab]: each row's adjustments, then its sampling."""
        params = [sequence.request.params for sequence in sequences]
        adjusted = adjust_logits(
            logits,
            params,
            [sequence.prompt_ids for sequence in sequences],
            [sequence.completion for sequence in sequences],
            self._require_loaded_model().eos_token_ids,
        )
        matchers = [sequence.matcher for sequence in sequences]
        if any(matcher is not None for matcher in matchers):
            began = time.perf_counter()
            adjusted = mask_logits(adjusted, logits, matchers)
            self._step_mask_s += time.perf_counter() - began
            self._step_masked_rows += sum(matcher is not None for matcher in matchers)
        tokens = choose_tokens(adjusted, params, [sequence.generator for sequence in sequences])
        # Scored on the raw logits: vLLM's default, independent of penalties and temperature.
        scores = step_logprobs(logits, tokens, [row_params.logprobs for row_params in params])
        for sequence, score in zip(sequences, scores, strict=True):
            if score is not None:
                sequence.scores.append(score)
        return tokens

    def _forward_with_retry(self, batch: RunningBatch, last_tokens: list[int]) -> torch.Tensor:
        try:
            return batch.decode(last_tokens)
        except torch.OutOfMemoryError:
            # A transient spike (another process, fragmentation) can clear; a second failure is fatal.
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
            return batch.decode(last_tokens)

    def _accept(self, sequence: Sequence, token: int) -> bool:
        """Append a generated token; resolve the sequence when it is done. True when done."""
        sequence.completion.append(token)
        self._counters.tokens_generated += 1
        params = sequence.request.params
        if sequence.matcher is not None and not sequence.matcher.consume_token(token):
            message = f"the response format's grammar refused token {token}: {sequence.matcher.get_error()}"
            self._finish_failed(sequence, RequestError(ErrorType.UNAVAILABLE, message))
            return True
        if token in self._require_loaded_model().eos_token_ids and not params.ignore_eos:
            return self._finish(sequence, self._decode_text(sequence.completion[:-1]), "stop")
        if sequence.matcher is not None and sequence.matcher.is_stopped():  # the JSON is complete
            return self._finish(sequence, self._decode_text(sequence.completion), "stop")
        text: str | None = None
        if params.stop:
            text = self._decode_text(sequence.completion)
            # Only the newest token can complete a stop string: search from just before it.
            index = find_stop(text, params.stop, max(0, sequence.stop_checked_chars - 1))
            sequence.stop_checked_chars = len(text)
            # Like vLLM, a stop string completed before min_tokens is not a stop (nor later).
            if index is not None and len(sequence.completion) >= params.min_tokens:
                return self._finish(sequence, text[:index], "stop")
        context = self._require_loaded_model().context_tokens
        generated = len(sequence.completion)
        if generated >= params.max_tokens or len(sequence.prompt_ids) + generated >= context:
            final = text if text is not None else self._decode_text(sequence.completion)
            return self._finish(sequence, final, "length")
        self._maybe_stream(sequence, text)
        return False

    def _maybe_stream(self, sequence: Sequence, text: str | None) -> None:
        callback = sequence.request.on_output
        now = time.monotonic()
        if callback is None or now - sequence.last_output_at < self._config.output_interval_s:
            return
        sequence.last_output_at = now
        text = text if text is not None else self._decode_text(sequence.completion)
        visible = streamable(text, sequence.request.params.stop)
        logprobs = None
        if sequence.request.params.logprobs is not None:
            # Decodes only the tokens not streamed yet.
            scores = sequence.scores
            describe_streamed(self._decode_ids, sequence.completion, scores, visible, sequence.streamed)
            logprobs = tuple(sequence.streamed)
        try:
            callback(OutputUpdate(visible, len(sequence.completion), logprobs))
        except Exception as exc:  # a broken publisher must not stop generation
            self._log_failure("on_output_failed", sequence, exc)

    def _finish(self, sequence: Sequence, text: str, reason: FinishReason) -> bool:
        self._forget(sequence)
        self._counters.requests_finished += 1
        logprobs, prompt_scores = self._describe_scores(sequence, text)
        sequence.succeed(text, reason, time.monotonic(), logprobs, prompt_scores)
        return True

    def _describe_scores(
        self, sequence: Sequence, text: str
    ) -> tuple[tuple[TokenLogprob, ...] | None, tuple[TokenLogprob, ...] | None]:
        """The sequence's log-probabilities with their token strings (decoded once, at the end)."""
        params = sequence.request.params
        logprobs = prompt_scores = None
        if params.logprobs is not None:
            logprobs = describe(self._decode_ids, sequence.completion, sequence.scores, text, True)
        if sequence.prompt_scores is not None:
            prompt = sequence.prompt_ids
            prompt_text = self._decode_ids(prompt, False)
            prompt_scores = describe(self._decode_ids, prompt, sequence.prompt_scores, prompt_text, False)
        return logprobs, prompt_scores

    def _finish_failed(self, sequence: Sequence, error: RequestError | FatalEngineError) -> None:
        self._forget(sequence)
        self._counters.requests_failed += 1
        sequence.fail(error)

    def _forget(self, sequence: Sequence) -> None:
        with self._lock:
            if self._live.get(sequence.request_id) is sequence:
                del self._live[sequence.request_id]

    def _leave(self, row: int) -> None:
        moved = self._require_batch().leave(row)
        last = self._running.pop()
        if moved is not None:
            self._running[row] = last

    def _decode_text(self, tokens: list[int]) -> str:
        return self._decode_ids(tokens, True)

    def _decode_ids(self, tokens: list[int], skip_special_tokens: bool) -> str:
        with self._tokenizer_lock:
            tokenizer = self._require_loaded_model().tokenizer
            return str(tokenizer.decode(tokens, skip_special_tokens=skip_special_tokens))

    @staticmethod
    def _log_failure(event: str, sequence: Sequence, exc: Exception) -> None:
        logger.warning(event, extra=fields(job_id=sequence.request_id, error=repr(exc)))

    def _record_step(
        self, batch_size: int, prefill_tokens: int, first_token_ms: list[float], duration: float
    ) -> None:
        self._counters.steps += 1
        hook = self._config.on_step
        mask_s, masked_rows = self._step_mask_s, self._step_masked_rows
        self._step_mask_s, self._step_masked_rows = 0.0, 0
        if hook is None:
            return
        stats = StepStats(
            batch_size=batch_size,
            tokens=batch_size + len(first_token_ms),
            prefill_tokens=prefill_tokens,
            duration_s=duration,
            first_token_ms=tuple(first_token_ms),
            mask_s=mask_s,
            masked_rows=masked_rows,
        )
        try:
            hook(stats)
        except Exception as exc:  # metrics must not stop generation
            logger.warning("on_step_failed", extra=fields(error=repr(exc)))

    # ---- start-up and death ----------------------------------------------------------------------

    def _warm_up(self, batch: RunningBatch) -> None:
        """One short generation at the largest batch shape, so the first job pays no allocation."""
        loaded = self._require_loaded_model()
        prompt = [int(token) for token in loaded.tokenizer("Hello").input_ids] or [0]
        cache, logits = batch.prefill(prompt)
        rows = self._config.max_batch_size
        for _ in range(rows):
            batch.join(cache)
        tokens = [int(logits[-1].argmax())] * rows
        for _ in range(_WARMUP_STEPS):
            logits = batch.decode(tokens)
            if not bool(torch.isfinite(logits).all()):
                raise FatalEngineError(
                    f"refusing to serve {self.model_id}: warm-up logits are NaN or infinite"
                )
            tokens = logits.argmax(dim=-1).tolist()
        while batch.rows:
            batch.leave(batch.rows - 1)

    def _die(self, exc: Exception) -> None:
        """on_fatal first (a worker hands its jobs back and exits there), then every future in
        flight fails with the FatalEngineError: never as a failure of the request itself."""
        fatal = FatalEngineError(f"engine loop failed: {exc!r}")
        fatal.__cause__ = exc
        logger.error("engine_fatal", extra=fields(model=self.model_id, error=repr(exc)))
        self.fatal_error = fatal
        with self._lock:
            self._accepting = False
        call_on_fatal(self._config.on_fatal, fatal)
        self._fail_everything(fatal)

    def _fail_everything(self, error: RequestError | FatalEngineError) -> None:
        self._take_new(block=False)
        for sequence in [*self._running, *self._waiting]:
            self._finish_failed(sequence, error)
        self._running.clear()
        self._waiting.clear()

    def _require_batch(self) -> RunningBatch:
        if self._batch is None:
            raise RuntimeError("the engine is not started")
        return self._batch

    def _require_loaded_model(self) -> LoadedModel:
        if self._loaded is None:
            raise RuntimeError("the engine has no model loaded")
        return self._loaded


def _template_prefix(tokenizer: Any) -> list[int]:
    """The tokens every chat prompt starts with (system block, user header): two renders' common prefix."""
    if not getattr(tokenizer, "chat_template", None):
        return []
    first, second = (
        TransformersEngine._tokenize(tokenizer, "", [{"role": "user", "content": text}])
        for text in ("a", "b")
    )
    size = 0
    while size < min(len(first), len(second)) and first[size] == second[size]:
        size += 1
    return first[:size]


def _validate_params(request: GenerationRequest) -> None:
    params = request.params
    if (request.prompt is None) == (request.messages is None):
        raise RequestError(ErrorType.INVALID_REQUEST, "give exactly one of prompt and messages")
    if request.messages is not None and request.template == "none":
        message = "template 'none' applies to a prompt; messages always use the chat template"
        raise RequestError(ErrorType.INVALID_REQUEST, message)
    least = 0 if params.prompt_logprobs is not None else 1  # 0 tokens: scoring the prompt only
    if params.max_tokens < least:
        raise RequestError(
            ErrorType.INVALID_REQUEST, f"max_tokens must be >= {least}, got {params.max_tokens}"
        )
    if params.n < 1 or (params.best_of is not None and params.best_of < params.n):
        raise RequestError(
            ErrorType.INVALID_REQUEST, f"n ({params.n}) must be >= 1 and <= best_of ({params.best_of})"
        )
    for name in ("logprobs", "prompt_logprobs"):
        value = getattr(params, name)
        if value is not None and not 0 <= value <= MAX_TOP_LOGPROBS:
            raise RequestError(
                ErrorType.INVALID_REQUEST, f"{name} must be in [0, {MAX_TOP_LOGPROBS}], got {value}"
            )
    if params.temperature < 0:
        raise RequestError(ErrorType.INVALID_REQUEST, f"temperature must be >= 0, got {params.temperature}")
    if not 0 < params.top_p <= 1:
        raise RequestError(ErrorType.INVALID_REQUEST, f"top_p must be in (0, 1], got {params.top_p}")
    if any(not stop for stop in params.stop):
        raise RequestError(ErrorType.INVALID_REQUEST, "stop strings must not be empty")
    _validate_adjustments(params)


def _validate_adjustments(params: SamplingParams) -> None:
    for name in ("presence_penalty", "frequency_penalty"):
        if not -2.0 <= getattr(params, name) <= 2.0:
            raise RequestError(
                ErrorType.INVALID_REQUEST, f"{name} must be in [-2, 2], got {getattr(params, name)}"
            )
    if not 0 < params.repetition_penalty <= 2.0:
        raise RequestError(
            ErrorType.INVALID_REQUEST,
            f"repetition_penalty must be in (0, 2], got {params.repetition_penalty}",
        )
    if not 0 <= params.min_tokens <= params.max_tokens:
        message = f"min_tokens ({params.min_tokens}) must be in [0, max_tokens ({params.max_tokens})]"
        raise RequestError(ErrorType.INVALID_REQUEST, message)
    if any(not -100.0 <= bias <= 100.0 for _, bias in params.logit_bias):
        raise RequestError(ErrorType.INVALID_REQUEST, "logit_bias values must be in [-100, 100]")


def _check_vocabulary(params: SamplingParams, loaded: LoadedModel) -> None:
    vocab = int(loaded.model.config.get_text_config().vocab_size)
    bad = [token for token, _ in params.logit_bias if not 0 <= token < vocab]
    if bad:
        message = f"logit_bias names token {bad[0]}, outside this model's vocabulary (0..{vocab - 1})"
        raise RequestError(ErrorType.INVALID_REQUEST, message)


def _abort_reason(sequence: Sequence, now: float, where: str) -> RequestError | None:
    if sequence.cancel_requested:
        return RequestError(ErrorType.CANCELED, "canceled by the client")
    deadline = sequence.request.deadline
    if deadline is not None and now > deadline:
        return RequestError(ErrorType.TIMEOUT, f"job deadline passed {where}")
    return None
