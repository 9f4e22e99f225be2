"""The webhook delivery claim as a state machine, against a real Redis: which copy of a delivery
message may make an attempt."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import redis

from cli.redis_server import EmbeddedRedis
from tests.workers.test_webhooks import hook_settings
from workers.deliveries import JITTER_FRACTION, Deliveries, Delivery, Outcome, Verdict, verdict
from workers.webhook_http import AttemptResult

DELIVERY = Delivery.of("job-1", "completed", "task-1")


@pytest.fixture
def deliveries(redis_server: EmbeddedRedis, redis_client: redis.Redis, tmp_path: Path) -> Deliveries:
    return Deliveries(redis_client, hook_settings(redis_server.url, tmp_path / "genq"))


def test_the_first_message_of_a_generation_claims_it(deliveries: Deliveries) -> None:
    assert deliveries.claim(DELIVERY, 0)[0] == "claimed"
    assert deliveries.claim(DELIVERY, 1)[0] == "claimed"  # the next retry
    assert deliveries.claim(DELIVERY, 0)[0] == "stale"  # a late copy of an older one


def test_a_copy_under_a_live_lease_waits_for_it_instead_of_being_dropped(
    deliveries: Deliveries, redis_client: redis.Redis
) -> None:
    """The broker handed the message out again (its first holder may have died mid-attempt):
    'busy' until the holder's lease ends, then the copy takes the attempt over."""
    _, lease = deliveries.claim(DELIVERY, 0)
    outcome, held_until = deliveries.claim(DELIVERY, 0)
    assert (outcome, held_until) == ("busy", lease) and lease > time.time()
    redis_client.hset(DELIVERY.key, "lease", repr(time.time() - 1))  # the holder never came back
    assert deliveries.claim(DELIVERY, 0)[0] == "claimed"


def test_a_delivery_with_its_outcome_takes_no_copy(deliveries: Deliveries) -> None:
    deliveries.claim(DELIVERY, 0)
    deliveries.record(DELIVERY, 0, {"outcome": "delivered"}, None)
    assert deliveries.claim(DELIVERY, 0)[0] == "over"
    assert deliveries.claim(DELIVERY, 1)[0] == "over"


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
    deliveries.claim(DELIVERY, 0)
    deliveries.record(DELIVERY, 0, {"outcome": "delivered"}, {"attempt": 1})
    for key in (DELIVERY.key, DELIVERY.log_key):
        assert expected - 2 <= redis_client.ttl(key) <= expected


# --- what one attempt's result means (verdict) ------------------------------------------------


def _attempt(status: int | None = None, error: str | None = None, refused: bool = False) -> AttemptResult:
    return AttemptResult(status, error, refused, duration_ms=1.0)


def test_final_verdicts() -> None:
    for result, outcome in [
        (_attempt(200), Outcome.DELIVERED),
        (_attempt(299), Outcome.DELIVERED),
        (_attempt(410), Outcome.GONE),
        (_attempt(None, "refused", True), Outcome.REFUSED),
    ]:
        assert verdict(result, 1, [5.0]) == Verdict(outcome, None)


def test_a_failed_attempt_is_retried_on_schedule_with_jitter_then_fails() -> None:
    for result in (_attempt(500), _attempt(301), _attempt(None, "timeout: no answer within 10 s")):
        for attempt, delay in enumerate([5.0, 300.0], start=1):
            retry = verdict(result, attempt, [5.0, 300.0])
            assert retry.outcome is Outcome.RETRYING
            assert delay <= (retry.retry_in or 0) <= delay * (1 + JITTER_FRACTION)
        assert verdict(result, 3, [5.0, 300.0]).outcome is Outcome.FAILED
