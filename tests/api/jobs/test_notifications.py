"""api/jobs/notifications.py: what the API's two listeners share, through both of them (JobEvents
for jobs that may have ended, StreamHub for streams that got entries): a message wakes its job's
waiters only, a waiter that left is woken no more, a lost subscription wakes every waiter (and
again once it is back), Redis out of reach wakes every waiter at each failed try and logs
`<name>_reconnect`, a stopped listener tries no more and leaves no connection behind (real
Redis; a closed port for the unreachable one)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import AsyncIterator, Callable, Iterator

import pytest
import redis
import redis.asyncio as aioredis

from api.jobs import notifications
from api.jobs.events import JobEvents
from api.jobs.stream_hub import StreamHub
from cli.redis_server import EmbeddedRedis
from shared import keys
from tests.api.conftest import woken

pytestmark = pytest.mark.anyio

JOB_A = "6f1c0a2e-8b1d-4c3e-9f00-00000000000a"
JOB_B = "6f1c0a2e-8b1d-4c3e-9f00-00000000000b"

Listener = JobEvents | StreamHub
#: Each listener, its channel, and how a request registers a waiter with it.
KINDS: dict[str, tuple[type[Listener], str]] = {
    "job_events": (JobEvents, keys.JOB_EVENTS_CHANNEL),
    "stream_hub": (StreamHub, keys.JOB_OUTPUT_CHANNEL),
}


def waiting(
    listener: Listener, job_id: str, event: asyncio.Event
) -> contextlib.AbstractContextManager[object]:
    if isinstance(listener, JobEvents):
        return listener.watch(job_id, event)
    return listener.follow(job_id, event)


@contextlib.contextmanager
def registered(listener: Listener, *jobs: str) -> Iterator[list[asyncio.Event]]:
    with contextlib.ExitStack() as stack:
        events = [asyncio.Event() for _ in jobs]
        for job_id, event in zip(jobs, events, strict=True):
            stack.enter_context(waiting(listener, job_id, event))
        yield events


@contextlib.asynccontextmanager
async def running(make: Callable[[], Listener]) -> AsyncIterator[Listener]:
    listener = make()
    listener.start()
    try:
        yield listener
    finally:
        await listener.stop()


async def subscribed(client: redis.Redis, channel: str, event: asyncio.Event) -> None:
    """Until the listener's subscription is in place, then with `event` (set by the wake-all
    that follows every subscription) cleared."""
    for _ in range(200):
        if client.pubsub_numsub(channel)[0][1] >= 1:
            await woken(event, 1.0)
            event.clear()
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"nothing subscribed to {channel}")


def listener_of(kind: str, redis_server: EmbeddedRedis) -> Listener:
    cls, _ = KINDS[kind]
    return cls(aioredis.Redis.from_url(redis_server.url, max_connections=1))  # as listener_client


async def assert_a_message_wakes_its_jobs_waiters_only(
    listener: Listener, redis_client: redis.Redis, channel: str
) -> None:
    with registered(listener, JOB_A, JOB_B) as (a, b):
        await subscribed(redis_client, channel, a)
        b.clear()
        redis_client.publish(channel, JOB_A)
        assert await woken(a)
        assert not await woken(b, 0.3)


@pytest.mark.parametrize("kind", KINDS)
async def test_a_message_wakes_its_jobs_waiters_and_a_waiter_that_left_no_more(
    kind: str, redis_server: EmbeddedRedis, redis_client: redis.Redis
) -> None:
    _, channel = KINDS[kind]
    async with running(lambda: listener_of(kind, redis_server)) as listener:
        await assert_a_message_wakes_its_jobs_waiters_only(listener, redis_client, channel)
        with registered(listener, JOB_A) as (left,):
            pass
        redis_client.publish(channel, JOB_A)
        assert not await woken(left, 0.3)


@pytest.mark.parametrize("kind", KINDS)
async def test_redis_out_of_reach_wakes_every_waiter_at_each_try_and_a_stopped_listener_tries_no_more(
    kind: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Waiters read for themselves while the listener cannot tell them anything; operators see
    `<name>_reconnect`; once stopped, a listener whose Redis is away neither retries nor wakes."""
    monkeypatch.setattr(notifications, "RECONNECT_S", 0.05)
    cls, _ = KINDS[kind]
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        closed = sock.getsockname()[1]
    listener = cls(aioredis.Redis.from_url(f"redis://127.0.0.1:{closed}/0", max_connections=1))
    caplog.set_level(logging.WARNING, logger="genq.api")
    listener.start()
    with registered(listener, JOB_A, JOB_B) as (a, b):
        try:
            assert await woken(a) and await woken(b)
            a.clear()
            assert await woken(a)  # and again at the next failed try
        finally:
            await listener.stop()
        a.clear()
        assert not await woken(a, 0.4)  # ~8 retry periods: none came
    assert f"{kind}_reconnect" in [record.getMessage() for record in caplog.records]


@pytest.mark.parametrize("kind", KINDS)
async def test_a_lost_subscription_wakes_every_waiter_and_again_once_back(
    kind: str, redis_server: EmbeddedRedis, redis_client: redis.Redis
) -> None:
    """A job may have moved while the subscription was down: each waiter re-reads for itself, when
    it is lost and once Redis confirmed it again (what it read in between may be stale)."""
    _, channel = KINDS[kind]
    async with running(lambda: listener_of(kind, redis_server)) as listener:
        with registered(listener, JOB_A, JOB_B) as (a, b):
            await subscribed(redis_client, channel, a)
            b.clear()
            assert redis_client.client_kill_filter(_type="pubsub", skipme=True) == 1
            assert await woken(a) and await woken(b)
            a.clear()
            await subscribed(redis_client, channel, a)
            redis_client.publish(channel, JOB_A)
            assert await woken(a)


@pytest.mark.parametrize("kind", KINDS)
async def test_a_stopped_listener_leaves_no_connection_behind(
    kind: str, redis_server: EmbeddedRedis, redis_client: redis.Redis
) -> None:
    before = connections(redis_client)
    async with running(lambda: listener_of(kind, redis_server)) as listener:
        with registered(listener, JOB_A) as (a,):
            await subscribed(redis_client, KINDS[kind][1], a)
            assert len(connections(redis_client) - before) == 1  # its subscription's, and no other
    for _ in range(100):
        if not connections(redis_client) - before:
            break
        await asyncio.sleep(0.02)
    assert connections(redis_client) - before == set()


def connections(client: redis.Redis) -> set[str]:
    """The ids of the connections Redis holds (ids, not a count: an earlier test's connection that
    closes meanwhile must not pass for one left behind)."""
    return {entry["id"] for entry in client.client_list()}
