"""The API's pub/sub subscription (api/redis_io/subscription.py) against the suite's real Redis:
every message published after the confirmation reaches the callback, in order and as bytes; a
subscription redis-py renews after a lost connection is confirmed again; a connection lost for
good, a SUBSCRIBE that Redis refuses and a Redis out of reach each end it with redis-py's error;
aclose() leaves no connection behind. How the listeners use it is tested in
tests/api/jobs/test_notifications.py."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator

import pytest
import redis
import redis.asyncio as aioredis
import redis.exceptions
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from api.redis_io.subscription import Subscription
from cli.redis_server import EmbeddedRedis

pytestmark = pytest.mark.anyio

CHANNEL = "genq:test:subscription"


@pytest.fixture
async def aclient(redis_server: EmbeddedRedis, redis_client: redis.Redis) -> AsyncIterator[aioredis.Redis]:
    # As the API's listener_client: one connection, no retries, replies as bytes.
    client = aioredis.Redis.from_url(redis_server.url, max_connections=1, retry=Retry(NoBackoff(), 0))
    yield client
    await client.aclose()


def subscribers(client: redis.Redis) -> int:
    return int(client.pubsub_numsub(CHANNEL)[0][1])


async def test_every_message_reaches_the_callback_in_order_as_bytes(
    aclient: aioredis.Redis, redis_client: redis.Redis
) -> None:
    got: list[bytes] = []
    subscription = await Subscription.open(aclient, CHANNEL, got.append)
    try:
        await subscription.confirmed(5.0)
        assert subscribers(redis_client) == 1
        sent = [f"job-{i}".encode() for i in range(300)] + [b"\xff\xfe"]  # the last is no UTF-8
        pipe = redis_client.pipeline(transaction=False)
        for data in sent:
            pipe.publish(CHANNEL, data)
        pipe.execute()  # one write: many messages come in one read
        for _ in range(100):
            if len(got) == len(sent):
                break
            await subscription.held_for(0.02)
        assert got == sent
    finally:
        await subscription.aclose()


async def test_a_client_that_decodes_is_refused(redis_server: EmbeddedRedis) -> None:
    """Its PubSub would fail on the first message that is no UTF-8, which anyone who can PUBLISH
    can send."""
    client = aioredis.Redis.from_url(redis_server.url, decode_responses=True)
    with pytest.raises(ValueError, match="decode_responses"):
        await Subscription.open(client, CHANNEL, lambda data: None)
    await client.aclose()


async def test_held_for_returns_while_the_subscription_holds(aclient: aioredis.Redis) -> None:
    subscription = await Subscription.open(aclient, CHANNEL, lambda data: None)
    try:
        await subscription.confirmed(5.0)
        await subscription.held_for(0.05)
    finally:
        await subscription.aclose()


async def test_a_lost_connection_ends_it_with_redis_pys_connection_error(
    aclient: aioredis.Redis, redis_client: redis.Redis
) -> None:
    subscription = await Subscription.open(aclient, CHANNEL, lambda data: None)
    try:
        await subscription.confirmed(5.0)
        assert redis_client.client_kill_filter(_type="pubsub", skipme=True) == 1
        async with asyncio.timeout(5.0):  # at once: not at the end of the 60 s it was asked to hold
            with pytest.raises(redis.exceptions.ConnectionError):
                await subscription.held_for(60.0)
    finally:
        await subscription.aclose()


async def test_a_subscription_redis_py_renews_is_confirmed_again(
    redis_server: EmbeddedRedis, redis_client: redis.Redis
) -> None:
    """A client that retries: redis-py reconnects and subscribes again by itself, and messages
    published meanwhile were lost, so the holder is told (on_subscribed) and messages flow again."""
    client = aioredis.Redis(port=redis_server.port, max_connections=1)  # redis-py retries by default
    got: list[bytes] = []
    confirmations = asyncio.Queue[None]()
    subscription = await Subscription.open(
        client, CHANNEL, got.append, lambda: confirmations.put_nowait(None)
    )
    try:
        await subscription.confirmed(5.0)
        await asyncio.wait_for(confirmations.get(), 5.0)
        assert redis_client.client_kill_filter(_type="pubsub", skipme=True) == 1
        await asyncio.wait_for(confirmations.get(), 5.0)
        redis_client.publish(CHANNEL, b"after")
        for _ in range(100):
            if got:
                break
            await subscription.held_for(0.02)
        assert got == [b"after"]
    finally:
        await subscription.aclose()
        await client.aclose()


async def test_a_subscribe_redis_refuses_ends_it_with_redis_pys_error(
    redis_server: EmbeddedRedis, redis_client: redis.Redis
) -> None:
    """An ACL user who may not subscribe: Redis's -NOPERM answer, as redis-py raises it."""
    redis_client.acl_setuser(
        "nosub", enabled=True, passwords=["+pw"], keys=["~*"], commands=["+@all", "-subscribe"]
    )
    client = aioredis.Redis(port=redis_server.port, username="nosub", password="pw")
    try:
        subscription = await Subscription.open(client, CHANNEL, lambda data: None)
        with pytest.raises(redis.exceptions.NoPermissionError):
            await subscription.confirmed(5.0)
        with pytest.raises(redis.exceptions.NoPermissionError):
            await subscription.held_for(5.0)
        await subscription.aclose()
        assert [c for c in redis_client.client_list() if c["user"] == "nosub"] == []  # closed
    finally:
        await client.aclose()
        redis_client.acl_deluser("nosub")


async def test_redis_out_of_reach_fails_the_open_with_redis_pys_error() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        closed = sock.getsockname()[1]
    client = aioredis.Redis(port=closed, socket_connect_timeout=1.0)
    with pytest.raises(redis.exceptions.ConnectionError):
        await Subscription.open(client, CHANNEL, lambda data: None)
    await client.aclose()


async def test_aclose_unsubscribes_and_ends_its_waits(
    aclient: aioredis.Redis, redis_client: redis.Redis
) -> None:
    subscription = await Subscription.open(aclient, CHANNEL, lambda data: None)
    await subscription.confirmed(5.0)
    await subscription.aclose()
    async with asyncio.timeout(5.0):
        await subscription.held_for(60.0)  # returns at once: closed by us, no error
    for _ in range(100):
        if subscribers(redis_client) == 0:
            break
        await asyncio.sleep(0.02)
    assert subscribers(redis_client) == 0
