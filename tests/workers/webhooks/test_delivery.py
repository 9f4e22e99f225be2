"""The webhook delivery claim as a state machine, against a real Redis: which copy of a delivery
message may make an attempt."""

from __future__ import annotations

import time
from pathlib import Path

import orjson
import pytest
import redis

from cli.redis_server import EmbeddedRedis
from shared import keys
from tests.shared.jobqueue.script_keys import redis_client
from tests.workers.webhooks.test_tasks import hook_settings
from workers.webhooks.bodies import WebhookPayload
from workers.webhooks.delivery import START_MESSAGE_FIELD, Deliveries, Delivery, DeliverySnapshot, Prepared

DELIVERY = Delivery.of("job-1", "completed", "task-1")

__all__ = ["redis_client"]  # the fixture: its scripts run under the key check


@pytest.fixture
def deliveries(redis_server: EmbeddedRedis, redis_client: redis.Redis, tmp_path: Path) -> Deliveries:
    return Deliveries(redis_client, hook_settings(redis_server.url, tmp_path / "genq"))


def test_the_first_message_of_a_generation_claims_it(deliveries: Deliveries) -> None:
    assert deliveries.claim_and_look(DELIVERY, 0)[0] == "claimed"
    assert deliveries.claim_and_look(DELIVERY, 1)[0] == "claimed"  # the next retry
    assert deliveries.claim_and_look(DELIVERY, 0)[0] == "stale"  # a late copy of an older one


def test_a_copy_under_a_live_lease_waits_for_it_instead_of_being_dropped(
    deliveries: Deliveries, redis_client: redis.Redis
) -> None:
    """The broker handed the message out again (its first holder may have died mid-attempt):
    'busy' until the holder's lease ends, then the copy takes the attempt over."""
    _, lease, _ = deliveries.claim_and_look(DELIVERY, 0)
    outcome, held_until, snapshot = deliveries.claim_and_look(DELIVERY, 0)
    assert (outcome, held_until, snapshot) == ("busy", lease, None) and lease > time.time()
    redis_client.hset(DELIVERY.key, "lease", repr(time.time() - 1))  # the holder never came back
    assert deliveries.claim_and_look(DELIVERY, 0)[0] == "claimed"


def test_a_delivery_with_its_outcome_takes_no_copy(deliveries: Deliveries) -> None:
    deliveries.claim_and_look(DELIVERY, 0)
    deliveries.record_attempt(deliveries.attempt_record(DELIVERY, 0, {"outcome": "delivered"}, None))
    assert deliveries.claim_and_look(DELIVERY, 0)[0] == "over"
    assert deliveries.claim_and_look(DELIVERY, 1)[0] == "over"


@pytest.mark.parametrize("record_ttl_s", [3_600, None], ids=["record expiring", "no record"])
def test_a_deliverys_state_and_log_live_as_long_as_its_job(
    deliveries: Deliveries, redis_client: redis.Redis, redis_server: EmbeddedRedis, tmp_path: Path,
    record_ttl_s: int | None,
) -> None:  # fmt: skip
    """Claim and record set the state's and the log's expiry to the job record's remaining time
    (read inside their scripts), or to the job TTL setting when there is no record to follow."""
    if record_ttl_s is not None:
        redis_client.hset(DELIVERY.record_key, "status", "succeeded")
        redis_client.expire(DELIVERY.record_key, record_ttl_s)
    expected = record_ttl_s or hook_settings(redis_server.url, tmp_path / "genq").job_ttl_s
    deliveries.claim_and_look(DELIVERY, 0)
    deliveries.record_attempt(
        deliveries.attempt_record(DELIVERY, 0, {"outcome": "delivered"}, {"attempt": 1})
    )
    for key in (DELIVERY.key, DELIVERY.log_key):
        assert expected - 2 <= redis_client.ttl(key) <= expected


# --- prepare: freeze, count the attempt, read the owner's signing keys (one round trip) ----------

BATCH = Delivery.of_batch("batch-1", "batch.completed")
BATCH_RECORD = {"id": "batch-1", "endpoint": "/v1/chat/completions", "input_file_id": "file-1",
                "completion_window": "24h", "status": "completed", "created_at": "1", "owner": "alice",
                "webhook_url": "http://127.0.0.1:9/hook"}  # fmt: skip


def _commands(client: redis.Redis) -> dict[str, int]:
    """Commands run so far, by name, less the key check's own (tests/shared/jobqueue/script_keys.py)."""
    stats = client.info("commandstats").items()
    return {
        name.removeprefix("cmdstat_"): int(v["calls"]) for name, v in stats if name != "cmdstat_acl|setuser"
    }


@pytest.mark.parametrize(
    ("before", "owner", "attempt"),
    [
        ({}, "alice", 1),  # a first attempt freezes the body it builds
        ({"url": "http://elsewhere/", "body": '{"frozen":1}', "owner": "bob", "attempts": "1"}, "bob", 2),
    ],
    ids=["first attempt", "an earlier copy froze it first"],
)
def test_prepare_freezes_counts_and_reads_the_freezing_owners_keys(
    deliveries: Deliveries, redis_client: redis.Redis, before: dict[str, str], owner: str, attempt: int
) -> None:
    """State before (the delivery's hash), prepare() with a snapshot that saw no payload frozen, state
    after: the body frozen first is kept, the attempt counted, and the keys read are those of the
    owner the frozen body belongs to."""
    for name, value in before.items():
        redis_client.hset(BATCH.key, name, value)
    for name in ("alice", "bob"):
        redis_client.set(keys.webhook_key_secrets(name)[0], f"secret-of-{name}")
    prepared = deliveries.prepare(BATCH, DeliverySnapshot(BATCH_RECORD, None))
    assert prepared is not None and (prepared.payload.owner, prepared.attempt) == (owner, attempt)
    assert prepared.stored_secrets[0] == f"secret-of-{owner}"
    assert redis_client.hget(BATCH.key, "attempts") == str(attempt)
    if before:
        assert prepared.payload.body == b'{"frozen":1}' and prepared.payload.url == "http://elsewhere/"
    else:
        assert orjson.loads(prepared.payload.body)["data"]["id"] == "batch-1"


def test_a_first_attempt_is_prepared_in_one_round_trip(
    deliveries: Deliveries, redis_client: redis.Redis
) -> None:
    """One MULTI/EXEC freezes the body, counts the attempt and reads the keys; a second prepare
    (a copy that took the attempt over) keeps the body frozen first and counts the next attempt."""
    before = _commands(redis_client)
    first = deliveries.prepare(BATCH, DeliverySnapshot(BATCH_RECORD, None))
    after = _commands(redis_client)
    assert first is not None and after["exec"] - before.get("exec", 0) == 1
    assert after["mget"] - before.get("mget", 0) == 1
    retry = deliveries.prepare(BATCH, DeliverySnapshot(BATCH_RECORD, first.payload))
    assert retry is not None and (retry.payload, retry.attempt) == (first.payload, 2)


def test_an_attempt_the_claim_counted_is_prepared_with_no_round_trip(
    deliveries: Deliveries, redis_client: redis.Redis
) -> None:
    """A body frozen before the claim (the worker that finished the job stored it): the claim
    counted the attempt and read the keys, and prepare() sends no command at all."""
    redis_client.hset(DELIVERY.key, mapping={"url": "http://x/", "body": '{"a":1}', "owner": "alice"})
    redis_client.set(keys.webhook_key_secrets("alice")[0], "secret-of-alice")
    _, _, snapshot = deliveries.claim_and_look(DELIVERY, 0)
    assert snapshot is not None
    before = _commands(redis_client)
    prepared = deliveries.prepare(DELIVERY, snapshot)
    spent = {
        name: n - before.get(name, 0)
        for name, n in _commands(redis_client).items()
        if n != before.get(name, 0)
    }
    assert spent == {"info": 1}  # the `before` reading alone
    assert prepared == Prepared(
        WebhookPayload("http://x/", b'{"a":1}', "alice"), 1, ["secret-of-alice", None]
    )


def test_nothing_is_prepared_for_a_record_that_expired(
    deliveries: Deliveries, redis_client: redis.Redis
) -> None:
    assert deliveries.prepare(BATCH, DeliverySnapshot({}, None)) is None
    assert redis_client.exists(BATCH.key) == 0


# --- claim_and_look: the claim and the attempt's reads in one script --------------------------


@pytest.mark.parametrize(
    ("before", "generation", "claim"),
    [
        ({}, 0, "claimed"),
        ({"outcome": "pending", "generation": "0", "lease": "0"}, 1, "claimed"),
        ({"outcome": "pending", "generation": "1", "lease": "0"}, 0, "stale"),
        ({"outcome": "pending", "generation": "0", "lease": "9999999999"}, 0, "busy"),
        ({"outcome": "pending", "generation": "0", "lease": "1"}, 0, "claimed"),  # its holder's lease ran out
        ({"outcome": "delivered", "generation": "0", "lease": "0"}, 1, "over"),
    ],
)
def test_claim_and_look_claims_as_the_claim_script_does_and_reads_the_snapshot(
    deliveries: Deliveries, redis_client: redis.Redis, before: dict[str, str], generation: int, claim: str
) -> None:
    """State before, claim_and_look(), state after: the claim's outcome and the delivery's
    generation are the script's; a claimed generation comes with what its attempt reads (the
    frozen body, the record's input, the `start` delivery a `completed` one waits for) and, its body
    being frozen, its attempt counted with the owner's signing keys; any other outcome with
    nothing read or counted."""
    for name, value in {
        **before,
        "url": "http://x/",
        "body": "{}",
        "owner": "alice",
        "attempts": "2",
    }.items():
        redis_client.hset(DELIVERY.key, name, value)
    redis_client.hset(
        DELIVERY.record_key, mapping={"status": "succeeded", "input": "{}", START_MESSAGE_FIELD: "m"}
    )
    redis_client.set(keys.webhook_key_secrets("alice")[1], "previous-of-alice")
    start = Delivery.of("job-1", "start", "")
    redis_client.hset(start.key, mapping={"outcome": "pending", "next_at": "12.5"})
    outcome, _, snapshot = deliveries.claim_and_look(DELIVERY, generation)
    assert outcome == claim
    expected_generation = str(generation) if claim == "claimed" else before.get("generation")
    assert redis_client.hget(DELIVERY.key, "generation") == expected_generation
    if claim != "claimed":
        assert snapshot is None and redis_client.hget(DELIVERY.key, "attempts") == "2"
        return
    payload = WebhookPayload("http://x/", b"{}", "alice")
    counted = Prepared(payload, 3, [None, "previous-of-alice"])
    # Of the record, all an attempt of a frozen body reads is its input.
    assert snapshot == DeliverySnapshot({"input": "{}"}, payload, True, "pending", "12.5", counted)
    assert redis_client.hget(DELIVERY.key, "attempts") == "3"
    assert snapshot.uncounted() == {"attempts": "2"}  # what a wait's record sets back


@pytest.mark.parametrize(
    ("delivery", "start_state"),
    [
        (DELIVERY, (True, "failed", "12.5")),
        (Delivery.of("job-2", "start", "task-1"), (False, None, None)),  # no ordering to read
        (Delivery.of("job-1", "output", "task-1"), (False, None, None)),
        (Delivery.of_batch("batch-1", "batch.completed"), (False, None, None)),
    ],
    ids=["completed", "start", "output", "batch"],
)
def test_a_first_attempt_sees_no_frozen_body_and_only_a_completed_sees_its_start(
    deliveries: Deliveries, redis_client: redis.Redis, delivery: Delivery, start_state: tuple[object, ...]
) -> None:
    for job_id in ("job-1", "job-2"):  # both records still hold their start's message
        redis_client.hset(keys.job(job_id), mapping={"status": "succeeded", START_MESSAGE_FIELD: "m"})
    redis_client.hset(keys.batch("batch-1"), "status", "completed")
    redis_client.hset(Delivery.of("job-1", "start", "").key, mapping={"outcome": "failed", "next_at": "12.5"})
    outcome, _, snapshot = deliveries.claim_and_look(delivery, 0)
    assert outcome == "claimed" and snapshot is not None
    assert snapshot.payload is None and snapshot.record == redis_client.hgetall(delivery.record_key)
    assert (snapshot.start_never_sent, snapshot.start_outcome, snapshot.start_next_at) == start_state
    assert snapshot.counted is None and snapshot.uncounted() == {}  # prepare() freezes and counts
    assert redis_client.hget(delivery.key, "attempts") is None


def test_claim_and_look_is_one_round_trip_and_survives_a_lost_script_cache(
    deliveries: Deliveries, redis_client: redis.Redis
) -> None:
    """One EVALSHA, and nothing from the client beside it (Redis counts the script's own calls
    too: they are listed here); a Redis whose script cache was flushed (as after a restart) still
    gets the claim made."""
    deliveries.claim_and_look(DELIVERY, 0)  # the script is loaded
    before = _commands(redis_client)
    assert deliveries.claim_and_look(DELIVERY, 1)[0] == "claimed"
    after = _commands(redis_client)
    spent = {name: n - before.get(name, 0) for name, n in after.items() if n != before.get(name, 0)}
    in_script = {"hmget": 3, "hset": 1, "pttl": 1, "expire": 1, "hgetall": 1, "hexists": 1}
    assert spent == {"evalsha": 1, **in_script, "info": 1}  # the INFO is the `before` reading
    redis_client.script_flush()
    assert deliveries.claim_and_look(DELIVERY, 2)[0] == "claimed"
    assert redis_client.hget(DELIVERY.key, "generation") == "2"
