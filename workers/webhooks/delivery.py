"""Webhook delivery state: claims, attempt records, retries published, payloads built once.

A delivery is one event of one job (`start`, `completed`, one `output` notice) or of a batch. Its
state lives in Redis (DELIVERY below): its payload, built before the first attempt so every retry
sends the same bytes under the same webhook-id (a job's `completed` by the worker that finishes
the job, workers/webhooks/bodies.py; any other by its first attempt, prepare()); the attempt
count; the outcome; and a claim.

Retries: a failed attempt publishes the next generation's message (as Celery's `self.retry`
would) before its own end is recorded, so a crash in between repeats an attempt rather than
losing the delivery. A retry delay longer than half the visibility timeout is made of hops (a
message that carries its due time in `due_at`), so the broker never hands a waiting message out
twice. The reaper re-pushes a message the broker lost (shared/jobqueue/lua/reap_delivery.lua).

Claims: each message carries its generation, and may act only for a generation newer than the
delivery's, or take its own over once its holder's lease (an attempt timeout plus a margin) ran
out; every other copy is dropped, so each attempt runs once. `completed` waits while the job's
`start` delivery is pending. The scripts: shared/jobqueue/lua/webhook_claim.lua and webhook_record.lua
(common.lua), and workers/webhooks/intake.py for a task thread that takes its next delivery itself."""

from __future__ import annotations

import datetime
import enum
import math
import time
from dataclasses import dataclass
from typing import Any

import orjson
import redis

from shared import key_secrets, keys, signing
from shared.config import Settings
from shared.jobqueue import scripts
from shared.jobqueue.kombu_layout import task_message
from shared.jobqueue.records import rfc3339
from shared.schemas import WebhookEvent
from workers.webhooks.bodies import WebhookPayload, batch_event, job_event
from workers.webhooks.client import AttemptResult, post
from workers.webhooks.outcomes import FINAL_OUTCOMES, JITTER_FRACTION, Verdict, retry_delays, verdict

DELIVERY = keys.WEBHOOK_DELIVERY
#: The job record's field that holds its `start` delivery's message until it is sent.
START_MESSAGE_FIELD = keys.webhook_message_field(WebhookEvent.START)
#: The broker's list of the webhook queue (deliveries are all published at priority 0).
WEBHOOK_LIST = keys.queue_key(keys.WEBHOOK_QUEUE, 0)


class Claim(enum.StrEnum):
    """What CLAIM_LUA says of a message (see there)."""

    CLAIMED = "claimed"
    OVER = "over"
    STALE = "stale"
    BUSY = "busy"


#: How soon `completed` looks again at a pending `start` with no retry scheduled yet.
ORDER_RECHECK_S = 1.0
#: A claim outlives the attempt timeout by this much before another copy may take it over.
LEASE_MARGIN_S = 30.0


@dataclass(frozen=True, slots=True)
class Delivery:
    #: The job the event is about; for a batch event (`batch`), the batch.
    job_id: str
    event: str
    #: "start", "completed", or "output:<task id>" (a job has many output deliveries); a batch
    #: event's own name ("batch.completed", ...).
    name: str
    batch: bool = False

    @classmethod
    def of(cls, job_id: str, event: str, task_id: str) -> Delivery:
        return cls(job_id, event, f"output:{task_id}" if event == WebhookEvent.OUTPUT else event)

    @classmethod
    def of_batch(cls, batch_id: str, event: str) -> Delivery:
        return cls(batch_id, event, event, batch=True)

    @property
    def key(self) -> str:
        if self.batch:
            return keys.BATCH_WEBHOOK_DELIVERY.format(batch_id=self.job_id, event=self.name)
        return DELIVERY.format(job_id=self.job_id, delivery=self.name)

    @property
    def task(self) -> str:
        """The Celery task that delivers it."""
        return keys.BATCH_WEBHOOK_TASK if self.batch else keys.WEBHOOK_TASK

    @property
    def follows_start(self) -> bool:
        """A job's `completed` is sent after its `start` (when the job asked for both)."""
        return self.event == WebhookEvent.COMPLETED and not self.batch

    @property
    def log_key(self) -> str:
        return keys.batch_webhook_log(self.job_id) if self.batch else keys.webhook_log(self.job_id)

    @property
    def record_key(self) -> str:
        """The record the delivery's state lives as long as (the job's, or the batch's)."""
        return keys.batch(self.job_id) if self.batch else keys.job(self.job_id)

    @property
    def webhook_id(self) -> str:
        # Stable across retries and redeliveries; receivers deduplicate on it.
        return f"msg_{self.job_id}_{self.name.replace(':', '_')}"


@dataclass(frozen=True, slots=True)
class Prepared:
    """What one attempt sends, and what Deliveries.prepare() read for it in one round trip."""

    payload: WebhookPayload
    #: This attempt's number (1 for the first).
    attempt: int
    #: The owner's signing secrets as MGET read them (shared/key_secrets.py signing_keys).
    stored_secrets: list[object]


@dataclass(frozen=True, slots=True)
class AttemptRecord:
    """How a generation ends (Deliveries.attempt_record), as webhook_record.lua takes it: its outcome
    recorded, its attempt logged, its claim released."""

    keys: list[str]
    args: list[str | int | bytes]


@dataclass(frozen=True, slots=True)
class DeliverySnapshot:
    """What an attempt reads of its delivery when it claims it (look_delivery in
    shared/jobqueue/lua/common.lua), for order_wait() and prepare()."""

    #: The job's (or batch's) record; empty when it expired. With a frozen body, only its `input`
    #: (all that attempt reads of it: order_wait's webhook filter).
    record: dict[str, str]
    #: The URL and body frozen for it (by an earlier attempt, or by the worker that finished the
    #: job); None before that.
    payload: WebhookPayload | None
    #: For a job's `completed`: whether the job record still holds its `start` message (never
    #: sent), and that delivery's outcome and next attempt.
    start_never_sent: bool = False
    start_outcome: str | None = None
    start_next_at: str | None = None
    #: With a frozen body: the attempt the claim counted, and the owner's signing secrets it read
    #: (prepare() then needs no round trip); None otherwise.
    counted: Prepared | None = None

    def uncounted(self) -> dict[str, str]:
        """The fields that set the claim's count back, for a generation that made no attempt (a wait)."""
        return {"attempts": str(self.counted.attempt - 1)} if self.counted else {}


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def claimed(reply: list[Any]) -> tuple[Claim, float, DeliverySnapshot | None]:
    """The claim's outcome, the end of the lease that decided it, and the snapshot, of a reply of
    common.lua's claim_and_look (webhook_claim.lua, or webhook_take.lua without its message)."""
    outcome, held_until, *looked = reply
    return Claim(_text(outcome)), float(_text(held_until)), snapshot_of(looked[0]) if looked else None


def snapshot_of(looked: list[Any]) -> DeliverySnapshot:
    """The snapshot of what look_delivery (shared/jobqueue/lua/common.lua) read."""
    (url, body, owner), flat_record, start_never_sent, start_state, counted = looked
    pairs = zip(flat_record[::2], flat_record[1::2], strict=True)
    record = {_text(name): _text(value) for name, value in pairs}
    known = url is not None and body is not None
    payload = WebhookPayload(_text(url), _text(body).encode(), _text(owner or "")) if known else None
    start_outcome, start_next_at = start_state or (None, None)
    prepared = None
    if payload is not None and counted:
        attempt, stored_secrets = counted
        prepared = Prepared(payload, int(attempt), list(stored_secrets))
    return DeliverySnapshot(record, payload, bool(start_never_sent), start_outcome, start_next_at, prepared)


def publish(
    client: redis.Redis,
    delivery: Delivery,
    task_id: str,
    generation: int,
    countdown: float,
    kwargs: dict[str, float],
    ttl_s: int,
) -> None:
    """Put a message for `delivery` on the webhook queue and index the delivery as pending, in
    one transaction: the reaper finds the message again by what is written here."""
    now = datetime.datetime.now(datetime.UTC)
    eta = now + datetime.timedelta(seconds=countdown) if countdown > 0 else None
    args = [delivery.job_id, delivery.event]
    message = task_message(delivery.task, task_id, args, keys.WEBHOOK_QUEUE, 0, retries=generation,
                           kwargs=kwargs, eta=eta)  # fmt: skip
    pipe = client.pipeline(transaction=True)
    pipe.lpush(WEBHOOK_LIST, message)
    pipe.hset(delivery.key, "message", message)
    pipe.expire(delivery.key, ttl_s)
    pipe.zadd(keys.WEBHOOK_PENDING, {delivery.key: time.time() + scripts.ORPHAN_CHECK_S})
    pipe.execute()


class Deliveries:
    """Delivery state and attempts (blocking; called from Celery task threads)."""

    def __init__(self, client: redis.Redis, settings: Settings) -> None:
        self._redis = client
        self._settings = settings
        secret = settings.webhook_secret
        self._secrets = signing.parse_secrets(secret.get_secret_value()) if secret else ()
        self._delays = retry_delays(settings)
        #: The longest a delivery message waits for its eta: half the visibility timeout.
        self.max_hop_s = settings.visibility_timeout_s / 2
        self._claim = scripts.Script(client, "webhook_claim")
        self._record = scripts.Script(client, "webhook_record")

    # --- claims and records -------------------------------------------------------------------
    def claim_and_look(
        self, delivery: Delivery, generation: int
    ) -> tuple[Claim, float, DeliverySnapshot | None]:
        """Claim `generation` of `delivery` (what the outcome means: Claim) and, when claimed,
        read what its attempt needs, in one script: the outcome, the end of the lease that
        decided it, and the delivery's snapshot (None unless claimed)."""
        state_keys = [delivery.key, delivery.record_key]
        if delivery.follows_start:  # its reads include the job's `start` delivery
            state_keys.append(Delivery.of(delivery.job_id, WebhookEvent.START, "").key)
        reply = self._claim(keys=state_keys, args=[*self._claim_args(generation), START_MESSAGE_FIELD])
        return claimed(reply)

    def _claim_args(self, generation: int) -> list[int | str]:
        return [generation, *self.lease_args()]

    def lease_args(self) -> list[int | str]:
        """A claim's now, lease end (one attempt's timeout and a margin away) and ttl (the
        state's, when its record has no expiry), as the claim scripts take them."""
        now = time.time()
        lease = now + self._settings.webhook_timeout_s + LEASE_MARGIN_S
        return [repr(now), repr(lease), self._settings.job_ttl_s]

    def attempt_record(
        self, delivery: Delivery, generation: int, fields: dict[str, str], entry: dict[str, Any] | None
    ) -> AttemptRecord:
        """The end of this generation, to record with record_attempt() or with a thread's next take
        (workers/webhooks/intake.py): release the claim, set fields, append the attempt to the log
        (shared/jobqueue/lua/common.lua record_delivery)."""
        flat = [item for pair in fields.items() for item in pair]
        drop_body = "1" if fields.get("outcome") in FINAL_OUTCOMES else "0"
        log_entry = orjson.dumps(entry) if entry is not None else ""
        state_keys = [delivery.key, delivery.log_key, keys.WEBHOOK_PENDING, delivery.record_key]
        return AttemptRecord(state_keys, [generation, self._settings.job_ttl_s, log_entry, drop_body, *flat])

    def record_attempt(self, attempt_record: AttemptRecord) -> None:
        self._record(keys=attempt_record.keys, args=attempt_record.args)

    def publish(
        self, delivery: Delivery, task_id: str, generation: int, countdown: float, kwargs: dict[str, float]
    ) -> None:
        """Publish `delivery`'s message for `generation`, due in `countdown` seconds."""
        publish(self._redis, delivery, task_id, generation, countdown, kwargs, self._ttl(delivery))

    def _ttl(self, delivery: Delivery) -> int:
        """The job's (or batch's) remaining TTL: delivery state and log live as long as it."""
        remaining_ms = int(self._redis.pttl(delivery.record_key))
        return math.ceil(remaining_ms / 1000) if remaining_ms > 0 else self._settings.job_ttl_s

    # --- ordering -------------------------------------------------------------------------------
    def order_wait(self, delivery: Delivery, snapshot: DeliverySnapshot) -> float | None:
        """For `completed`: seconds to wait while the job's `start` delivery is pending, or None."""
        if not delivery.follows_start:
            return None
        job_input = snapshot.record.get("input")
        wanted = WebhookEvent.START in (orjson.loads(job_input or "{}").get("webhook_events_filter") or [])
        # The start message is still in the job record: the job ended without running, so no
        # start will ever be sent.
        if (
            not wanted
            or snapshot.start_never_sent
            or snapshot.start_outcome in FINAL_OUTCOMES
            or self._waited_too_long(delivery)
        ):
            return None
        return max(ORDER_RECHECK_S, float(snapshot.start_next_at or 0) - time.time() + ORDER_RECHECK_S)

    def _waited_too_long(self, delivery: Delivery) -> bool:
        """A start delivery runs its whole schedule in a bounded time; past that (its state was
        lost), `completed` stops waiting rather than wait forever."""
        self._redis.hsetnx(delivery.key, "waiting_since", repr(time.time()))
        since = float(self._redis.hget(delivery.key, "waiting_since") or time.time())
        per_attempt = self._settings.webhook_timeout_s + LEASE_MARGIN_S
        bound = sum(self._delays) * (1 + JITTER_FRACTION) + per_attempt * (len(self._delays) + 1) + 60
        return time.time() - since > bound

    # --- one attempt ----------------------------------------------------------------------------
    def prepare(self, delivery: Delivery, snapshot: DeliverySnapshot) -> Prepared | None:
        """What this attempt sends: the claim counted it and read the keys when the body was
        frozen already (no round trip); else freeze the delivery's URL and body (its first
        attempt), count the attempt and read its owner's signing keys, in one round trip. None
        when there is nothing to send (the job record expired, or an `output` notice found the
        job already over: its `completed` delivery carries the final state)."""
        if snapshot.counted is not None:  # the claim counts whenever it saw a frozen body
            return snapshot.counted
        wanted = self._build_payload(delivery, snapshot)
        if wanted is None:
            return None
        pipe = self._redis.pipeline(transaction=True)
        # HSETNX: a copy that froze its body since the claim read none (it took the attempt over) keeps it
        pipe.hsetnx(delivery.key, "url", wanted.url)
        pipe.hsetnx(delivery.key, "body", wanted.body)
        pipe.hsetnx(delivery.key, "owner", wanted.owner)
        pipe.hmget(delivery.key, "url", "body", "owner")
        pipe.hincrby(delivery.key, "attempts", 1)
        pipe.mget(keys.webhook_key_secrets(wanted.owner))
        *_, (url, body, owner), attempts, stored = pipe.execute()
        payload = WebhookPayload(str(url), str(body).encode(), str(owner or ""))
        if payload.owner != wanted.owner:  # frozen by an earlier copy for another owner: its keys sign
            stored = self._redis.mget(keys.webhook_key_secrets(payload.owner))
        return Prepared(payload, int(attempts), stored)

    def _build_payload(self, delivery: Delivery, snapshot: DeliverySnapshot) -> WebhookPayload | None:
        """The url, body and owner a first attempt freezes (kept for every retry); None when
        there is nothing to send."""
        if delivery.batch:
            return batch_event(delivery.event, snapshot.record)
        return job_event(delivery.event, snapshot.record)

    def attempt(self, delivery: Delivery, prepared: Prepared) -> AttemptResult:
        """Send the frozen body once, signed (no Redis: prepare() read what it needs)."""
        payload = prepared.payload
        secrets = key_secrets.signing_keys(
            prepared.stored_secrets, payload.owner, self._settings, self._secrets
        )
        headers = signing.headers(secrets, delivery.webhook_id, int(time.time()), payload.body)
        return post(
            payload.url,
            payload.body,
            headers,
            self._settings.webhook_policy,
            self._settings.webhook_timeout_s,
        )

    def conclude(self, delivery: Delivery, attempt: int, result: AttemptResult) -> Verdict:
        return verdict(result, attempt, self._delays)


def log_entry(delivery: Delivery, attempt: int, result: AttemptResult, outcome: Verdict) -> dict[str, Any]:
    """One attempt as the delivery log (GET /v1/jobs/{id}/webhooks) shows it."""
    entry: dict[str, Any] = {
        "event": delivery.event,
        "webhook_id": delivery.webhook_id,
        "attempt": attempt,
        "at": rfc3339(time.time()),
        "duration_ms": result.duration_ms,
        "outcome": outcome.outcome,
    }
    if result.status_code is not None:
        entry["status_code"] = result.status_code
    else:
        entry["error"] = result.error
    if outcome.retry_in is not None:
        entry["next_attempt_at"] = rfc3339(time.time() + outcome.retry_in)
    return entry
