"""The engine loop every engine shares (local.py's, the placeholder's): one thread, each step
schedule -> execute -> update.

Threads. Callers (Celery task threads) build a Sequence on their own thread and hand it to
submit(), which registers it and puts it in the inbox; cancel() only sets a flag. The loop thread
owns everything else: the Scheduler (which sequences run), the Executor (forward passes and rows)
and the OutputProcessor (what each token does, how each request ends).

One step (`_step`), vLLM v1's EngineCore.step:
  1. take new sequences from the inbox into the scheduler;
  2. schedule: the StepPlan (scheduler.py);
  3. apply its aborts: each fails with `canceled` or `timeout`; a running one's row is freed first;
  4. execute and update: prefill each admitted sequence alone and apply its first token (one that
     ends there never takes a row); then decode every row (a model gives each one token, the
     zero-cost echo a run of several), apply each row's tokens as one run (OutputProcessor.apply_run),
     and free the rows of the sequences that ended.
So a short job joins at the next step and leaves as soon as it is done: it never waits for a long one.

Metrics: EngineConfig.on_step receives a StepStats after every step that did work (batch size,
tokens generated, prefill tokens, duration, first-token latencies from submit); stats() returns
counters. Results carry queued_ms, time_to_first_token_ms (from admission) and the largest batch_size.

Failures: a failing prefill fails only its own request (`unavailable`). Anything else escaping a
step is fatal: `fatal_error` is set to a FatalEngineError, EngineConfig.on_fatal is called with it
first (a worker hands its jobs back to the queue and exits there, so no job is recorded as failed
for it), then every held future fails with that FatalEngineError, and so do later submits, at once.
start() raises FatalEngineError when the executor cannot prepare (load, warm up). After shutdown()
every held future fails with `unavailable`.
"""

from __future__ import annotations

import logging
import queue
import threading
import time

from shared.logging import fields
from workers.engine.config import EngineConfig
from workers.engine.executor import Executor
from workers.engine.output import OutputProcessor, OutputRules, log_failure
from workers.engine.scheduler import Abort, Limits, Scheduler
from workers.engine.sequence import Sequence
from workers.engine.types import (
    EngineStats,
    ErrorType,
    FatalEngineError,
    RequestError,
    StepStats,
    call_on_fatal,
    check_fault_file,
)

logger = logging.getLogger(__name__)

#: How long an idle loop blocks on its inbox before re-checking for shutdown and the fault file.
IDLE_WAIT_S = 0.05


class EngineCore:
    """The loop thread over an Executor (see the module docstring)."""

    def __init__(self, config: EngineConfig, executor: Executor) -> None:
        #: Set (once) when the engine died; the worker should exit non-zero.
        self.fatal_error: FatalEngineError | None = None
        self._config = config
        self._executor = executor
        self._scheduler = Scheduler(
            Limits(config.max_batch_size, config.max_batch_tokens, config.max_prefill_tokens_per_step)
        )
        self._output: OutputProcessor | None = None  # built once the executor knows its model
        # SimpleQueue (C): the loop looks for new sequences every step, and Queue's lock and
        # condition were a visible share of a zero-cost (placeholder) step.
        self._inbox: queue.SimpleQueue[Sequence] = queue.SimpleQueue()
        self._live: dict[str, Sequence] = {}
        self._lock = threading.Lock()  # guards _live and _accepting
        self._accepting = False
        self._stopping = threading.Event()
        self._ready = threading.Event()  # set once start-up finished, well or not
        self._thread = threading.Thread(target=self._loop, name="genq-engine", daemon=True)
        self._steps = 0
        self._prompt_tokens = 0

    # ---- caller side ----------------------------------------------------------------------------

    def start(self) -> None:
        """Prepare the executor and start the loop, all on the loop thread, which start() waits for:
        with GNU OpenMP, a thread's parallel regions run markedly slower while another thread's
        OpenMP team exists, so every torch call stays on one thread. Raises FatalEngineError when
        the executor cannot prepare."""
        if not self._ready.is_set() and not self._thread.is_alive():
            self._thread.start()
        self._ready.wait()
        if self.fatal_error is not None:
            raise self.fatal_error

    def check_running(self) -> None:
        """Raise what a submit would meet now: the fatal error, or `unavailable` when not running."""
        if self.fatal_error is not None:
            raise self.fatal_error
        if not self._accepting:
            raise RequestError(ErrorType.UNAVAILABLE, "the engine is not running")

    def submit(self, sequence: Sequence) -> None:
        """Register and queue a sequence; RequestError when its id runs already or the engine is
        not accepting, the FatalEngineError when it died."""
        with self._lock:  # register and enqueue atomically, so shutdown() never strands a sequence
            if self.fatal_error is not None:
                raise self.fatal_error
            if not self._accepting:
                raise RequestError(ErrorType.UNAVAILABLE, "the engine is shutting down")
            if sequence.request_id in self._live:
                message = f"request {sequence.request_id!r} is already running"
                raise RequestError(ErrorType.INVALID_REQUEST, message)
            self._live[sequence.request_id] = sequence
            self._inbox.put(sequence)

    def cancel(self, request_ids: list[str]) -> None:
        """Flag these requests (those held) to stop at the next step."""
        with self._lock:
            sequences = [self._live[id_] for id_ in request_ids if id_ in self._live]
        for sequence in sequences:
            sequence.cancel_requested = True  # a plain bool store: atomic, read by the loop each step

    def shutdown(self, timeout: float | None = None) -> None:
        with self._lock:
            self._accepting = False
        self._stopping.set()
        if self._thread.is_alive():
            self._thread.join(timeout)

    def stats(self) -> EngineStats:
        output = self._output.counters if self._output is not None else None
        return EngineStats(
            steps=self._steps,
            tokens_generated=output.tokens_generated if output else 0,
            prompt_tokens=self._prompt_tokens,
            requests_finished=output.requests_finished if output else 0,
            requests_failed=output.requests_failed if output else 0,
            running=self._scheduler.running,
            waiting=self._scheduler.waiting + self._inbox.qsize(),
        )

    # ---- the loop -------------------------------------------------------------------------------

    def _loop(self) -> None:
        try:
            self._prepare()
        except Exception as exc:
            failed = FatalEngineError(f"start-up failed: {exc!r}")
            self.fatal_error = exc if isinstance(exc, FatalEngineError) else failed
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
        finally:
            self._executor.close()  # on this thread: the executor's native calls all stay on it
        self._fail_everything(RequestError(ErrorType.UNAVAILABLE, "engine shut down"))

    def _prepare(self) -> None:
        self._executor.prepare()
        rules = OutputRules(
            self._executor.eos_token_ids, self._executor.context_tokens, self._config.output_interval_s
        )
        self._output = OutputProcessor(rules, self._forget)

    def _step(self) -> None:
        check_fault_file(self._config.fault_file)
        self._take_new(block=not self._scheduler.has_work)
        now = time.monotonic()
        plan = self._scheduler.schedule(now)
        self._apply_aborts(plan.aborts)
        started = time.perf_counter()
        first_token_ms = [ms for ms in map(self._prefill, plan.prefill) if ms is not None]
        batch_size = self._executor.rows
        decoded = self._decode(batch_size) if batch_size else 0
        prefill_tokens = sum(len(sequence.prompt_ids) for sequence in plan.prefill)
        if prefill_tokens or batch_size:
            tokens = decoded + len(first_token_ms)
            self._record_step(
                batch_size, tokens, prefill_tokens, first_token_ms, time.perf_counter() - started
            )

    def _take_new(self, block: bool) -> None:
        try:
            if block:
                self._scheduler.add(self._inbox.get(timeout=IDLE_WAIT_S))
            while True:
                self._scheduler.add(self._inbox.get_nowait())
        except queue.Empty:
            return

    def _apply_aborts(self, aborts: tuple[Abort, ...]) -> None:
        output = self._require_output()
        running = [abort.sequence for abort in aborts if abort.was_running]
        if running:
            self._executor.release(running)
        for abort in aborts:
            if abort.error is None:
                output.drop(abort.sequence)
            else:
                output.fail(abort.sequence, abort.error)

    def _prefill(self, sequence: Sequence) -> float | None:
        """Prefill one admitted sequence and apply its first token; the time to that token (ms from
        submit), or None when it got none (its prefill failed, or it only scores its prompt)."""
        output = self._require_output()
        try:
            token = self._executor.prefill(sequence)
        except Exception as exc:  # a prefill failing is this request's failure alone
            log_failure("prefill_failed", sequence, exc)
            output.fail(sequence, RequestError(ErrorType.UNAVAILABLE, f"prefill failed: {exc}"))
            return None
        self._prompt_tokens += len(sequence.prompt_ids)
        sequence.first_token_at = time.monotonic()
        if token is None:  # max_tokens 0: the prompt's log-probabilities were all it asked for
            output.finish(sequence, "", "length")
            return None
        if not output.apply(sequence, token):
            self._executor.join(sequence)
        return (sequence.first_token_at - sequence.submitted_at) * 1000

    def _decode(self, batch_size: int) -> int:
        """Apply a decode step's tokens; how many were applied."""
        output = self._require_output()
        ended = []
        applied = 0
        for sequence, tokens in self._executor.decode():
            sequence.batch_size = max(sequence.batch_size, batch_size)
            before = len(sequence.completion)
            if output.apply_run(sequence, tokens):
                ended.append(sequence)
            applied += len(sequence.completion) - before
        if ended:
            self._executor.release(ended)
        return applied

    def _forget(self, sequence: Sequence) -> None:
        with self._lock:
            if self._live.get(sequence.request_id) is sequence:
                del self._live[sequence.request_id]

    def _record_step(
        self, batch_size: int, tokens: int, prefill_tokens: int, first_token_ms: list[float], duration: float
    ) -> None:
        self._steps += 1
        mask_s, masked_rows = self._executor.take_mask_stats()
        cache = self._executor.take_cache_stats()
        hook = self._config.on_step
        if hook is None:
            return
        stats = StepStats(
            batch_size=batch_size,
            tokens=tokens,
            prefill_tokens=prefill_tokens,
            duration_s=duration,
            first_token_ms=tuple(first_token_ms),
            mask_s=mask_s,
            masked_rows=masked_rows,
            cache=cache,
        )
        try:
            hook(stats)
        except Exception as exc:  # metrics must not stop generation
            logger.warning("on_step_failed", extra=fields(error=repr(exc)))

    # ---- death ----------------------------------------------------------------------------------

    def _die(self, exc: Exception) -> None:
        """on_fatal first (a worker hands its jobs back and exits there), then every future in
        flight fails with the FatalEngineError: never as a failure of the request itself."""
        fatal = FatalEngineError(f"engine loop failed: {exc!r}")
        fatal.__cause__ = exc
        logger.error("engine_fatal", extra=fields(model=self._config.model, error=repr(exc)))
        self.fatal_error = fatal
        with self._lock:
            self._accepting = False
        call_on_fatal(self._config.on_fatal, fatal)
        self._fail_everything(fatal)

    def _fail_everything(self, error: RequestError | FatalEngineError) -> None:
        self._take_new(block=False)
        output = self._require_output()
        for sequence in self._scheduler.take_all():
            output.fail(sequence, error)

    def _require_output(self) -> OutputProcessor:
        if self._output is None:
            raise RuntimeError("the engine is not started")
        return self._output
