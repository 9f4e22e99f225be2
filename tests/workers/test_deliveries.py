"""workers/deliveries.py: the webhook delivery claim as a state machine, against a real Redis
(which copy of a delivery message may make an attempt), and what one attempt's result means."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import redis

from cli.redis_server import EmbeddedRedis
from tests.workers.test_webhooks import hook_settings
from workers.deliveries import JITTER_FRACTION, Deliveries, Delivery, Outcome, verdict
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


def _attempt(
    status_code: int | None = None, error: str | None = None, refused: bool = False
) -> AttemptResult:
    return AttemptResult(status_code, error, refused, duration_ms=1.0)


@pytest.mark.parametrize(
    ("result", "outcome"),
    [
        (_attempt(200), Outcome.DELIVERED),
        (_attempt(299), Outcome.DELIVERED),
        (_attempt(410), Outcome.GONE),  # the receiver asks for no more
        (_attempt(error="refused: loopback", refused=True), Outcome.REFUSED),
    ],
)
def test_final_verdicts(result: AttemptResult, outcome: Outcome) -> None:
    assert (verdict(result, 1, [5.0]).outcome, verdict(result, 1, [5.0]).retry_in) == (outcome, None)


@pytest.mark.parametrize(
    "result", [_attempt(500), _attempt(301), _attempt(error="timeout: no answer within 10 s")]
)
def test_a_failed_attempt_is_retried_on_schedule_then_fails(result: AttemptResult) -> None:
    delays = [5.0, 300.0]
    for attempt, delay in enumerate(delays, start=1):
        retry = verdict(result, attempt, delays)
        assert retry.outcome is Outcome.RETRYING and retry.retry_in is not None
        assert delay <= retry.retry_in <= delay * (1 + JITTER_FRACTION)
    assert verdict(result, len(delays) + 1, delays).outcome is Outcome.FAILED


def test_a_delivery_keeps_its_webhook_id_across_retries() -> None:
    """Receivers deduplicate on webhook-id: every output event has its own, a retry has the same."""
    assert (
        Delivery.of("job-1", "completed", "task-1").webhook_id
        == Delivery.of("job-1", "completed", "task-2").webhook_id
    )
    first, second = Delivery.of("job-1", "output", "task-1"), Delivery.of("job-1", "output", "task-2")
    assert first.webhook_id != second.webhook_id and ":" not in first.webhook_id
