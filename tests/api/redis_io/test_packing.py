"""Commands packed by hiredis (api/redis_io/packing.py): the same bytes as redis-py's own asyncio
packer for every argument the API sends, the same refusals, and the API's clients (TCP and TLS
alike) use it; against the suite's real Redis, a command so packed is answered."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import redis.asyncio as aioredis
import redis.exceptions

from api.redis_io import client as clients
from api.redis_io.packing import HiredisPacking, pack_command
from shared.config import Settings

pytestmark = pytest.mark.anyio

COMMANDS: list[tuple[Any, ...]] = [
    ("SET", "key", "välue"),
    ("EVALSHA", "abc", 2, "k1", "k2", 1.5, -3, 10**20, 0.1, b"\x00\xff", bytearray(b"ba"), memoryview(b"mv")),
    ("SCRIPT LOAD", "return 1"),  # a name of two words: two arguments on the wire
    (b"CLIENT SETINFO", b"LIB-NAME", "genq"),
    ("HSET", "h", "payload", "x" * 100_000),  # past redis-py's 6,000-byte chunks
]


def redis_pys(*args: Any) -> bytes:
    return b"".join(aioredis.Connection().pack_command(*args))


@pytest.mark.parametrize("args", COMMANDS)
def test_the_same_bytes_as_redis_pys_packer(args: tuple[Any, ...]) -> None:
    assert b"".join(pack_command(*args)) == redis_pys(*args)


@pytest.mark.parametrize(
    ("bad", "error"),
    [(True, redis.exceptions.DataError), (None, redis.exceptions.DataError), ("\ud800", UnicodeEncodeError)],
)
def test_the_same_refusals(bad: object, error: type[Exception]) -> None:
    with pytest.raises(error):
        redis_pys("SET", "key", bad)
    with pytest.raises(error):
        pack_command("SET", "key", bad)


@pytest.mark.parametrize(
    ("url", "scheme_class"),
    [
        ("redis://127.0.0.1:1/0", aioredis.Connection),
        ("rediss://127.0.0.1:1/0", aioredis.SSLConnection),
        ("unix:///tmp/none.sock", aioredis.UnixDomainSocketConnection),
    ],
)
def test_the_api_clients_pack_with_hiredis_whatever_the_scheme(
    make_settings: Callable[..., Settings], url: str, scheme_class: type[aioredis.Connection]
) -> None:
    settings = make_settings(redis_url=url)
    for client in (clients.redis_client(settings), clients.listener_client(settings)):
        connection_class = client.connection_pool.connection_class
        assert issubclass(connection_class, HiredisPacking) and issubclass(connection_class, scheme_class)


async def test_a_command_so_packed_is_answered(settings: Settings) -> None:
    client = clients.redis_client(settings)
    try:
        assert await client.set("key", "välue") is True
        assert await client.get("key") == "välue"
        assert await client.script_load("return 1")  # "SCRIPT LOAD": two words, sent as two
    finally:
        await client.aclose()
