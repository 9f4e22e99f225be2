"""One worker process's state: its engine, the jobs it holds, its heartbeat, leases and cancel
listener, and a reaper.

Celery task threads call `run(job_id)`; everything else here runs on small daemon threads.
The job store's atomic claim decides whether this worker may run a job (first delivery, or a
redelivery whose lease lapsed); each heartbeat renews the leases of the jobs it runs (a job it
no longer holds is stopped); finishing is checked-and-set too, so a job that was canceled, or
handed to another worker, is never overwritten. A drain's timeout and an engine's death hand
the jobs back through the store (a new message, a fresh deadline); nothing held is recorded as
failed because this process stops.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable
from functools import partial
from typing import TypeVar

import orjson
import redis.exceptions
from redis.backoff import ExponentialBackoff
from redis.retry import Retry

from shared import keys, metrics
from shared.cache import CacheEntry, cache_client, cache_key, write_entry
from shared.config import Settings
from shared.jobqueue.reaper import Reaper
from shared.jobqueue.records import as_text, decode_input
from shared.logging import fields
from shared.schemas import JobStatus
from workers import scalein
from workers.cancels import CancelListener
from workers.engine import Engine, ErrorType, FatalEngineError, GenerationResult, RequestError
from workers.heartbeat import Heartbeat
from workers.intake import Intake
from workers.jobs import ClaimOutcome, NextTake, WorkerJobs
from workers.publish import OutputPublisher
from workers.records import JobOutcome, generation_request, success_fields
from workers.redis_threads import ThreadConnections
from workers.store_retry import StoreUnavailable, retry_store_call
from workers.webhooks.output import OutputWebhooks

log = logging.getLogger("genq.worker")
T = TypeVar("T")

#: Exit status of a worker whose engine failed fatally (the supervisor restarts it).
FATAL_EXIT = 70


class HandBack(Exception):
    """The job must go back to the queue (drain, or Redis unreachable for too long)."""


class WorkerRuntime:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        #: The model's engine; None for a worker that only delivers webhooks (attach_engine).
        self.engine: Engine | None = None
        #: Jobs this worker runs at once (its Celery concurrency), published with its heartbeat.
        self.slots = settings.concurrency
        self.worker_id = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"
        self.redis = ThreadConnections.from_url(
            settings.require_redis_url(),
            decode_responses=True,
            socket_connect_timeout=2.0,
            socket_timeout=10.0,
            health_check_interval=10,
            retry=Retry(ExponentialBackoff(cap=1.0, base=0.05), 3),
        )
        self.jobs = WorkerJobs(
            self.redis, settings.lease_ttl_s, settings.max_attempts, settings.job_timeout_s,
            hints=settings.concurrency,
        )  # fmt: skip
        self.reaper = Reaper(
            self.redis, settings.max_attempts, settings.job_timeout_s, settings.reaper_interval_s
        )
        #: A dedicated Redis for the response cache (None: it shares the job store's).
        self.cache_redis = cache_client(settings.cache_redis_address)
        self.ready_file = settings.worker_ready_file or settings.data_dir / f"worker-{os.getpid()}.ready"
        #: The records of the jobs this worker runs, by id (hand-backs rebuild their messages).
        self._inflight: dict[str, dict[str, str]] = {}
        self._draining: set[str] = set()
        self._lock = threading.Lock()
        self._stopped = threading.Event()
        #: Set from the drain on: task threads take no more jobs from the queue.
        self._closing = threading.Event()
        #: Set when the engine died: no job is claimed any more (on_engine_fatal).
        self._dying = False
        #: Stops this process's broker consumer (set by the worker's start-up once Celery is
        #: built): a dying worker calls it before it hands its jobs back.
        self.stop_consuming: Callable[[], None] = lambda: None
        #: Where task threads get jobs without a delivery (take_from); None: every job is delivered.
        self.intake: Intake | None = None
        self._output_webhooks = OutputWebhooks(self.redis, settings)
        self.output = OutputPublisher(self.redis, settings.job_ttl_s, self._output_webhooks.on_output)
        self._deletion_cost = scalein.from_env(
            settings.pod_deletion_cost, settings.pod_namespace, settings.pod_name
        )

    # --- life cycle -------------------------------------------------------------------------------
    def attach_engine(self, engine: Engine) -> None:
        """Serve a model (before start()); the engine's on_fatal should be on_engine_fatal."""
        self.engine = engine

    @property
    def registry(self) -> str:
        """Where this worker heart-beats: /readyz counts only workers that can run jobs."""
        return keys.WORKERS if self.engine is not None else keys.WEBHOOK_WORKERS

    def start(self) -> None:
        """Load and warm up the engine and the job scripts, then start heart-beating, listening for
        cancels, reaping."""
        if self.engine is not None:
            self.engine.start()
            if self.engine.fingerprint:  # the API computes cache keys with it (docs/cache.md)
                self.jobs.publish_model(self.engine.model_id, self.engine.fingerprint)
            self.jobs.load_scripts()  # before any job is taken: the first claim pays no NOSCRIPT
        slots = self.slots if self.engine is not None else None
        heartbeat = Heartbeat(self.jobs, self.worker_id, self.registry, slots, self.ready_file,
                              self._held, self._stop_if_held, self._report_inflight)  # fmt: skip
        heartbeat.start(self.settings.heartbeat_interval_s, self._stopped)
        CancelListener(self.redis, self._stopped, self._stop_if_held).start()
        self.reaper.start()

    def on_engine_fatal(self, error: BaseException) -> None:
        """The engine died (EngineConfig.on_fatal, called before it fails anything in flight):
        stop taking jobs, then hand every job this worker runs back to the queue, and exit non-zero
        so the supervisor restarts the worker. Consuming stops first: a consumer with a free task
        thread took the very job just handed back, which then waited for the reaper. A hand-back
        that cannot be written is left to the job's lease. Runs once; a later caller (a task
        thread whose submit met the dead engine) waits for the exit."""
        with self._lock:
            first, self._dying = not self._dying, True
        if not first:
            threading.Event().wait()  # never set: the first caller ends the process
        self._closing.set()  # task threads take no more jobs from the queue
        log.critical(
            "engine_fatal",
            extra=fields(worker=self.worker_id, error=repr(error), handing_back=len(self._inflight)),
        )
        try:
            self.stop_consuming()
        except Exception as exc:  # the jobs must go back whatever failed here
            log.warning("consumer_stop_failed", extra=fields(error=repr(exc)))
        with self._lock:
            held = dict(self._inflight)
        for job_id, record in held.items():
            try:
                if self.jobs.hand_back(job_id, self.worker_id, record, count_attempt=True):
                    metrics.HANDED_BACK.labels("engine_fatal").inc()
            except redis.exceptions.RedisError as exc:
                log.warning("hand_back_failed", extra=fields(job_id=job_id, error=type(exc).__name__))
        logging.shutdown()
        os._exit(FATAL_EXIT)

    def mark_ready(self) -> None:
        self.ready_file.parent.mkdir(parents=True, exist_ok=True)
        self.ready_file.touch()
        log.info("worker_ready", extra=fields(worker=self.worker_id, model=self.model_id))

    def drain(self, timeout_s: float) -> None:
        """Called on SIGTERM: after timeout_s, stop every job still running and hand it back."""

        def hand_back_all() -> None:
            with self._lock:
                held = list(self._inflight)
                self._draining.update(held)
            for job_id in held:
                if self.engine is not None:
                    self.engine.cancel(job_id)
            log.warning("drain_timeout", extra=fields(handed_back=len(held)))

        self._closing.set()  # no more jobs taken from the queue
        timer = threading.Timer(timeout_s, hand_back_all)
        timer.daemon = True
        timer.start()

    def stop(self) -> None:
        self._closing.set()
        self._stopped.set()
        self.reaper.stop()
        self.output.stop()
        self._output_webhooks.close()
        self.ready_file.unlink(missing_ok=True)
        with contextlib.suppress(redis.exceptions.RedisError):
            self.jobs.leave(self.worker_id, self.registry)
        if self.engine is not None:
            self.engine.shutdown(timeout=5.0)

    @property
    def model_id(self) -> str | None:
        return self.engine.model_id if self.engine is not None else None

    @property
    def closing(self) -> threading.Event:
        """Set from the drain on: task threads take no more jobs or deliveries from the queues."""
        return self._closing

    @property
    def inflight(self) -> int:
        return len(self._inflight)

    # --- one job ---------------------------------------------------------------------------------
    def run(self, job_id: str) -> None:
        """Run the delivered job to a terminal state, or hand it back (drain timeout); then the
        jobs this thread takes straight from the queue (_take_queued). Raises HandBack when the
        store cannot be written for STORE_RETRY_S: the broker must redeliver the message."""
        if self._dying:  # delivered while the worker stops consuming: back to the queue, unclaimed
            raise HandBack("the worker's engine died")
        until = time.monotonic() + self.settings.visibility_timeout_s / 2
        claim = self._store(lambda: self.jobs.claim(job_id, self.worker_id))
        then = None
        if claim.outcome is ClaimOutcome.CLAIMED:
            then = self._next_take(until)
            self._run_claimed(job_id, claim.record, then)
        else:
            log.info(
                "job_skipped", extra=fields(job_id=job_id, outcome=claim.outcome.value, status=claim.status)
            )
        self._take_queued(until, then)

    def _take_queued(self, until: float, then: NextTake | None = None) -> None:
        """Run the jobs this thread gets from the queue itself (workers/intake.py), one after
        another, so that a job costs no broker delivery of its own (no BRPOP, kombu bookkeeping,
        task dispatch or ack). The thread holds one job at a time, as a delivered task does, so the
        worker never holds more jobs than it has threads. Ends when none came within the wait, on
        drain, when the store cannot be reached (a job it held then ends by its lease, as a
        delivered one does), or at `until`, half the visibility timeout after the task began (kombu
        would then deliver its message again). A job a finish took (NextTake) runs even past it."""
        while self.intake is not None and ((then is not None and then.done) or time.monotonic() < until):
            try:
                taken = self.intake.next_job(then)
                if taken is None:
                    return
                then = self._next_take(until)
                self._run_claimed(*taken, then)
            except (HandBack, redis.exceptions.RedisError) as exc:
                log.warning("take_stopped", extra=fields(error=str(exc) or type(exc).__name__))
                return

    def _next_take(self, until: float) -> NextTake | None:
        """The take to send with the next finish (which checks for a drain); None past `until`."""
        if self.intake is None or time.monotonic() >= until:
            return None
        return self.intake.next_take()

    def take_from(self, queue_lists: list[str]) -> None:
        """Let task threads take queued jobs from these lists (in the order the worker's BRPOP
        names them) once their own job ended."""
        self.intake = Intake(
            self.jobs,
            self.redis,
            self.worker_id,
            queue_lists,
            self.settings.worker_take_wait_s,
            self._closing,
        )

    def _run_claimed(self, job_id: str, record: dict[str, str], then: NextTake | None = None) -> None:
        """Run a job this worker claimed to a terminal state, or hand it back (drain timeout);
        `then` goes with its finish."""
        if record.get("started_at"):
            wait_s = float(record["started_at"]) - float(record["created_at"])
            metrics.QUEUE_WAIT.labels(record["queue"]).observe(max(0.0, wait_s))
        with self._lock:
            self._inflight[job_id] = record
        self._report_inflight()
        try:
            self._end_held(job_id, record, then)
        finally:  # after the finish: its last deltas' `output` notices need the job followed
            self.output.forget(job_id)
            self._output_webhooks.forget(job_id)

    def _end_held(self, job_id: str, record: dict[str, str], then: NextTake | None) -> None:
        try:
            ended = self._generate(job_id, record)
        finally:
            with self._lock:
                self._inflight.pop(job_id, None)
                drained = job_id in self._draining
                self._draining.discard(job_id)
            self._report_inflight()
        if drained:
            if self._store(lambda: self.jobs.hand_back(job_id, self.worker_id, record, count_attempt=False)):
                metrics.HANDED_BACK.labels("drain").inc()
                log.info("job_handed_back", extra=fields(job_id=job_id, reason="drain"))
        elif ended is not None:
            self._finish(job_id, record, ended, then)

    def _finish(
        self, job_id: str, record: dict[str, str], outcome: JobOutcome, then: NextTake | None
    ) -> None:
        """End the job, its last output deltas written ahead of it in the same round trip; a
        success is also written to the response cache: in the same script when the cache shares
        the job store's Redis, right before it otherwise, so that a client who sees the job succeed
        and sends it again finds the answer cached."""
        fields, deltas = outcome
        key = self._cache_key(record) if fields.get("status") == JobStatus.SUCCEEDED else None
        if key and self.cache_redis is not None:
            entry = CacheEntry(as_text(fields["output"]), as_text(fields.get("model_label", "")))
            write_entry(self.cache_redis, key, entry, self.settings.cache_ttl_s)
        in_script = (key, self.settings.cache_ttl_s) if key and self.cache_redis is None else None
        # Only the first attempt carries the deltas and the next take: a retry must not write a
        # delta twice (one lost with a failed attempt, the API's follower makes up from the record:
        # api/jobs/follow.py), and a take whose reply was lost left its job to the lease reaper.
        unsent = [(deltas, then)]

        def finish() -> bool:
            batch, take = unsent.pop() if unsent else ([], None)
            take = None if self._closing.is_set() else take  # a draining worker takes no more
            ahead = partial(self.output.write, batch) if batch else None  # nothing ahead: no pipeline
            return self.jobs.finish(job_id, self.worker_id, fields, in_script, record, ahead, take)

        self._store(finish)
        self.output.announce(deltas)

    def _cache_key(self, record: dict[str, str]) -> str | None:
        """The key this worker's result answers: its own model revision, whatever the API assumed,
        in the scope the API gave the job (its owner, when the cache is per key)."""
        if self.engine is None or not self.settings.cache_enabled:
            return None
        spec = decode_input(record["input"])
        return cache_key(self.engine.model_id, self.engine.fingerprint, spec, record.get("cache_scope", ""))

    def _generate(self, job_id: str, record: dict[str, str]) -> JobOutcome | None:
        """The record fields that end the job and its output not yet published, or None when it
        ended elsewhere (canceled)."""
        assert self.engine is not None, "a worker without an engine received a generation job"
        spec = decode_input(record["input"])
        request = generation_request(
            job_id, spec, self.settings.job_timeout_s, lambda update: self.output.offer(job_id, update)
        )
        label: dict[str, str | bytes] = {"model_label": self.engine.label}
        started: dict[str, object] = {"job_id": job_id, "model": self.engine.model_id}
        if self.settings.log_prompts:  # prompts are the users' data: logged only when asked for
            started["input"] = spec.model_dump(mode="json")
        log.info("job_started", extra=fields(**started))
        self._output_webhooks.follow(job_id, spec)
        try:
            result = self.engine.submit(request).result()
        except RequestError as exc:
            if exc.type is ErrorType.CANCELED:
                return None
            error = {"type": exc.type, "message": exc.message}
            metrics.JOBS.labels("failed").inc()
            return JobOutcome(label | {"status": JobStatus.FAILED.value, "error": orjson.dumps(error)}, [])
        except FatalEngineError as exc:  # on_fatal hands every job back and exits; never a failure
            self.on_engine_fatal(exc)
        deltas = self.output.pending(job_id)
        self._observe(result)
        metrics.JOB_LATENCY.labels(record["queue"]).observe(
            max(0.0, time.time() - float(record["created_at"]))
        )
        succeeded: dict[str, object] = {"job_id": job_id, "completion_tokens": result.completion_tokens}
        if self.settings.log_prompts:
            succeeded["output"] = result.text
        log.info("job_succeeded", extra=fields(**succeeded))
        return JobOutcome(label | success_fields(result), deltas)

    def _observe(self, result: GenerationResult) -> None:
        model = self.model_id or ""
        metrics.JOBS.labels("succeeded").inc()
        metrics.INFERENCE_DURATION.labels(model).observe(result.inference_ms / 1000)
        metrics.TIME_TO_FIRST_TOKEN.labels(model).observe(result.time_to_first_token_ms / 1000)

    # --- background ------------------------------------------------------------------------------
    @staticmethod
    def _store(call: Callable[[], T]) -> T:
        """A job-store call, retried while Redis is unreachable or refuses writes (a restart, a
        full or read-only server must not lose jobs nor stop this worker)."""
        try:
            return retry_store_call(call)
        except StoreUnavailable as exc:
            raise HandBack(str(exc)) from exc

    def _report_inflight(self) -> None:
        """Scale-in removes the pods with the lowest deletion cost first: keep ours = our load.
        Throttled inside; the heartbeat calls it too, so a throttled change is sent later."""
        if self._deletion_cost is not None:
            self._deletion_cost.update(self.inflight)

    def _held(self) -> list[str]:
        return list(self._inflight)

    def _stop_if_held(self, job_id: str) -> None:
        """Stop generating a job (canceled through the API, or its lease lost) if it runs here."""
        if self.engine is not None and job_id in self._inflight:
            self.engine.cancel(job_id)
