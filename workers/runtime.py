"""One worker process's state and life cycle: its engine, the jobs it holds, its heartbeat, leases
and cancel listener, and a reaper; start-up, drain, stop, and an engine's death.

Celery task threads call `run(job_id)`, which the job runner does (workers/job_runner.py);
everything else here runs on small daemon threads. Each heartbeat renews the leases of the jobs
this worker runs (a job it no longer holds is stopped). A drain's timeout and an engine's death
hand the jobs back through the store (a new message, a fresh deadline); nothing held is recorded
as failed because this process stops.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
import uuid
from collections.abc import Callable

import redis.exceptions
from redis.backoff import ExponentialBackoff
from redis.retry import Retry

from shared import keys, metrics
from shared.cache import cache_client
from shared.config import Settings
from shared.jobqueue.reaper import Reaper
from shared.logging import fields
from workers import scalein
from workers.cancels import CancelListener
from workers.engine import Engine
from workers.heartbeat import Heartbeat
from workers.held import HeldJobs
from workers.intake import Intake
from workers.job_runner import JobRunner
from workers.jobs import WorkerJobs
from workers.publish import OutputPublisher
from workers.redis_threads import ThreadConnections
from workers.webhooks.output import OutputWebhooks

log = logging.getLogger("genq.worker")

#: Exit status of a worker whose engine failed fatally (the supervisor restarts it).
FATAL_EXIT = 70


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
        #: The jobs this worker runs (hand-backs rebuild their messages from their records).
        self.held = HeldJobs()
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
        self.output_webhooks = OutputWebhooks(self.redis, settings)
        self.output = OutputPublisher(self.redis, settings.job_ttl_s, self.output_webhooks.on_output)
        self._runner = JobRunner(self)
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
                              self._held, self._stop_if_held, self.report_inflight)  # fmt: skip
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
            extra=fields(worker=self.worker_id, error=repr(error), handing_back=len(self.held)),
        )
        try:
            self.stop_consuming()
        except Exception as exc:  # the jobs must go back whatever failed here
            log.warning("consumer_stop_failed", extra=fields(error=repr(exc)))
        for job_id, record in self.held.records().items():
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
            held = self.held.drain()
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
        self.output_webhooks.close()
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
        return len(self.held)

    @property
    def dying(self) -> bool:
        """Whether the engine died: the worker claims no more jobs and is about to exit."""
        return self._dying

    # --- jobs ----------------------------------------------------------------------------------
    def run(self, job_id: str) -> None:
        """Run the delivered job, then those the thread takes from the queue (workers/job_runner.py)."""
        self._runner.run(job_id)

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

    # --- background ------------------------------------------------------------------------------
    def report_inflight(self) -> None:
        """Scale-in removes the pods with the lowest deletion cost first: keep ours = our load.
        Throttled inside; the heartbeat calls it too, so a throttled change is sent later."""
        if self._deletion_cost is not None:
            self._deletion_cost.update(self.inflight)

    def _held(self) -> list[str]:
        return self.held.ids()

    def _stop_if_held(self, job_id: str) -> None:
        """Stop generating a job (canceled through the API, or its lease lost) if it runs here."""
        if self.engine is not None and job_id in self.held:
            self.engine.cancel(job_id)
