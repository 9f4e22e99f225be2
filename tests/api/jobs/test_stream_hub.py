"""api/jobs/stream_hub.py: one pub/sub subscription per API process, held while anyone follows a
stream, wakes the followers of the job a message names, and only those; a (re)subscription wakes
everyone (real Redis; the worker's PUBLISH sent by hand, as workers/publish.py sends it)."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator

import pytest
import redis
import redis.asyncio as aioredis

from api.jobs import notifications, stream_hub
from api.jobs.stream_hub import StreamHub
from cli.redis_server import EmbeddedRedis
from shared import keys
from tests.api.conftest import woken

pytestmark = pytest.mark.anyio

JOB_A = "6f1c0a2e-8b1d-4c3e-9f00-00000000000a"
JOB_B = "6f1c0a2e-8b1d-4c3e-9f00-00000000000b"


@pytest.fixture
async def hub(redis_server: EmbeddedRedis, redis_client: redis.Redis) -> AsyncIterator[StreamHub]:
    hub = StreamHub(aioredis.Redis.from_url(redis_server.url, max_connections=1))  # as listener_client
    hub.start()
    yield hub
    await hub.stop()


def subscribers(client: redis.Redis) -> int:
    counts = dict(client.pubsub_numsub(keys.JOB_OUTPUT_CHANNEL))
    return int(counts[keys.JOB_OUTPUT_CHANNEL])


async def subscribed(hub: StreamHub, event: asyncio.Event) -> None:
    """Wait out the hub's (re)subscription: it wakes every follower once it took effect."""
    assert await woken(event), "the hub never confirmed its subscription"
    event.clear()


async def test_a_message_wakes_the_followers_of_its_job_only(
    hub: StreamHub, redis_client: redis.Redis
) -> None:
    a1, a2, b = asyncio.Event(), asyncio.Event(), asyncio.Event()
    with hub.follow(JOB_A, a1), hub.follow(JOB_A, a2), hub.follow(JOB_B, b):
        for event in (a1, a2, b):
            await subscribed(hub, event)
        redis_client.publish(keys.JOB_OUTPUT_CHANNEL, JOB_A)
        assert await woken(a1) and await woken(a2)
        assert not await woken(b, 0.5)
        redis_client.publish(keys.JOB_OUTPUT_CHANNEL, JOB_B)
        assert await woken(b)


async def test_nobody_is_woken_without_news(hub: StreamHub, redis_client: redis.Redis) -> None:
    """An idle stream costs nothing: no wake, and no Redis command, until its job's output moves."""
    event = asyncio.Event()
    with hub.follow(JOB_A, event):
        await subscribed(hub, event)
        before = int(redis_client.info("stats")["total_commands_processed"])
        assert not await woken(event, 1.5)
        # This test's own INFO aside, the hub sent nothing while it waited.
        assert int(redis_client.info("stats")["total_commands_processed"]) - before <= 2


async def test_a_follower_that_left_is_woken_no_more(hub: StreamHub, redis_client: redis.Redis) -> None:
    event, other = asyncio.Event(), asyncio.Event()
    with hub.follow(JOB_B, other):
        await subscribed(hub, other)
        with hub.follow(JOB_A, event):
            pass
        redis_client.publish(keys.JOB_OUTPUT_CHANNEL, JOB_A)
        assert not await woken(event, 0.5)


async def test_the_subscription_lasts_while_anyone_follows_and_lingers_after(
    hub: StreamHub, redis_client: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A process that serves no streams receives no output messages (every worker's every entry
    would cost it a wake-up), and one that serves them now and then does not resubscribe each time."""
    monkeypatch.setattr(stream_hub, "LINGER_S", 0.5)
    monkeypatch.setattr(hub, "poll_s", 0.1)
    assert subscribers(redis_client) == 0 and not hub.subscribed
    event = asyncio.Event()
    with hub.follow(JOB_A, event):
        await subscribed(hub, event)
        assert subscribers(redis_client) == 1
    await asyncio.sleep(0.2)
    assert subscribers(redis_client) == 1  # lingering
    await asyncio.sleep(1.0)
    assert subscribers(redis_client) == 0 and not hub.subscribed
    with hub.follow(JOB_A, event):  # and back, for a new follower
        await subscribed(hub, event)
        redis_client.publish(keys.JOB_OUTPUT_CHANNEL, JOB_A)
        assert await woken(event)


async def test_a_lost_connection_wakes_every_follower(hub: StreamHub, redis_client: redis.Redis) -> None:
    """While the hub resubscribes nobody learns of new entries from it, so each follower re-reads
    on its own; and messages wake them again once it is back."""
    event = asyncio.Event()
    with hub.follow(JOB_A, event):
        await subscribed(hub, event)
        assert redis_client.client_kill_filter(_type="pubsub", skipme=True) >= 1
        assert await woken(event)
        event.clear()
        assert await woken(event, 3.0)  # the wake after it subscribed again
        event.clear()
        redis_client.publish(keys.JOB_OUTPUT_CHANNEL, JOB_A)
        assert await woken(event)


async def test_with_redis_down_followers_are_woken_and_retries_end_with_the_last_follower(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Each failed subscription wakes the followers (they read on their own meanwhile); once nobody
    has followed for LINGER_S the hub stops trying, instead of logging a retry twice a second for
    as long as Redis is away."""
    monkeypatch.setattr(stream_hub, "LINGER_S", 0.3)
    monkeypatch.setattr(notifications, "RECONNECT_S", 0.05)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        closed = sock.getsockname()[1]
    hub = StreamHub(aioredis.Redis.from_url(f"redis://127.0.0.1:{closed}/0", max_connections=1))
    hub.start()
    try:
        event = asyncio.Event()
        with hub.follow(JOB_A, event):
            assert await woken(event)
            event.clear()
            assert await woken(event)  # and again at the next failed try
        await asyncio.sleep(1.0)
        assert not hub.subscribed
    finally:
        await hub.stop()


async def test_a_message_the_hub_cannot_read_does_not_end_it(
    hub: StreamHub, redis_client: redis.Redis
) -> None:
    """Anyone who can PUBLISH can send bytes that are no job id (no UTF-8, here): the hub must go on
    waking followers, or every stream of the process would wait for its job's end."""
    event = asyncio.Event()
    with hub.follow(JOB_A, event):
        await subscribed(hub, event)
        kwargs = redis_client.connection_pool.connection_kwargs
        raw = redis.Redis(host=kwargs["host"], port=kwargs["port"])  # sends the bytes as they are
        raw.publish(keys.JOB_OUTPUT_CHANNEL, b"\xff\xfe")
        await asyncio.sleep(0.2)
        event.clear()
        for _ in range(2):  # the next messages still wake the job's followers
            redis_client.publish(keys.JOB_OUTPUT_CHANNEL, JOB_A)
            assert await woken(event)
            event.clear()
        raw.close()
