"""The API's Redis clients, built in one place: how long a command may wait, and that nothing
retries, are decisions about what a caller sees when Redis is away; their connections pack
commands with hiredis (packing.py)."""

from __future__ import annotations

from typing import Any

import redis
import redis.asyncio as aioredis
from redis.asyncio.connection import parse_url
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from api.redis_io.packing import with_hiredis_packing
from shared.config import Settings

#: The API's pool: far more than its requests ever hold at once (batching shares connections).
MAX_CONNECTIONS = 512


def _async_options() -> dict[str, Any]:
    # Short connect timeout and no retries: when Redis is down the API answers 503 at once
    # instead of holding requests; the pool reconnects by itself when it is back.
    return {"socket_connect_timeout": 1.0, "socket_timeout": 5.0, "retry": Retry(NoBackoff(), 0)}


def _async_client(url: str, **options: Any) -> aioredis.Redis:
    """As `Redis.from_url(url, **options)`, its connections of the class the URL's scheme
    chooses, packing with hiredis."""
    from_url = parse_url(url)
    base = from_url.pop("connection_class", aioredis.Connection)
    connection_class = with_hiredis_packing(base)
    pool = aioredis.ConnectionPool(connection_class, **{**options, **_async_options(), **from_url})
    return aioredis.Redis.from_pool(pool)  # closing the client closes its pool


def redis_client(settings: Settings, max_connections: int = MAX_CONNECTIONS) -> aioredis.Redis:
    """The client the API's requests share: replies decoded as UTF-8 text."""
    return _async_client(settings.require_redis_url(), decode_responses=True, max_connections=max_connections)


def listener_client(settings: Settings) -> aioredis.Redis:
    """A client of one connection for one pub/sub subscription (subscription.py): its messages
    come as bytes, so one that is no UTF-8 is the listener's to judge, not a failed read."""
    return _async_client(settings.require_redis_url(), max_connections=1)


def sync_redis_client(settings: Settings) -> redis.Redis:
    """The reaper's own blocking client (it runs on a thread of its own, off the event loop)."""
    return redis.Redis.from_url(
        settings.require_redis_url(), decode_responses=True, socket_connect_timeout=1.0, socket_timeout=5.0
    )
