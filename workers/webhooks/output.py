"""`output` notices turned into deliveries: at most one `output` delivery per second per job, sent
by a daemon thread of the worker that runs the job, so the engine's hook never waits on Redis."""

from __future__ import annotations

import logging
import math
import queue
import threading
import time

import redis

from shared.config import Settings
from shared.ids import new_id
from shared.jobspec import JobSpec
from shared.logging import fields
from shared.schemas import WebhookEvent
from workers.webhooks.delivery import Delivery, publish

log = logging.getLogger("genq.webhooks")

#: Least seconds between two `output` deliveries of one job.
OUTPUT_INTERVAL_S = 1.0


def wants_output(spec: JobSpec) -> bool:
    """Whether a job (its spec, as stored) has a webhook whose filter holds `output`."""
    return spec.webhook is not None and WebhookEvent.OUTPUT in spec.webhook_events_filter


class OutputWebhooks:
    """Turns "new text for job X" into at most one `output` delivery per second per job.

    The worker follows each job it runs, with the input it claimed (`follow`; the input is never
    read back from Redis for this), until it ends (`forget`); `on_output` for a job whose webhook
    filter does not hold `output` (wants_output), or that is not followed, does nothing. Else it
    only puts the id on an in-memory queue (it never blocks on Redis and never raises); a daemon
    thread sends a delivery message at most every OUTPUT_INTERVAL_S per job: a call inside the
    interval is not dropped but sent when the interval ends, so the receiver always sees the latest
    state within a second.
    """

    def __init__(self, client: redis.Redis, settings: Settings) -> None:
        self._redis = client
        self._settings = settings
        self._inbox: queue.Queue[str] = queue.Queue(maxsize=10_000)
        self._due: dict[str, float] = {}
        self._last_sent: dict[str, float] = {}
        self._thread: threading.Thread | None = None
        self._start_lock = threading.Lock()
        self._stopped = threading.Event()
        #: The followed jobs that want `output` deliveries.
        self._hooked: set[str] = set()

    def follow(self, job_id: str, spec: JobSpec) -> None:
        if wants_output(spec):
            self._hooked.add(job_id)

    def forget(self, job_id: str) -> None:
        self._hooked.discard(job_id)

    def on_output(self, job_id: str) -> None:
        if job_id not in self._hooked:
            return
        try:
            self._ensure_thread()
            self._inbox.put_nowait(job_id)
        except Exception:  # the engine's hook must never fail because of a webhook
            log.warning("webhook_output_dropped", exc_info=True, extra=fields(job_id=job_id))

    def close(self) -> None:
        self._stopped.set()

    def _ensure_thread(self) -> None:
        with self._start_lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name="genq-output-webhooks", daemon=True)
                self._thread.start()

    def _loop(self) -> None:
        while not self._stopped.is_set():
            try:
                job_id: str | None = self._inbox.get(timeout=self._next_due_in())
            except queue.Empty:
                job_id = None
            try:
                if job_id is not None:
                    self._note(job_id)
                self._send_due()
            except Exception:  # a Redis outage must not end the thread
                log.warning("webhook_output_failed", exc_info=True, extra=fields(job_id=job_id))
                time.sleep(0.5)

    def _next_due_in(self) -> float:
        if not self._due:
            return 1.0
        return min(1.0, max(0.0, min(self._due.values()) - time.monotonic()))

    def _note(self, job_id: str) -> None:
        if job_id in self._due:
            return
        self._due[job_id] = max(time.monotonic(), self._last_sent.get(job_id, -math.inf) + OUTPUT_INTERVAL_S)

    def _send_due(self) -> None:
        now = time.monotonic()
        for job_id in [j for j, due in self._due.items() if due <= now]:
            del self._due[job_id]
            task_id = new_id()
            delivery = Delivery.of(job_id, WebhookEvent.OUTPUT, task_id)
            publish(self._redis, delivery, task_id, 0, 0.0, {}, self._settings.job_ttl_s)
            self._last_sent[job_id] = now
        # Only sends within the last interval still hold a job back; forget the others.
        for job_id in [j for j, sent in self._last_sent.items() if now - sent > OUTPUT_INTERVAL_S]:
            del self._last_sent[job_id]
