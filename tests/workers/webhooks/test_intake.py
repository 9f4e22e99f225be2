"""workers/webhooks/intake.py and shared/jobqueue/lua/webhook_take.lua: a task thread's next webhook
delivery without a broker delivery, against a real Redis. Messages are published the way the job
scripts and the delivery tasks publish them (workers.webhooks.delivery.publish); what a taken delivery
then does end to end is in tests/workers/webhooks/test_tasks.py."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import cast

import orjson
import pytest
import redis

from cli.redis_server import EmbeddedRedis
from shared import keys
from shared.jobqueue import scripts
from shared.jobqueue.kombu_layout import task_message
from shared.jobqueue.reaper import Reaper
from tests.shared.jobqueue.script_keys import redis_client
from tests.workers.webhooks.test_orphans import recheck_at
from tests.workers.webhooks.test_tasks import hook_settings
from workers.webhooks.bodies import WebhookPayload
from workers.webhooks.delivery import (
    START_MESSAGE_FIELD,
    WEBHOOK_LIST,
    AttemptRecord,
    Claim,
    Deliveries,
    Delivery,
)
from workers.webhooks.intake import (
    EVENT_NAMES,
    NEED_REPLY,
    ClaimedDelivery,
    DeliveryIntake,
    DeliveryMessage,
    message_labels,
)

COMPLETED = Delivery.of("job-1", "completed", "task-1")

__all__ = ["redis_client"]  # the fixture: its scripts run under the key check


@pytest.fixture
def deliveries(redis_server: EmbeddedRedis, redis_client: redis.Redis, tmp_path: Path) -> Deliveries:
    for record in (keys.job("job-1"), keys.job("job-22"), keys.batch("batch-1")):
        redis_client.hset(record, "status", "succeeded")  # the delivery state lives as long as it
        redis_client.expire(record, 3600)
    return Deliveries(redis_client, hook_settings(redis_server.url, tmp_path / "genq"))


@pytest.fixture
def intake(redis_client: redis.Redis, deliveries: Deliveries) -> Callable[..., DeliveryIntake]:
    def make(wait_s: float = 0.0, closing: threading.Event | None = None) -> DeliveryIntake:
        return DeliveryIntake(redis_client, deliveries, wait_s, closing or threading.Event())

    return make


def publish(deliveries: Deliveries, delivery: Delivery, task_id: str = "task-1", generation: int = 0,
            countdown: float = 0.0) -> None:  # fmt: skip
    deliveries.publish(delivery, task_id, generation, countdown, {})


def test_a_waiting_message_is_taken_with_its_generation_claimed(
    redis_client: redis.Redis, deliveries: Deliveries, intake: Callable[..., DeliveryIntake]
) -> None:
    publish(deliveries, COMPLETED, generation=2)
    before = time.time()
    taken = intake().next()
    assert taken is not None and taken.claim is Claim.CLAIMED
    assert taken.message == DeliveryMessage(COMPLETED, "task-1", 2, {})
    assert redis_client.llen(WEBHOOK_LIST) == 0
    state = redis_client.hgetall(COMPLETED.key)
    assert (state["outcome"], state["generation"]) == ("pending", "2")
    assert float(state["lease"]) == taken.held_until > before
    assert 0 < redis_client.ttl(COMPLETED.key) <= 3600  # as long as the job record


@pytest.mark.parametrize(
    "delivery",
    [
        Delivery.of("job-1", "output", "task-9"),  # one of a job's many output notices
        Delivery.of("job-22", "start", "task-9"),
        Delivery.of_batch("batch-1", "batch.completed"),
    ],
    ids=["output", "start", "batch"],
)
@pytest.mark.parametrize("said_by", ["argsrepr", "body"])
def test_the_script_names_the_delivery_python_names(
    redis_client: redis.Redis,
    deliveries: Deliveries,
    intake: Callable[..., DeliveryIntake],
    delivery: Delivery,
    said_by: str,
) -> None:
    # The script reads the args from the argsrepr when it says them, else from the base64 body.
    publish(deliveries, delivery, task_id="task-9")
    if said_by == "body":
        redis_client.lpush(WEBHOOK_LIST, without_argsrepr(cast(str, redis_client.rpop(WEBHOOK_LIST))))
    taken = intake().next()
    assert taken is not None and taken.claim is Claim.CLAIMED and taken.message.delivery == delivery
    assert redis_client.hget(delivery.key, "generation") == "0"


@pytest.mark.parametrize(
    "delivery",
    [COMPLETED, Delivery.of("job-22", "start", "task-1"), Delivery.of_batch("batch-1", "batch.failed")],
    ids=["completed", "start", "batch"],
)
def test_a_taken_delivery_comes_with_what_a_delivered_ones_claim_reads(
    redis_client: redis.Redis,
    deliveries: Deliveries,
    intake: Callable[..., DeliveryIntake],
    delivery: Delivery,
) -> None:
    """The take reads what the attempt needs in the same script (no round trip to look), and
    reads it as the claim of a message Celery delivered does (Deliveries.claim_and_look)."""
    for job_id in ("job-1", "job-22"):  # both records still hold their start's message
        redis_client.hset(keys.job(job_id), mapping={"input": "{}", START_MESSAGE_FIELD: "m"})
    start = Delivery.of("job-1", "start", "")
    redis_client.hset(start.key, mapping={"outcome": "retrying", "next_at": "9.5"})
    redis_client.hset(delivery.key, mapping={"url": "http://x/", "body": "{}", "owner": "alice"})
    publish(deliveries, delivery)
    taken = intake().next()
    assert taken is not None and taken.claim is Claim.CLAIMED and taken.snapshot is not None
    assert taken.snapshot.payload == WebhookPayload("http://x/", b"{}", "alice")
    # Of the record, a frozen body's attempt reads only the input (the webhook filter).
    record_input = redis_client.hget(delivery.record_key, "input")
    assert taken.snapshot.record == ({"input": record_input} if record_input else {})
    assert taken.snapshot.counted is not None and taken.snapshot.counted.attempt == 1  # counted by the take
    looked = deliveries.claim_and_look(delivery, 1)[2]  # the next generation's claim
    assert looked is not None and looked.counted is not None and looked.counted.attempt == 2
    assert replace(taken.snapshot, counted=None) == replace(looked, counted=None)
    assert taken.snapshot.start_never_sent is (delivery == COMPLETED)


def test_a_first_attempt_reads_the_whole_record_to_build_its_body(
    redis_client: redis.Redis, deliveries: Deliveries, intake: Callable[..., DeliveryIntake]
) -> None:
    start = Delivery.of("job-22", "start", "task-1")
    redis_client.hset(keys.job("job-22"), mapping={"input": "{}", "created_at": "1.5"})
    publish(deliveries, start)
    taken = intake().next()
    assert taken is not None and taken.snapshot is not None and taken.snapshot.payload is None
    assert taken.snapshot.record == redis_client.hgetall(keys.job("job-22"))


def without_argsrepr(message: bytes | str) -> bytes:
    """The message with an argsrepr that does not say its args (Celery truncates a long one)."""
    envelope = orjson.loads(message)
    envelope["headers"]["argsrepr"] = "[...]"
    return orjson.dumps(envelope)


@pytest.mark.parametrize("length", [1, 2, 3, 4])
def test_every_padding_of_the_body_decodes(
    redis_client: redis.Redis, intake: Callable[..., DeliveryIntake], length: int
) -> None:
    # The script reads the args from the body itself when the argsrepr does not say them.
    job_id = "j" * length
    redis_client.hset(keys.job(job_id), "status", "succeeded")
    message = task_message(keys.WEBHOOK_TASK, "task-1", [job_id, "completed"], keys.WEBHOOK_QUEUE, 0)
    redis_client.lpush(WEBHOOK_LIST, without_argsrepr(message))
    taken = intake().next()
    assert taken is not None and taken.claim is Claim.CLAIMED
    assert redis_client.hget(Delivery.of(job_id, "completed", "task-1").key, "outcome") == "pending"


def test_a_message_with_an_eta_stays_first_in_line_for_celery(
    redis_client: redis.Redis, deliveries: Deliveries, intake: Callable[..., DeliveryIntake]
) -> None:
    publish(deliveries, COMPLETED, generation=1, countdown=0.2)  # a retry: Celery holds it until due
    publish(deliveries, Delivery.of("job-22", "completed", "task-2"), task_id="task-2")
    listed = redis_client.lrange(WEBHOOK_LIST, 0, -1)
    assert intake(wait_s=1.0).next() is None  # no wait either: the next message is Celery's
    assert redis_client.lrange(WEBHOOK_LIST, 0, -1) == listed
    assert redis_client.hget(COMPLETED.key, "outcome") is None  # not claimed


def test_a_message_of_another_task_goes_back(
    redis_client: redis.Redis, intake: Callable[..., DeliveryIntake]
) -> None:
    for message in (
        task_message(keys.GENERATE_TASK, "job-1", ["job-1"], keys.WEBHOOK_QUEUE, 0),
        b"not json",
        orjson.dumps({"headers": {"task": keys.WEBHOOK_TASK, "id": "t"}, "properties": {}, "body": "!!"}),
        # Its argsrepr does not say its args, and its body is not base64.
        orjson.dumps(
            {
                "headers": {"task": keys.WEBHOOK_TASK, "id": "t", "argsrepr": "['a', 'b', 'c']"},
                "properties": {"body_encoding": "base64"},
                "body": "!!",
            }
        ),
    ):
        redis_client.delete(WEBHOOK_LIST)
        redis_client.lpush(WEBHOOK_LIST, message)
        assert intake().next() is None
        assert redis_client.lrange(WEBHOOK_LIST, 0, -1) == [message.decode()]


@pytest.mark.parametrize(
    ("state", "claim"),
    [(["outcome", "delivered"], Claim.OVER), (["outcome", "pending", "generation", "3"], Claim.STALE)],
)
def test_a_copy_that_may_not_act_is_taken_off_the_list_unclaimed(
    redis_client: redis.Redis,
    deliveries: Deliveries,
    intake: Callable[..., DeliveryIntake],
    state: list[str],
    claim: Claim,
) -> None:
    publish(deliveries, COMPLETED, generation=1)
    redis_client.hset(COMPLETED.key, items=state)
    taken = intake().next()
    assert taken is not None and taken.claim is claim and redis_client.llen(WEBHOOK_LIST) == 0
    assert taken.snapshot is None  # nothing read for a copy that does not act
    assert redis_client.hget(COMPLETED.key, "outcome") == state[1]  # unchanged


def test_a_copy_of_a_generation_under_a_live_lease_is_busy_until_it_ends(
    redis_client: redis.Redis, deliveries: Deliveries, intake: Callable[..., DeliveryIntake]
) -> None:
    held_until = time.time() + 60
    redis_client.hset(
        COMPLETED.key, mapping={"outcome": "pending", "generation": "1", "lease": repr(held_until)}
    )
    publish(deliveries, COMPLETED, generation=1)
    taken = intake().next()
    assert taken is not None and taken.claim is Claim.BUSY and taken.held_until == pytest.approx(held_until)
    assert float(redis_client.hget(COMPLETED.key, "lease") or 0) == pytest.approx(
        held_until
    )  # not taken over


def test_a_message_published_during_the_wait_is_taken(
    redis_client: redis.Redis, deliveries: Deliveries, intake: Callable[..., DeliveryIntake]
) -> None:
    threading.Timer(0.2, lambda: publish(deliveries, COMPLETED)).start()
    taken = intake(wait_s=5.0).next()
    assert taken is not None and taken.claim is Claim.CLAIMED and taken.message.delivery == COMPLETED
    assert redis_client.llen(WEBHOOK_LIST) == 0


def test_nothing_within_the_wait_gives_the_thread_back(intake: Callable[..., DeliveryIntake]) -> None:
    started = time.monotonic()
    assert intake(wait_s=0.3).next() is None
    assert 0.25 < time.monotonic() - started < 2.0


def test_a_closing_worker_takes_nothing(
    redis_client: redis.Redis, deliveries: Deliveries, intake: Callable[..., DeliveryIntake]
) -> None:
    closing = threading.Event()
    closing.set()
    publish(deliveries, COMPLETED)
    assert intake(closing=closing).next() is None and redis_client.llen(WEBHOOK_LIST) == 1


def test_a_delivery_taken_by_a_thread_that_died_is_pushed_again_once_its_lease_ran_out(
    redis_client: redis.Redis, deliveries: Deliveries, intake: Callable[..., DeliveryIntake]
) -> None:
    publish(deliveries, COMPLETED)
    taken = intake().next()
    assert taken is not None and taken.claim is Claim.CLAIMED  # ... and the thread dies here
    reaper = Reaper(redis_client, 3, 600.0, 1.0)

    def reap(now: float) -> dict[str, int]:
        redis_client.delete(keys.REAPER_LOCK)
        return reaper.run_once(now)

    during, after = taken.held_until - 1, recheck_at(taken.held_until)  # rechecked past the lease
    assert reap(during) == {}  # its lease holds it: the attempt may be under way
    assert redis_client.hget(COMPLETED.key, "missing_since") is None
    assert reap(after) == {} and redis_client.hget(COMPLETED.key, "missing_since") is not None
    assert reap(recheck_at(after)) == {"webhook_repushed": 1}
    # The copy carries the same generation: once the lease has run out (set back here, as time
    # would), it takes the attempt over.
    redis_client.hset(COMPLETED.key, "lease", repr(time.time() - 1))
    again = intake().next()
    assert again is not None and again.claim is Claim.CLAIMED and again.message.generation == 0


# --- the end of the thread's last delivery, made in the next take's round trip ----------------


def _claim_and_end(deliveries: Deliveries, intake: DeliveryIntake, outcome: str) -> AttemptRecord:
    """COMPLETED taken (generation 0, with a frozen body) and the end of an attempt at it."""
    publish(deliveries, COMPLETED)
    taken = intake.next()
    assert taken is not None and taken.claim is Claim.CLAIMED
    fields = {"outcome": outcome, **({"next_at": "99.5"} if outcome == "pending" else {})}
    return deliveries.attempt_record(COMPLETED, 0, fields, {"attempt": 1, "outcome": outcome})


def _state(client: redis.Redis) -> tuple[dict[str, str], list[str], bool]:
    """The delivery's state (its message: whether it has one), log and place in the index."""
    state = {str(name): str(value) for name, value in client.hgetall(COMPLETED.key).items()}
    state["message"] = str("message" in state)
    log = [str(entry) for entry in client.lrange(keys.webhook_log("job-1"), 0, -1)]
    return state, log, client.zscore(keys.WEBHOOK_PENDING, COMPLETED.key) is not None


@pytest.mark.parametrize("outcome", ["delivered", "pending", "failed"])
def test_an_attempt_record_made_by_the_take_leaves_what_recording_it_alone_leaves(
    redis_client: redis.Redis, deliveries: Deliveries, intake: Callable[..., DeliveryIntake], outcome: str
) -> None:
    """State after a take carrying the attempt record equals state after webhook_record.lua alone (the
    claim released, fields set, the body dropped and the index left on a final outcome, the log
    entry appended), and the next delivery is taken in the same call."""
    redis_client.hset(COMPLETED.key, mapping={"url": "http://x/", "body": "{}", "owner": ""})
    attempt_record = _claim_and_end(deliveries, intake(), outcome)
    deliveries.record_attempt(attempt_record)
    alone = _state(redis_client)
    redis_client.flushdb()
    for record in (keys.job("job-1"), keys.job("job-22")):
        redis_client.hset(record, "status", "succeeded")
        redis_client.expire(record, 3600)
    redis_client.hset(COMPLETED.key, mapping={"url": "http://x/", "body": "{}", "owner": ""})
    attempt_record = _claim_and_end(deliveries, intake(), outcome)
    following = Delivery.of("job-22", "completed", "task-2")
    publish(deliveries, following, task_id="task-2")
    taken = intake().next(attempt_record)
    assert taken is not None and taken.claim is Claim.CLAIMED and taken.message.delivery == following
    with_take = _state(redis_client)
    assert with_take[0].pop("lease") == alone[0].pop("lease") == "0"
    assert with_take == alone
    assert ("body" in alone[0], alone[2]) == ((False, False) if outcome != "pending" else (True, True))


def test_the_attempt_record_costs_no_round_trip_of_its_own(
    redis_client: redis.Redis, deliveries: Deliveries, intake: Callable[..., DeliveryIntake]
) -> None:
    """The next delivery's message was in line when the thread took its last: that take named its
    keys (shared/jobqueue/lua/webhook_take.lua), so this take declares them and asks for none."""
    taker = intake()
    publish(deliveries, COMPLETED)
    publish(deliveries, Delivery.of("job-22", "completed", "task-2"), task_id="task-2")
    taken = taker.next()
    assert taken is not None and taken.message.delivery == COMPLETED
    attempt_record = deliveries.attempt_record(COMPLETED, 0, {"outcome": "delivered"}, {"attempt": 1})
    sent = ("evalsha", "eval", "script|load", "script|exists")

    def calls() -> dict[str, int]:
        stats = redis_client.info("commandstats")
        return {name: int(stats.get(f"cmdstat_{name}", {}).get("calls", 0)) for name in sent}

    before = calls()
    assert taker.next(attempt_record) is not None
    spent = {name: count - before[name] for name, count in calls().items()}
    assert spent == {"evalsha": 1, "eval": 0, "script|load": 0, "script|exists": 0}  # by its SHA
    assert redis_client.hget(COMPLETED.key, "outcome") == "delivered"


@pytest.mark.parametrize("situation", ["empty list", "closing"])
def test_the_attempt_record_is_made_when_nothing_is_taken(
    redis_client: redis.Redis, deliveries: Deliveries, intake: Callable[..., DeliveryIntake], situation: str
) -> None:
    closing = threading.Event()
    taker = intake(wait_s=0.2, closing=closing)
    attempt_record = _claim_and_end(deliveries, taker, "delivered")
    if situation == "closing":
        closing.set()
        publish(deliveries, Delivery.of("job-22", "completed", "task-2"), task_id="task-2")
    assert taker.next(attempt_record) is None
    assert redis_client.hget(COMPLETED.key, "outcome") == "delivered"
    assert redis_client.llen(keys.webhook_log("job-1")) == 1
    assert redis_client.llen(WEBHOOK_LIST) == (1 if situation == "closing" else 0)


def _evalsha_calls(redis_client: redis.Redis) -> int:
    return int(redis_client.info("commandstats").get("cmdstat_evalsha", {}).get("calls", 0))


def test_a_message_popped_during_the_wait_is_claimed_without_asking_for_its_keys(
    redis_client: redis.Redis, deliveries: Deliveries, intake: Callable[..., DeliveryIntake]
) -> None:
    """The thread read the message it popped: its take declares the keys it names (its delivery's
    state, its record's, the `start` delivery's), so the script claims it without asking again."""
    taker = intake(wait_s=5.0)
    threading.Timer(0.2, lambda: publish(deliveries, COMPLETED)).start()
    before = _evalsha_calls(redis_client)
    taken = taker.next()
    assert taken is not None and taken.claim is Claim.CLAIMED and taken.message.delivery == COMPLETED
    assert _evalsha_calls(redis_client) - before == 2  # the take that found none, the popped one's


def test_a_take_declares_the_keys_another_threads_take_named(
    redis_client: redis.Redis, deliveries: Deliveries, intake: Callable[..., DeliveryIntake]
) -> None:
    """Task threads share what their takes saw next in line: a thread whose own last take named
    nothing takes the message after another thread's in one round trip."""
    taker = intake()
    second = Delivery.of("job-22", "completed", "task-2")
    publish(deliveries, COMPLETED)
    publish(deliveries, second, task_id="task-2")
    first = taker.next()
    assert first is not None and first.message.delivery == COMPLETED
    taken: list[ClaimedDelivery | None] = []
    before = _evalsha_calls(redis_client)
    other = threading.Thread(target=lambda: taken.append(taker.next()))
    other.start()
    other.join()
    assert _evalsha_calls(redis_client) - before == 1
    assert taken[0] is not None and taken[0].message.delivery == second


def test_a_take_that_asks_for_a_peeked_messages_keys_hands_the_message_over(
    redis_client: redis.Redis, deliveries: Deliveries
) -> None:
    """Asking again for whatever is next in line would race the other threads for it: the take
    pops the message it asks about and hands it to the caller, who takes again with it, so the
    second take finds the keys it declared."""
    publish(deliveries, COMPLETED)
    waiting = cast(str, redis_client.lindex(WEBHOOK_LIST, -1))
    names = [keys.WEBHOOK_TASK, keys.BATCH_WEBHOOK_TASK, *EVENT_NAMES, START_MESSAGE_FIELD]
    reply = scripts.Script(redis_client, "webhook_take")(args=[*deliveries.lease_args(), *names, "", 2])
    assert reply[:2] == [NEED_REPLY, waiting]
    assert sorted(reply[2:]) == sorted(message_labels(waiting))
    assert redis_client.llen(WEBHOOK_LIST) == 0  # the caller's now
    assert redis_client.hget(COMPLETED.key, "generation") is None  # not claimed: the caller takes again


def test_a_take_asked_for_no_hints_names_none(redis_client: redis.Redis, deliveries: Deliveries) -> None:
    """Naming the next none messages reads none of the list (LRANGE -0 -1 would read all of it)."""
    publish(deliveries, COMPLETED)
    publish(deliveries, Delivery.of("job-22", "completed", "task-2"), task_id="task-2")
    raw = cast(str, redis_client.rpop(WEBHOOK_LIST))
    names = [keys.WEBHOOK_TASK, keys.BATCH_WEBHOOK_TASK, *EVENT_NAMES, START_MESSAGE_FIELD]
    take = scripts.Script(redis_client, "webhook_take")
    reply = take(args=[*deliveries.lease_args(), *names, raw, 0], labels=message_labels(raw))
    assert reply[0] == "claimed" and reply[3] == ""
