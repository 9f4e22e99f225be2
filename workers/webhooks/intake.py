"""Delivery messages taken by a task thread whose delivery ended, without a broker delivery of
its own (what workers/intake.py does for jobs).

shared/jobqueue/lua/webhook_take.lua pops a waiting message and claims its delivery's generation in one
script, so no message is out of the list without a lease the reaper watches. With none waiting,
the thread waits on the list itself (BRPOP, up to worker_take_wait_s) and hands what it gets to
the same script; a worker that dies in between leaves the delivery pending, and the reaper pushes
its message again. Only due first-hand messages are taken: one with an eta (a retry, a hop) goes
back, and the take ends, for Celery's consumer.

The same script first records the thread's previous attempt (an AttemptRecord) and, once the
claim is made, reads what the attempt needs (a DeliverySnapshot), counting the attempt when its
payload is built already: such a delivery costs this one round trip."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

import redis

from shared import keys
from shared.jobqueue import scripts
from shared.jobqueue.kombu_layout import read_task
from shared.schemas import WebhookEvent
from workers.webhooks.delivery import (
    START_MESSAGE_FIELD,
    WEBHOOK_LIST,
    AttemptRecord,
    Claim,
    Deliveries,
    Delivery,
    DeliverySnapshot,
    claimed,
)


@dataclass(frozen=True, slots=True)
class DeliveryMessage:
    """A delivery message as a task thread acts on it: one Celery delivered, or one it took."""

    delivery: Delivery
    #: The Celery task id (every generation of a delivery keeps it).
    task_id: str
    #: Celery's retry count: which attempt-in-waiting of the delivery this message is.
    generation: int
    #: The message's keyword arguments (`due_at`: the due time of a hop's attempt).
    kwargs: dict[str, Any] = field(default_factory=dict)

    @property
    def due_at(self) -> float | None:
        due_at = self.kwargs.get("due_at")
        return float(due_at) if due_at is not None else None

    @classmethod
    def parse(cls, raw: bytes | str) -> DeliveryMessage:
        """A delivery task's message as kombu's Redis transport holds it (shared/jobqueue/kombu_layout.py)."""
        call = read_task(raw)
        args = call.args
        if call.task == keys.BATCH_WEBHOOK_TASK:
            delivery = Delivery.of_batch(str(args[0]), str(args[1]))
        else:
            delivery = Delivery.of(str(args[0]), str(args[1]), call.task_id)
        return cls(delivery, call.task_id, call.retries, call.kwargs)


@dataclass(frozen=True, slots=True)
class ClaimedDelivery:
    """A delivery message taken from the list, with what claiming its generation said (CLAIMED, or
    why not) and what its attempt reads (read in the same script when claimed)."""

    message: DeliveryMessage
    claim: Claim
    #: The end of the lease that decided the claim (this thread's own when CLAIMED).
    held_until: float
    #: What the attempt needs to know; None unless CLAIMED.
    snapshot: DeliverySnapshot | None = None


class DeliveryIntake:
    def __init__(
        self, client: redis.Redis, deliveries: Deliveries, wait_s: float, closing: threading.Event
    ) -> None:
        self._redis = client
        self._deliveries = deliveries
        self._wait_s = wait_s
        self._closing = closing
        self._take = scripts.Script(client, "webhook_take")
        #: The labels the latest takes (any thread's) named for the next, oldest first (a dict as
        #: an ordered set): a thread's next message is one that another thread's take saw next in line.
        self._hints: dict[str, None] = {}
        #: The owners of the deliveries taken last, oldest first (a dict as an ordered set).
        self._owners: dict[str, None] = {}

    def next(self, attempt_record: AttemptRecord | None = None) -> ClaimedDelivery | None:
        """The next due delivery message, its generation claimed when it could be: one waiting
        now, else the first to come within wait_s; None when none came, the worker is closing,
        or the next message is not one to take (it stays first in line, for Celery's consumer).
        `attempt_record`, the end of the delivery this thread just made, is made first, in the same
        round trip: once next() returns, it is recorded."""
        if self._closing.is_set():
            if attempt_record is not None:
                self._deliveries.record_attempt(attempt_record)
            return None
        reply = self._take_one("", attempt_record)
        if reply or self._wait_s <= 0:
            return _claimed_delivery(reply)
        popped = self._redis.brpop([WEBHOOK_LIST], timeout=self._wait_s)
        if popped is None:
            return None
        message = _text(popped[1])
        if self._closing.is_set():
            self._redis.rpush(WEBHOOK_LIST, message)
            return None
        return _claimed_delivery(self._take_one(message))

    def _take_one(self, popped: str, attempt_record: AttemptRecord | None = None) -> list[Any]:
        """The take script's reply for `popped`, or for the list's next message when "", after
        `attempt_record` is recorded (see shared/jobqueue/lua/webhook_take.lua). A take that asks for the
        keys its message names hands the message over (popped): the take is made again with it and
        those keys, recording nothing more (scripts.ROUNDS times at most; then the message goes
        back first in line and it took nothing)."""
        names = [keys.WEBHOOK_TASK, keys.BATCH_WEBHOOK_TASK, *EVENT_NAMES, START_MESSAGE_FIELD]
        labels = [*self._known_labels(), *message_labels(popped)] if popped else self._known_labels()
        for _ in range(scripts.ROUNDS):
            args = [*self._deliveries.lease_args(), *names, popped, TAKE_HINTS]
            if attempt_record is None:
                reply = list(self._take(args=args, labels=labels))
            else:
                reply = list(
                    self._take(keys=attempt_record.keys, args=[*args, *attempt_record.args], labels=labels)
                )
            if not reply or _text(reply[0]) != NEED_REPLY:
                return self._learn(reply)
            # the message asked about is the thread's now (the script popped one it peeked)
            popped = _text(reply[1])
            attempt_record, labels = None, [*labels, *(_text(name) for name in reply[2:])]
        if popped:  # the thread's message goes back first in line, for Celery's consumer
            self._redis.rpush(WEBHOOK_LIST, popped)
        return []

    def _known_labels(self) -> list[str]:
        """Keys a take declares before it asks: those of the messages next in line at the latest
        takes, and the signing secrets of the owners whose deliveries were taken lately (a frozen
        delivery's owner is known only once its state is read)."""
        labels = list(self._hints)
        for owner in list(self._owners):
            labels += [
                scripts.label("webhook_secret_key", owner),
                scripts.label("webhook_previous_secret_key", owner),
            ]
        return labels

    def _learn(self, reply: list[Any]) -> list[Any]:
        """A take's reply less the labels it named for the next take (kept among the recent ones,
        for every thread), the claimed delivery's owner kept among the recent ones."""
        if len(reply) < 4:
            return reply
        hints = _text(reply.pop(3))
        for hint in hints.split("\n") if hints else ():
            self._hints.pop(hint, None)
            self._hints[hint] = None
        while len(self._hints) > RECENT_HINTS:
            self._hints.pop(next(iter(self._hints)), None)
        claimed = _claimed_delivery(reply)
        if claimed is not None and claimed.snapshot is not None and claimed.snapshot.payload is not None:
            owner = claimed.snapshot.payload.owner
            self._owners.pop(owner, None)
            self._owners[owner] = None
            while len(self._owners) > RECENT_OWNERS:
                self._owners.pop(next(iter(self._owners)), None)
        return reply


#: A take's reply that asks for keys (shared/jobqueue/lua/webhook_take.lua).
NEED_REPLY = "!need"
#: Messages next in line whose keys a claimed take names for the thread's next take.
TAKE_HINTS = 2
#: Owners whose signing secrets every take declares: those of the deliveries taken last.
RECENT_OWNERS = 8
#: Labels of the latest takes' hints every take declares: the keys of a few takes' next messages.
RECENT_HINTS = 8 * TAKE_HINTS * 3

#: The events the take script tells apart: `output` (a delivery per notice), `completed` (reads
#: its job's `start` delivery) and `start`.
EVENT_NAMES = [WebhookEvent.OUTPUT, WebhookEvent.COMPLETED, WebhookEvent.START]


def message_labels(raw: str) -> list[str]:
    """Labels of the keys a delivery message names, as webhook_take.lua finds them (its delivery's
    state, its record's, and for a job's `completed` its `start` delivery's): a message the thread
    popped itself is declared with its first take, which then need not ask for them. None for a
    message that is not a delivery message (the take sends it back)."""
    try:
        return _delivery_labels(DeliveryMessage.parse(raw).delivery)
    except (KeyError, ValueError, IndexError, TypeError):  # not a delivery message; a label refused
        return []


def _delivery_labels(delivery: Delivery) -> list[str]:
    if delivery.batch:
        return [
            scripts.label("batch_webhook_delivery_key", delivery.job_id, delivery.name),
            scripts.label("batch_key", delivery.job_id),
        ]
    labels = [
        scripts.label("webhook_delivery_key", delivery.job_id, delivery.name),
        scripts.label("job_key", delivery.job_id),
    ]
    if delivery.follows_start:
        labels.append(scripts.label("webhook_delivery_key", delivery.job_id, WebhookEvent.START))
    return labels


def _claimed_delivery(reply: list[Any]) -> ClaimedDelivery | None:
    """The ClaimedDelivery of a take script's reply; None for an empty list or a message that went back."""
    if len(reply) < 3:
        return None
    outcome, held_until, message, *looked = reply
    claim, lease_end, snapshot = claimed([outcome, held_until, *looked])
    return ClaimedDelivery(DeliveryMessage.parse(_text(message)), claim, lease_end, snapshot)


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
