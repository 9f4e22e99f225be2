"""The API's pub/sub subscription read by its own Protocol (api/edge/subscription.py), against the
suite's real Redis: every message published after the confirmation reaches the callback, in
order and as bytes (whatever the client decodes); a lost connection, a SUBSCRIBE that Redis
refuses and a Redis out of reach each end it with redis-py's error at once; close() leaves no
connection behind. How the listeners use it, and their fallback on redis-py's PubSub, is
tested in tests/api/jobs/test_wakes.py."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator

import pytest
import redis
import redis.asyncio as aioredis
import redis.exceptions

from api.edge.subscription import Subscription
from cli.redis_server import EmbeddedRedis

pytestmark = pytest.mark.anyio

CHANNEL = "genq:test:subscription"


@pytest.fixture
async def aclient(redis_server: EmbeddedRedis, redis_client: redis.Redis) -> AsyncIterator[aioredis.Redis]:
    # decode_responses as the API's client: the subscription still hands over bytes
    client = aioredis.Redis.from_url(redis_server.url, decode_responses=True)
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
        subscription.close()


async def test_held_for_returns_while_the_subscription_holds(aclient: aioredis.Redis) -> None:
    subscription = await Subscription.open(aclient, CHANNEL, lambda data: None)
    try:
        await subscription.confirmed(5.0)
        await subscription.held_for(0.05)
    finally:
        subscription.close()


async def test_a_lost_connection_ends_it_with_redis_pys_connection_error(
    aclient: aioredis.Redis, redis_client: redis.Redis
) -> None:
    subscription = await Subscription.open(aclient, CHANNEL, lambda data: None)
    await subscription.confirmed(5.0)
    assert redis_client.client_kill_filter(_type="pubsub", skipme=True) == 1
    async with asyncio.timeout(5.0):  # at once: not at the end of the 60 s it was asked to hold
        with pytest.raises(redis.exceptions.ConnectionError):
            await subscription.held_for(60.0)


async def test_a_subscribe_redis_refuses_ends_it_with_redis_pys_error(
    redis_server: EmbeddedRedis, redis_client: redis.Redis
) -> None:
    """An ACL user who may not subscribe: Redis's -NOPERM answer, as redis-py would raise it."""
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


async def test_close_unsubscribes_and_ends_its_waits(
    aclient: aioredis.Redis, redis_client: redis.Redis
) -> None:
    subscription = await Subscription.open(aclient, CHANNEL, lambda data: None)
    await subscription.confirmed(5.0)
    subscription.close()
    async with asyncio.timeout(5.0):
        await subscription.held_for(60.0)  # returns at once: closed by us, no error
    for _ in range(100):
        if subscribers(redis_client) == 0:
            break
        await asyncio.sleep(0.02)
    assert subscribers(redis_client) == 0
