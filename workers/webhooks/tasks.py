"""Webhook deliveries' Celery tasks, `genq.webhook.deliver(job_id, event)` and its batch twin
(`output` notices become delivery messages in workers/webhooks/output.py). What a delivery is,
and its claims, retries and ordering: workers/webhooks/delivery.py. A task thread whose delivery
ended goes on with the deliveries it takes from the queue itself: workers/webhooks/intake.py."""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable
from typing import Any

import redis
import redis.exceptions
from celery import Task, shared_task, signals
from celery.exceptions import Reject

from shared import keys, metrics, signing
from shared.logging import fields
from workers import context
from workers.store_retry import StoreUnavailable, retry_store_call
from workers.webhooks.client import AttemptResult
from workers.webhooks.delivery import (
    AttemptRecord,
    Claim,
    Deliveries,
    Delivery,
    DeliverySnapshot,
    log_entry,
)
from workers.webhooks.intake import ClaimedDelivery, DeliveryIntake, DeliveryMessage
from workers.webhooks.outcomes import Outcome, Verdict

log = logging.getLogger("genq.webhooks")

#: A hop that arrives this close to its due time makes the attempt instead of hopping again.
HOP_SLACK_S = 1.0


def _log(delivery: Delivery, attempt: int, result: AttemptResult, outcome: Verdict) -> None:
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


@functools.cache
def _intake() -> DeliveryIntake | None:
    """Where task threads take deliveries without a broker delivery (worker_take_queued). A worker
    that also runs a model takes only messages already waiting: a thread waiting on the webhook
    queue is one that could be running a job."""
    runtime = context.runtime()
    settings = runtime.settings
    if not settings.worker_take_queued:
        return None
    wait_s = settings.worker_take_wait_s if runtime.model_id is None else 0.0
    return DeliveryIntake(runtime.redis, _deliveries(), wait_s, runtime.closing)


def _deliver(task: Task, job_id: str, event: str, due_at: float | None = None) -> None:
    """Deliver one event of job `job_id`: one attempt per message, retried per the schedule;
    a message that arrives before `due_at` is a hop of a long wait (workers/webhooks/delivery.py). Then
    the deliveries this thread takes from the queue itself (_take_queued)."""
    _deliver_message(_delivered(task, Delivery.of(job_id, event, task.request.id)))
    _take_queued()


def _deliver_batch(task: Task, batch_id: str, event: str, due_at: float | None = None) -> None:
    """Deliver a batch's end (batch.completed, .failed, .expired, .cancelled): the same claims,
    retries, hops and signatures as a job's events."""
    _deliver_message(_delivered(task, Delivery.of_batch(batch_id, event)))
    _take_queued()


def _delivered(task: Task, delivery: Delivery) -> DeliveryMessage:
    request = task.request
    return DeliveryMessage(delivery, request.id, int(request.retries), dict(request.kwargs or {}))


def _deliver_message(message: DeliveryMessage) -> None:
    """Every store call waits out a Redis restart or a full Redis (workers/store_retry.py); past
    that, the message goes back on the queue rather than being acknowledged unused."""
    try:
        deliveries = _deliveries()
        delivery, generation = message.delivery, message.generation
        claim, held_until, snapshot = retry_store_call(
            lambda: deliveries.claim_and_look(delivery, generation)
        )
        if _claimed(deliveries, message, claim, held_until) and snapshot is not None:
            attempt_record = _attempt(deliveries, message, snapshot)
            retry_store_call(lambda: deliveries.record_attempt(attempt_record))
    except StoreUnavailable as exc:
        raise Reject(str(exc), requeue=True) from exc


def _take_queued() -> None:
    """Deliver what this thread takes from the webhook queue itself (workers/webhooks/intake.py),
    one after another, so that a delivery costs no broker delivery of its own (BRPOP, kombu's
    unacked record, task dispatch, ack), and its end is recorded in the next take's round trip.
    Ends when none came within the wait, on drain, when the store cannot be reached (a delivery it
    had claimed is then pushed again by the reaper once its lease runs out), or after half the
    visibility timeout (kombu would then hand this task's own message out again)."""
    intake = _intake()
    if intake is None:
        return
    until = time.monotonic() + context.runtime().settings.visibility_timeout_s / 2
    attempt_record: AttemptRecord | None = None
    try:
        while time.monotonic() < until:
            taken = intake.next(attempt_record)
            attempt_record = None  # recorded
            if taken is None:
                return
            attempt_record = _deliver_taken(taken)
    except (StoreUnavailable, redis.exceptions.RedisError) as exc:
        log.warning("webhook_take_stopped", extra=fields(error=str(exc) or type(exc).__name__))
    finally:
        _record_last_attempt(attempt_record)


def _deliver_taken(taken: ClaimedDelivery) -> AttemptRecord | None:
    """A message the take claimed (or found not to act on) goes on as a delivered one does; the
    end of its attempt, when it made one."""
    deliveries, message = _deliveries(), taken.message
    if _claimed(deliveries, message, taken.claim, taken.held_until) and taken.snapshot is not None:
        return _attempt(deliveries, message, taken.snapshot)
    return None


def _record_last_attempt(attempt_record: AttemptRecord | None) -> None:
    """Record an attempt that no take carried (the thread stopped taking). Recording it twice,
    when a take that failed had made it, only repeats its log entry; never recording it would
    repeat the attempt, once the reaper pushes the delivery again."""
    if attempt_record is None:
        return
    deliveries = _deliveries()
    try:
        retry_store_call(lambda: deliveries.record_attempt(attempt_record))
    except StoreUnavailable as exc:
        log.warning("webhook_end_unrecorded", extra=fields(error=str(exc)))


def _claimed(deliveries: Deliveries, message: DeliveryMessage, claim: Claim, held_until: float) -> bool:
    """Whether this message acts for its delivery; a copy that does not is dropped here (a copy of
    a message handed out again, or one for a delivery that already has its outcome), or comes
    back when the lease that holds its delivery ends (its holder may have died)."""
    if claim is Claim.CLAIMED:
        return True
    if claim is Claim.BUSY:
        _look_again_later(deliveries, message, held_until)
    delivery = message.delivery
    dropped = fields(job_id=delivery.job_id, webhook_event=delivery.event, generation=message.generation,
                     claim=claim)  # fmt: skip
    log.info("webhook_copy_dropped", extra=dropped)
    return False


def _attempt(deliveries: Deliveries, message: DeliveryMessage, snapshot: DeliverySnapshot) -> AttemptRecord:
    """One attempt of a claimed generation, or its wait (a hop not yet due, `completed` behind its
    `start`); then the end of the generation, for the caller to record."""
    delivery, generation, due_at = message.delivery, message.generation, message.due_at
    if due_at is not None and due_at - time.time() > HOP_SLACK_S:
        return _retry(deliveries, message, due_at - time.time(), snapshot.uncounted())
    wait = retry_store_call(lambda: deliveries.order_wait(delivery, snapshot))
    if wait is not None:
        return _retry(deliveries, message, wait, snapshot.uncounted())
    prepared = retry_store_call(lambda: deliveries.prepare(delivery, snapshot))
    if prepared is None:
        log.info("webhook_skipped", extra=fields(job_id=delivery.job_id, webhook_event=delivery.event))
        return deliveries.attempt_record(delivery, generation, {"outcome": Outcome.SKIPPED}, None)
    attempt, result = prepared.attempt, deliveries.attempt(delivery, prepared)
    outcome = deliveries.conclude(delivery, attempt, result)
    _log(delivery, attempt, result, outcome)
    metrics.WEBHOOK_ATTEMPTS.labels(delivery.event, outcome.outcome).inc()
    metrics.WEBHOOK_DURATION.observe(result.duration_ms / 1000)
    state: dict[str, str] = {"outcome": Outcome.PENDING if outcome.retry_in is not None else outcome.outcome}
    entry = log_entry(delivery, attempt, result, outcome)
    if outcome.retry_in is None:
        return deliveries.attempt_record(delivery, generation, state, entry)
    state["next_at"] = repr(time.time() + outcome.retry_in)
    return _retry(deliveries, message, outcome.retry_in, state, entry)


def _look_again_later(deliveries: Deliveries, message: DeliveryMessage, held_until: float) -> None:
    """Publish this message again, same generation, for when the lease that holds it ends."""
    countdown = max(0.0, held_until - time.time()) + 1
    delivery, task_id, generation = message.delivery, message.task_id, message.generation
    retry_store_call(
        lambda: deliveries.publish(delivery, task_id, generation, countdown, dict(message.kwargs))
    )


def _retry(
    deliveries: Deliveries,
    message: DeliveryMessage,
    countdown: float,
    fields: dict[str, str],
    entry: dict[str, Any] | None = None,
) -> AttemptRecord:
    # Publish the next generation before this one's end is recorded: a crash in between repeats
    # this attempt (its claim's lease runs out) instead of losing the delivery. A wait longer than
    # a hop carries its due time; a shorter one drops any it had. This message is then acknowledged.
    hop_s = deliveries.max_hop_s
    hop = {"due_at": time.time() + countdown} if countdown > hop_s else {}
    delivery, task_id, generation = message.delivery, message.task_id, message.generation
    retry_store_call(
        lambda: deliveries.publish(delivery, task_id, generation + 1, min(countdown, hop_s), hop)
    )
    return deliveries.attempt_record(delivery, generation, fields, entry)


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
