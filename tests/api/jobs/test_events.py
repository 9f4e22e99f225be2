"""api/jobs/events.py: a job's end, published by a worker, wakes that job's long-pollers in this
process, and a lost subscription wakes them all (real Redis pub/sub)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
import redis
import redis.asyncio as aioredis

from api.jobs.events import JobEvents, set_within
from cli.redis_server import EmbeddedRedis
from shared import keys
from tests.api.conftest import woken

pytestmark = pytest.mark.anyio

JOB_A = "6f1c0a2e-8b1d-4c3e-9f00-00000000000a"
JOB_B = "6f1c0a2e-8b1d-4c3e-9f00-00000000000b"


@pytest.fixture
async def events(redis_server: EmbeddedRedis, redis_client: redis.Redis) -> AsyncIterator[JobEvents]:
    events = JobEvents(aioredis.Redis.from_url(redis_server.url, max_connections=1))  # as listener_client
    events.start()
    yield events
    await events.stop()  # closes its client


async def subscribed(client: redis.Redis) -> None:
    """Until the events subscription is in place (a message published before it is lost)."""
    for _ in range(100):
        if client.pubsub_numsub(keys.JOB_EVENTS_CHANNEL)[0][1] >= 1:
            return
        await asyncio.sleep(0.02)
    raise AssertionError("JobEvents never subscribed")


async def test_a_jobs_end_wakes_its_waiters_only(events: JobEvents, redis_client: redis.Redis) -> None:
    await subscribed(redis_client)
    with events.watch(JOB_A) as a1, events.watch(JOB_A) as a2, events.watch(JOB_B) as b:
        redis_client.publish(keys.JOB_EVENTS_CHANNEL, JOB_A)
        assert await woken(a1) and await woken(a2)
        assert not await woken(b, 0.3)


async def test_a_waiter_that_left_is_woken_no_more(events: JobEvents, redis_client: redis.Redis) -> None:
    await subscribed(redis_client)
    with events.watch(JOB_A) as left:
        pass
    with events.watch(JOB_A) as staying:
        redis_client.publish(keys.JOB_EVENTS_CHANNEL, JOB_A)
        assert await woken(staying)
    assert not left.is_set()


async def test_a_lost_subscription_wakes_every_waiter(events: JobEvents, redis_client: redis.Redis) -> None:
    """A job may have ended while the subscription was down: each waiter re-reads its record."""
    await subscribed(redis_client)
    with events.watch(JOB_A) as a, events.watch(JOB_B) as b:
        assert redis_client.client_kill_filter(_type="pubsub") >= 1
        assert await woken(a) and await woken(b)


async def test_set_within_returns_at_the_set_or_the_timeout_and_leaves_cancellation_alone() -> None:
    """What every held stream and long-poll waits with: back at once when the event is set, back
    after the timeout (no error) when it is not, and a cancel from outside (a client that left)
    still cancels the waiter."""
    loop = asyncio.get_running_loop()
    event = asyncio.Event()
    loop.call_later(0.05, event.set)
    began = loop.time()
    await set_within(event, 5.0)
    assert event.is_set() and loop.time() - began < 1.0
    quiet = asyncio.Event()
    began = loop.time()
    await set_within(quiet, 0.2)
    assert 0.15 <= loop.time() - began < 1.0
    await set_within(quiet, -1.0)  # a deadline already past: back at once
    waiter = asyncio.create_task(set_within(quiet, 5.0))
    await asyncio.sleep(0.05)
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter


async def test_a_message_it_cannot_read_does_not_end_the_listener(
    events: JobEvents, redis_client: redis.Redis
) -> None:
    """Bytes that are no job id (no UTF-8) on the channel: long-polls and streams must still learn
    of their jobs' ends, not wait for their rechecks."""
    await subscribed(redis_client)
    kwargs = redis_client.connection_pool.connection_kwargs
    raw = redis.Redis(host=kwargs["host"], port=kwargs["port"])  # sends the bytes as they are
    raw.publish(keys.JOB_EVENTS_CHANNEL, b"\xff\xfe")
    raw.close()
    await asyncio.sleep(0.2)
    await subscribed(redis_client)  # again, should it have subscribed anew
    with events.watch(JOB_A) as ended:
        redis_client.publish(keys.JOB_EVENTS_CHANNEL, JOB_A)
        assert await woken(ended)
