"""PLACEHOLDER engine: a deterministic text generator, not a model.

It exists so the job service's plumbing (queue, store, cancel, deadlines, batching
bookkeeping) can be exercised without loading weights. Every job it serves says
"placeholder" in its model label. It "generates" by echoing the prompt's words back,
one word per step, at `placeholder_step_s` per step, through the same loop-thread and
future contract as the real engine, and streams its text as often as that engine does (at most
once per `output_interval_s` per request).
"""

from __future__ import annotations

import concurrent.futures
import hashlib
import math
import queue
import threading
import time
from dataclasses import dataclass, field

from workers.engine.config import PLACEHOLDER_MODEL, EngineConfig
from workers.engine.types import (
    ErrorType,
    FatalEngineError,
    GenerationRequest,
    GenerationResult,
    OutputUpdate,
    RequestError,
    StepStats,
    call_on_fatal,
    check_fault_file,
)

#: Seconds an idle engine waits for a request before it looks at stop and the fault file again.
IDLE_CHECK_S = 0.05


@dataclass
class _Sequence:
    request: GenerationRequest
    future: concurrent.futures.Future[GenerationResult]
    words: list[str]
    admitted_at: float = field(default_factory=time.monotonic)
    produced: list[str] = field(default_factory=list)
    first_token_at: float | None = None
    batch_size: int = 1
    #: When on_output was last called (the real engine's throttle: EngineConfig.output_interval_s).
    last_output_at: float = -math.inf


class PlaceholderEngine:
    """Echo generator with the real engine's threading contract. Not a language model."""

    label = "placeholder (echoes the prompt; not a model)"

    def __init__(self, config: EngineConfig) -> None:
        self.model_id = PLACEHOLDER_MODEL
        self.fingerprint = hashlib.sha256(b"placeholder-echo/v1").hexdigest()[:16]
        self.fatal_error: FatalEngineError | None = None
        self._config = config
        # SimpleQueue (C): the loop looks for new requests every step, and Queue's lock and
        # condition made that look a visible share of a zero-cost step.
        self._inbox: queue.SimpleQueue[_Sequence] = queue.SimpleQueue()
        self._cancelled: set[str] = set()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="genq-engine", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def submit(self, request: GenerationRequest) -> concurrent.futures.Future[GenerationResult]:
        future: concurrent.futures.Future[GenerationResult] = concurrent.futures.Future()
        if self.fatal_error is not None:  # as the real engine: its worker hands the job back
            future.set_exception(self.fatal_error)
            return future
        params = request.params
        scores = params.logprobs is not None or params.prompt_logprobs is not None
        several = params.n != 1 or (params.best_of or 1) > 1  # best_of 1 is one sample, as by default
        if scores or several or params.json_schema is not None:
            # An echo has no model, so no probabilities, samples or grammar: say so rather than fake them.
            message = "logprobs, n, best_of and response_format need a model; the placeholder engine has none"
            future.set_exception(RequestError(ErrorType.INVALID_REQUEST, message))
            return future
        text = request.prompt or " ".join(m["content"] for m in request.messages or [])
        self._inbox.put(_Sequence(request, future, text.split() or ["..."]))
        return future

    def cancel(self, request_id: str) -> None:
        with self._lock:
            self._cancelled.add(request_id)

    def shutdown(self, timeout: float | None = None) -> None:
        self._stop.set()
        self._thread.join(timeout)

    def _loop(self) -> None:
        running: list[_Sequence] = []
        try:
            self._run(running)
        except Exception as exc:  # as the real engine: anything escaping a step is fatal
            self._die(exc, running)

    def _die(self, exc: Exception, running: list[_Sequence]) -> None:
        fatal = FatalEngineError(f"engine loop failed: {exc!r}")
        self.fatal_error = fatal
        call_on_fatal(self._config.on_fatal, fatal)
        while not self._inbox.empty():
            running.append(self._inbox.get_nowait())
        for seq in running:
            seq.future.set_exception(fatal)

    def _run(self, running: list[_Sequence]) -> None:
        while not self._stop.is_set():
            check_fault_file(self._config.fault_file)
            self._admit(running)
            if not running:
                self._wait_for_work(running)
                continue
            if self._config.placeholder_step_s:
                time.sleep(self._config.placeholder_step_s)
            batch = len(running)
            running[:] = [seq for seq in running if not self._step(seq, batch)]
            if self._config.on_step is not None:
                self._config.on_step(
                    StepStats(batch_size=batch, tokens=batch, prefill_tokens=0, duration_s=0.0)
                )
        for seq in running:
            seq.future.set_exception(RequestError(ErrorType.UNAVAILABLE, "engine shut down"))

    def _wait_for_work(self, running: list[_Sequence]) -> None:
        """Sleep until a request arrives: woken by submit() at once (a poll every 2 ms delayed
        each job by up to that and spun the CPU), and within IDLE_CHECK_S for stop and faults."""
        try:
            running.append(self._inbox.get(timeout=IDLE_CHECK_S))
        except queue.Empty:
            return

    def _admit(self, running: list[_Sequence]) -> None:
        while len(running) < self._config.max_batch_size:
            try:
                running.append(self._inbox.get_nowait())
            except queue.Empty:
                return

    def _step(self, seq: _Sequence, batch: int) -> bool:
        """Advance one sequence by one word; True when it has left the batch. O(1) unless the
        request has stop strings or its text is streamed now: a step of a zero-cost engine
        should cost next to nothing (bench/machinery.py measures the machinery around it)."""
        request, now = seq.request, time.monotonic()
        seq.batch_size = max(seq.batch_size, batch)
        if self._cancelled and self._take_cancel(request.request_id):
            seq.future.set_exception(RequestError(ErrorType.CANCELED, "canceled by the client"))
            return True
        if request.deadline is not None and now > request.deadline:
            seq.future.set_exception(RequestError(ErrorType.TIMEOUT, "job deadline passed while running"))
            return True
        seq.produced.append(seq.words[len(seq.produced) % len(seq.words)])
        seq.first_token_at = seq.first_token_at or now
        stops = request.params.stop
        text = " ".join(seq.produced) if stops else ""
        for stop in stops:
            if stop in text:
                return self._finish(seq, text[: text.index(stop)], "stop")
        if len(seq.produced) >= request.params.max_tokens:
            return self._finish(seq, text or " ".join(seq.produced), "length")
        # Throttled as the real engine's streaming is: at zero cost per step, a call per word put
        # ~180 stream writes on every 256-token job (bench/machinery.py), which no model makes.
        if request.on_output is not None and now - seq.last_output_at >= self._config.output_interval_s:
            seq.last_output_at = now
            request.on_output(OutputUpdate(text or " ".join(seq.produced), len(seq.produced)))
        return False

    def _take_cancel(self, request_id: str) -> bool:
        with self._lock:
            if request_id not in self._cancelled:
                return False
            self._cancelled.discard(request_id)
            return True

    def _finish(self, seq: _Sequence, text: str, reason: str) -> bool:
        now = time.monotonic()
        seq.future.set_result(
            GenerationResult(
                text=text,
                finish_reason="stop" if reason == "stop" else "length",
                prompt_tokens=len(seq.words),
                completion_tokens=len(seq.produced),
                inference_ms=(now - seq.admitted_at) * 1000,
                batch_size=seq.batch_size,
                time_to_first_token_ms=((seq.first_token_at or now) - seq.admitted_at) * 1000,
            )
        )
        return True
