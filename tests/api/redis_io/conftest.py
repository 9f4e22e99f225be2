"""What the tests of the API's Redis I/O share: an asyncio client on the suite's Redis that
decodes replies, as the API's own does (api/redis_io/client.py)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
import redis
import redis.asyncio as aioredis

from cli.redis_server import EmbeddedRedis


@pytest.fixture
async def aclient(redis_server: EmbeddedRedis, redis_client: redis.Redis) -> AsyncIterator[aioredis.Redis]:
    async_client = aioredis.Redis.from_url(redis_server.url, decode_responses=True)
    yield async_client
    await async_client.aclose()
