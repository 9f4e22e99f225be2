"""Webhook deliveries' Celery tasks, `genq.webhook.deliver(job_id, event)` and its batch twin,
and the `output` notifier. What a delivery is, and its claims, retries and ordering:
workers/deliveries.py."""

from __future__ import annotations

import functools
import logging
import math
import queue
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

import redis
import redis.exceptions
from celery import Task, shared_task, signals
from celery.exceptions import Reject

from shared import keys, metrics, signing
from shared.config import Settings
from shared.ids import new_id
from shared.logging import fields
from shared.schemas import WebhookEvent
from workers import context, webhook_http
from workers.deliveries import Claim, Deliveries, Delivery, log_entry, publish
from workers.patience import StoreUnavailable, patiently
from workers.verdicts import Outcome, Verdict

log = logging.getLogger("genq.webhooks")

#: A hop that arrives this close to its due time makes the attempt instead of hopping again.
HOP_SLACK_S = 1.0
#: Least seconds between two `output` deliveries of one job.
OUTPUT_INTERVAL_S = 1.0


def _log(delivery: Delivery, attempt: int, result: webhook_http.AttemptResult, outcome: Verdict) -> None:
    # Never the body (it holds the prompt and output) and never the secret.
    line = fields(
        job_id=delivery.job_id,
        webhook_event=delivery.event,
        webhook_id=delivery.webhook_id,
        attempt=attempt,
        outcome=outcome.outcome,
        status_code=result.status_code,
        error=result.error,
        duration_ms=result.duration_ms,
    )
    level = logging.INFO if outcome.outcome in (Outcome.DELIVERED, Outcome.RETRYING) else logging.WARNING
    log.log(level, "webhook_attempt", extra=line)


@functools.cache
def _deliveries() -> Deliveries:
    runtime = context.runtime()
    return Deliveries(runtime.redis, runtime.settings)


def _deliver(task: Task, job_id: str, event: str, due_at: float | None = None) -> None:
    """Deliver one event of job `job_id`: one attempt per message, retried per the schedule;
    a message that arrives before `due_at` is a hop of a long wait (see the module docstring)."""
    _deliver_patiently(task, Delivery.of(job_id, event, task.request.id), due_at)


def _deliver_batch(task: Task, batch_id: str, event: str, due_at: float | None = None) -> None:
    """Deliver a batch's end (batch.completed, .failed, .expired, .cancelled): the same claims,
    retries, hops and signatures as a job's events."""
    _deliver_patiently(task, Delivery.of_batch(batch_id, event), due_at)


def _deliver_patiently(task: Task, delivery: Delivery, due_at: float | None) -> None:
    """Every store call waits out a Redis restart or a full Redis (workers/patience.py); past
    that, the message goes back on the queue rather than being acknowledged unused."""
    try:
        _deliver_once(task, delivery, due_at)
    except StoreUnavailable as exc:
        raise Reject(str(exc), requeue=True) from exc


def _deliver_once(task: Task, delivery: Delivery, due_at: float | None) -> None:
    deliveries = _deliveries()
    generation = int(task.request.retries)
    claim, held_until, sight = patiently(lambda: deliveries.claim_and_look(delivery, generation))
    if claim is Claim.BUSY:  # maybe its holder died: look again when the holder's lease ends
        _look_again_later(task, deliveries, delivery, generation, held_until)
    if claim is not Claim.CLAIMED:
        # A copy of a message the broker handed out again (see the module docstring), or a
        # message for a delivery that already has its outcome: nothing to do.
        dropped = fields(
            job_id=delivery.job_id, webhook_event=delivery.event, generation=generation, claim=claim
        )
        log.info("webhook_copy_dropped", extra=dropped)
        return
    if due_at is not None and due_at - time.time() > HOP_SLACK_S:
        _retry_then_record(task, deliveries, delivery, generation, due_at - time.time(), {})
        return
    wait = patiently(lambda: deliveries.order_wait(delivery, sight))
    if wait is not None:
        _retry_then_record(task, deliveries, delivery, generation, wait, {})
        return
    prepared = patiently(lambda: deliveries.prepare(delivery, sight))
    if prepared is None:
        log.info("webhook_skipped", extra=fields(job_id=delivery.job_id, webhook_event=delivery.event))
        patiently(lambda: deliveries.record(delivery, generation, {"outcome": Outcome.SKIPPED}, None))
        return
    attempt, result = prepared.attempt, deliveries.attempt(delivery, prepared)
    outcome = deliveries.conclude(delivery, attempt, result)
    _log(delivery, attempt, result, outcome)
    metrics.WEBHOOK_ATTEMPTS.labels(delivery.event, outcome.outcome).inc()
    metrics.WEBHOOK_DURATION.observe(result.duration_ms / 1000)
    state: dict[str, str] = {"outcome": Outcome.PENDING if outcome.retry_in is not None else outcome.outcome}
    entry = log_entry(delivery, attempt, result, outcome)
    if outcome.retry_in is None:
        patiently(lambda: deliveries.record(delivery, generation, state, entry))
        return
    state["next_at"] = repr(time.time() + outcome.retry_in)
    _retry_then_record(task, deliveries, delivery, generation, outcome.retry_in, state, entry)


def _look_again_later(
    task: Task, deliveries: Deliveries, delivery: Delivery, generation: int, held_until: float
) -> None:
    """Publish this message again, same generation, for when the lease that holds it ends."""
    countdown = max(0.0, held_until - time.time()) + 1
    kwargs = dict(task.request.kwargs or {})
    patiently(lambda: deliveries.publish(delivery, task.request.id, generation, countdown, kwargs))


def _retry_then_record(
    task: Task,
    deliveries: Deliveries,
    delivery: Delivery,
    generation: int,
    countdown: float,
    fields: dict[str, str],
    entry: dict[str, Any] | None = None,
) -> None:
    # Publish the next generation first: a crash before the record below repeats this attempt
    # (its claim's lease runs out) instead of losing the delivery. A wait longer than a hop
    # carries its due time; a shorter one drops any it had. This message is then acknowledged.
    hop_s = deliveries.max_hop_s
    hop = {"due_at": time.time() + countdown} if countdown > hop_s else {}
    task_id = task.request.id
    patiently(lambda: deliveries.publish(delivery, task_id, generation + 1, min(countdown, hop_s), hop))
    patiently(lambda: deliveries.record(delivery, generation, fields, entry))


def _delivery_task(name: str, run: Callable[..., None]) -> Task:
    """A delivery task on the webhooks queue (registered when this module is imported; see
    workers/worker.py): acknowledged late, so a worker that dies mid-attempt leaves its message."""
    return shared_task(
        bind=True,
        name=name,
        queue=keys.WEBHOOK_QUEUE,
        acks_late=True,
        reject_on_worker_lost=True,
        max_retries=None,
        ignore_result=True,
    )(run)


deliver = _delivery_task(keys.WEBHOOK_TASK, _deliver)
deliver_batch = _delivery_task(keys.BATCH_WEBHOOK_TASK, _deliver_batch)


def _warn_at_start(sender: Any = None, **_: Any) -> None:
    """A worker consuming the webhooks queue says when its deliveries are less safe than usual."""
    consumed = getattr(getattr(getattr(sender, "app", None), "amqp", None), "queues", None)
    if consumed is not None and keys.WEBHOOK_QUEUE not in consumed.consume_from:
        return
    settings = context.runtime().settings
    if settings.webhook_allow_private:
        message = (
            "GENQ_WEBHOOK_ALLOW_PRIVATE is on: webhooks may reach loopback, private and link-local "
            "addresses on any port"
        )
        log.warning("webhook_ssrf_guard_lifted", extra=fields(message=message))
    if settings.webhook_secret is None:
        message = "GENQ_WEBHOOK_SECRET is unset: webhook deliveries are sent without signatures"
        log.warning("webhook_unsigned", extra=fields(message=message))
    else:
        signing.parse_secrets(settings.webhook_secret.get_secret_value())  # fail at start, not per delivery


signals.worker_ready.connect(_warn_at_start, weak=False)


def wants_output(job_input: Mapping[str, Any]) -> bool:
    """Whether a job (its input, as stored) has a webhook whose filter holds `output`."""
    return bool(job_input.get("webhook")) and WebhookEvent.OUTPUT in (
        job_input.get("webhook_events_filter") or []
    )


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

    def follow(self, job_id: str, job_input: Mapping[str, Any]) -> None:
        if wants_output(job_input):
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
