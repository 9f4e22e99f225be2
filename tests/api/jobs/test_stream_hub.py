"""api/jobs/stream_hub.py: one blocking read per API process wakes the followers of the streams
that moved, and only those (real Redis; the worker's XADDs done by hand)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
import redis
import redis.asyncio as aioredis

from api.jobs.stream_hub import StreamHub
from api.jobs.streams import START_ID
from cli.redis_server import EmbeddedRedis
from shared import keys

pytestmark = pytest.mark.anyio

JOB_A = "6f1c0a2e-8b1d-4c3e-9f00-00000000000a"
JOB_B = "6f1c0a2e-8b1d-4c3e-9f00-00000000000b"


@pytest.fixture
async def hub(redis_server: EmbeddedRedis, redis_client: redis.Redis) -> AsyncIterator[StreamHub]:
    hub = StreamHub(aioredis.Redis.from_url(redis_server.url, decode_responses=True, max_connections=1))
    hub.start()
    yield hub
    await hub.stop()


async def woken(event: asyncio.Event, timeout_s: float = 2.0) -> bool:
    try:
        await asyncio.wait_for(event.wait(), timeout_s)
    except TimeoutError:
        return False
    return True


async def test_an_entry_wakes_the_followers_of_its_job_only(
    hub: StreamHub, redis_client: redis.Redis
) -> None:
    a1, a2, b = asyncio.Event(), asyncio.Event(), asyncio.Event()
    with hub.follow(JOB_A, START_ID, a1), hub.follow(JOB_A, START_ID, a2), hub.follow(JOB_B, START_ID, b):
        await asyncio.sleep(0.1)
        redis_client.xadd(keys.job_stream(JOB_A), {"delta": "x", "tokens": 1})
        assert await woken(a1) and await woken(a2)
        assert not await woken(b, 0.5)


async def test_entries_already_behind_the_cursor_wake_nobody_and_new_ones_do(
    hub: StreamHub, redis_client: redis.Redis
) -> None:
    seen = str(redis_client.xadd(keys.job_stream(JOB_A), {"delta": "old", "tokens": 1}))
    event = asyncio.Event()
    with hub.follow(JOB_A, seen, event):
        assert not await woken(event, 0.6)  # more than two blocking reads: the old entry is not news
        redis_client.xadd(keys.job_stream(JOB_A), {"delta": "new", "tokens": 2})
        assert await woken(event)
        event.clear()
        assert not await woken(event, 0.6)  # one wake per new entry, not one per read


async def test_a_follower_that_left_is_woken_no_more(hub: StreamHub, redis_client: redis.Redis) -> None:
    event = asyncio.Event()
    with hub.follow(JOB_A, START_ID, event):
        await asyncio.sleep(0.1)
    redis_client.xadd(keys.job_stream(JOB_A), {"delta": "late", "tokens": 1})
    assert not await woken(event, 0.6)


async def test_a_lost_connection_wakes_every_follower(hub: StreamHub, redis_client: redis.Redis) -> None:
    """While the hub reconnects nobody learns of new entries from it, so each follower re-reads
    on its own."""
    event = asyncio.Event()
    with hub.follow(JOB_A, START_ID, event):
        await asyncio.sleep(0.1)  # the hub is in its blocking read
        assert redis_client.client_kill_filter(_type="normal", skipme=True) >= 1
        assert await woken(event)
