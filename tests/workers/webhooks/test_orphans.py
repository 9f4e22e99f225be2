"""A webhook delivery whose message the broker lost is pushed again by the reaper
(shared/jobqueue/lua/reap_delivery.lua): the index of pending deliveries as a state machine against a real
Redis, then end to end with real worker processes and a real receiver."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import orjson
import pytest
import redis

from cli.redis_server import EmbeddedRedis
from shared import keys
from shared.jobqueue import scripts
from shared.jobqueue.reaper import Reaper
from tests.conftest import WorkerProcess, api_client
from tests.shared.jobqueue.script_keys import redis_client
from tests.workers.webhooks.test_tasks import Receiver, hook_settings, submit_completed_hook, until
from workers.webhooks.delivery import WEBHOOK_LIST, Deliveries, Delivery

DELIVERY = Delivery.of("job-1", "completed", "task-1")

__all__ = ["redis_client"]  # the fixture: its scripts run under the key check


def check_at() -> float:
    """A moment past the first orphan check of a delivery published now."""
    return time.time() + scripts.ORPHAN_CHECK_S + 1


def recheck_at(first: float) -> float:
    return first + scripts.ORPHAN_RECHECK_S + 1


@pytest.fixture
def deliveries(redis_server: EmbeddedRedis, redis_client: redis.Redis, tmp_path: Path) -> Deliveries:
    redis_client.hset(keys.job(DELIVERY.job_id), "status", "succeeded")  # its TTL bounds the delivery's
    redis_client.expire(keys.job(DELIVERY.job_id), 3600)
    return Deliveries(redis_client, hook_settings(redis_server.url, tmp_path / "genq"))


def reap(client: redis.Redis, now: float) -> dict[str, int]:
    client.delete(keys.REAPER_LOCK)  # one period each, whichever process ran the last
    return Reaper(client, 3, 600.0, 1.0).run_once(now)


def listed(client: redis.Redis) -> list[dict[str, Any]]:
    return [orjson.loads(m) for m in client.lrange(WEBHOOK_LIST, 0, -1)]


def take(client: redis.Redis) -> str:
    """What a worker does with the message: the list -> kombu's unacked hash."""
    raw = cast(str | None, client.rpop(WEBHOOK_LIST))  # one element: no count given
    assert raw is not None
    tag = orjson.loads(raw)["properties"]["delivery_tag"]
    client.hset(keys.KOMBU_UNACKED, tag, raw)
    return str(tag)


def test_a_published_message_indexes_its_delivery(deliveries: Deliveries, redis_client: redis.Redis) -> None:
    deliveries.publish(DELIVERY, "task-1", 2, 0.0, {})
    [message] = listed(redis_client)
    assert message["headers"]["retries"] == 2 and message["headers"]["eta"] is None
    assert redis_client.hget(DELIVERY.key, "message") == orjson.dumps(message).decode()
    assert redis_client.zscore(keys.WEBHOOK_PENDING, DELIVERY.key) is not None
    assert 0 < redis_client.ttl(DELIVERY.key) <= 3600


@pytest.mark.parametrize("where", ["list", "unacked", "lease"])
def test_a_message_a_worker_will_find_is_left_alone(
    deliveries: Deliveries, redis_client: redis.Redis, where: str
) -> None:
    deliveries.publish(DELIVERY, "task-1", 0, 0.0, {})
    first = check_at()
    if where == "unacked":
        take(redis_client)
    if where == "lease":  # an attempt under way: its message may be anywhere meanwhile
        redis_client.delete(WEBHOOK_LIST)
        redis_client.hset(DELIVERY.key, mapping={"outcome": "pending", "lease": recheck_at(first) + 60})
    assert reap(redis_client, first) == {} and reap(redis_client, recheck_at(first)) == {}
    assert len(listed(redis_client)) == (1 if where == "list" else 0)


def test_pending_deliveries_in_the_list_are_checked_without_a_scan_each(
    deliveries: Deliveries, redis_client: redis.Redis
) -> None:
    """The reaper reads the webhook list's tags once a period: a scan per delivery (LPOS) cost Redis
    O(N^2) a period with N deliveries waiting (bench/orphan_checks.py measures the jobs' twin)."""
    for index in range(20):
        redis_client.hset(keys.job(f"job-{index}"), "status", "succeeded")
        redis_client.expire(keys.job(f"job-{index}"), 3600)
        deliveries.publish(
            Delivery.of(f"job-{index}", "completed", f"task-{index}"), f"task-{index}", 0, 0.0, {}
        )
    redis_client.config_resetstat()
    first = check_at()
    assert reap(redis_client, first) == {}
    assert int(redis_client.info("commandstats").get("cmdstat_lpos", {}).get("calls", 0)) == 0
    assert len(listed(redis_client)) == 20
    checked = redis_client.zrangebyscore(keys.WEBHOOK_PENDING, first + scripts.ORPHAN_CHECK_S, "+inf")
    assert len(checked) == 20  # each was checked (held), and is next due a period later


def test_a_lost_message_is_pushed_again_after_two_checks_under_a_fresh_tag(
    deliveries: Deliveries, redis_client: redis.Redis
) -> None:
    """kombu pops a message before it records it unacked: a worker killed in between loses it."""
    deliveries.publish(DELIVERY, "task-1", 1, 0.0, {"due_at": 5.0})
    lost = orjson.loads(cast(str | None, redis_client.rpop(WEBHOOK_LIST)) or b"")
    first = check_at()
    assert reap(redis_client, first) == {}  # suspect: maybe between kombu's two steps right now
    assert reap(redis_client, recheck_at(first)) == {"webhook_repushed": 1}
    [copy] = listed(redis_client)
    assert copy["properties"]["delivery_tag"] != lost["properties"]["delivery_tag"]
    assert copy["headers"]["retries"] == 1 and copy["body"] == lost["body"]  # same generation, same kwargs
    assert redis_client.hget(DELIVERY.key, "message") == orjson.dumps(copy).decode()
    assert redis_client.zscore(keys.WEBHOOK_PENDING, DELIVERY.key) == pytest.approx(
        recheck_at(first) + scripts.ORPHAN_CHECK_S
    )


def test_a_message_seen_again_before_the_recheck_is_not_pushed(
    deliveries: Deliveries, redis_client: redis.Redis
) -> None:
    deliveries.publish(DELIVERY, "task-1", 0, 0.0, {})
    raw = cast(str | None, redis_client.rpop(WEBHOOK_LIST))
    first = check_at()
    assert reap(redis_client, first) == {}
    redis_client.hset(keys.KOMBU_UNACKED, orjson.loads(raw or b"")["properties"]["delivery_tag"], raw or b"")
    assert reap(redis_client, recheck_at(first)) == {}
    assert listed(redis_client) == [] and not redis_client.hexists(DELIVERY.key, "missing_since")


def test_a_delivery_with_its_outcome_leaves_the_index(
    deliveries: Deliveries, redis_client: redis.Redis
) -> None:
    deliveries.publish(DELIVERY, "task-1", 0, 0.0, {})
    deliveries.claim_and_look(DELIVERY, 0)
    deliveries.record_attempt(deliveries.attempt_record(DELIVERY, 0, {"outcome": "delivered"}, None))
    assert redis_client.zscore(keys.WEBHOOK_PENDING, DELIVERY.key) is None
    assert not redis_client.hexists(DELIVERY.key, "message")


def test_an_index_entry_whose_delivery_expired_is_dropped(
    deliveries: Deliveries, redis_client: redis.Redis
) -> None:
    deliveries.publish(DELIVERY, "task-1", 0, 0.0, {})
    redis_client.delete(DELIVERY.key, WEBHOOK_LIST)  # expired with its job
    assert reap(redis_client, check_at()) == {}
    assert redis_client.zscore(keys.WEBHOOK_PENDING, DELIVERY.key) is None


@pytest.mark.anyio
@pytest.mark.slow
async def test_a_completion_message_lost_by_the_broker_is_still_delivered(
    redis_server: EmbeddedRedis,
    redis_client: redis.Redis,
    tmp_path: Path,
    start_worker: Callable[..., WorkerProcess],
) -> None:
    """The job script pushed `job.completed`'s message; a webhook worker popped it and was killed
    before kombu recorded it (here: the message is taken off the list by hand). The reaper pushes
    it again and a webhook worker delivers it, once. (The reaper is run here with its clock moved
    past the checks, instead of waiting ORPHAN_CHECK_S in real time.)"""
    receiver = Receiver()
    settings = hook_settings(redis_server.url, tmp_path / "genq")
    start_worker(settings, "--concurrency=2")
    try:
        async with api_client(settings) as api:
            job_id = await submit_completed_hook(api, receiver)
            await until(lambda: redis_client.llen(WEBHOOK_LIST) == 1, 30, "the completion message")
            redis_client.rpop(WEBHOOK_LIST)
            now = time.time()
            assert reap(redis_client, now + scripts.ORPHAN_CHECK_S + 1) == {}
            assert reap(redis_client, now + scripts.ORPHAN_CHECK_S + scripts.ORPHAN_RECHECK_S + 2) == {
                "webhook_repushed": 1
            }
            start_worker(settings, "--queues=webhooks")
            await until(lambda: receiver.statuses == [200], 30, "the delivery")
            delivery = Delivery.of(job_id, "completed", "")
            await until(
                lambda: redis_client.zscore(keys.WEBHOOK_PENDING, delivery.key) is None, 10, "its end"
            )
    finally:
        receiver.close()
    assert [r.payload["data"]["id"] for r in receiver.received] == [job_id]
