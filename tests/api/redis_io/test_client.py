"""The API's Redis clients (api/redis_io/client.py): with Redis away a command fails at once, not
after retries that hold the request; a listener's client reads bytes over one connection."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable

import pytest
import redis
import redis.exceptions

from api.redis_io import client as clients
from shared.config import Settings

pytestmark = pytest.mark.anyio


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def test_with_redis_away_a_command_fails_at_once(make_settings: Callable[..., Settings]) -> None:
    settings = make_settings(redis_url=f"redis://127.0.0.1:{closed_port()}/0")
    client = clients.redis_client(settings)
    started = time.monotonic()
    with pytest.raises(redis.exceptions.ConnectionError):
        await client.get("anything")
    assert time.monotonic() - started < 1.0  # the API answers 503 at once, not after retries
    await client.aclose()


async def test_the_api_client_decodes_and_the_listener_client_reads_bytes(
    settings: Settings, redis_client: redis.Redis
) -> None:
    redis_client.set("k", "v")
    api, listener = clients.redis_client(settings), clients.listener_client(settings)
    assert await api.get("k") == "v"
    assert await listener.get("k") == b"v"
    assert listener.connection_pool.max_connections == 1
    await api.aclose()
    await listener.aclose()
    reaper = clients.sync_redis_client(settings)
    assert reaper.get("k") == "v"
    reaper.close()
