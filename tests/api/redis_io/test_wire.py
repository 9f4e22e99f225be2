"""The adapter (api/redis_io/wire.py) against the suite's real Redis and the pinned redis-py: the
contract it reads (the private names of redis==8.1.0, failing here first when an upgrade changes
them), what only one connection read by the API gives (every command of a turn on the same
connection, an undecodable reply failing its own command only, a LOADING reply failing with
redis-py's error), and the fence: a take-over that breaks falls back on redis-py's pipelines at
start-up, fails later commands as a redis-py ConnectionError, and leaves no connection behind."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import pytest
import redis
import redis.asyncio as aioredis
import redis.exceptions

from api.redis_io import wire
from api.redis_io.batching import BatchedCommands, PipelineLink
from api.redis_io.commands import open_commands
from api.redis_io.wire import TakeOverFailed, WireLink
from shared.config import Settings
from shared.logging import FIELDS
from tests.conftest import api_client

pytestmark = pytest.mark.anyio


# --- the contract -----------------------------------------------------------------------------------
def test_the_pinned_redis_py() -> None:
    """The private names below are those of this version: an upgrade must re-check them."""
    assert redis.__version__ == "8.1.0"


async def test_a_connected_connection_has_the_writer_and_close_the_take_over_uses(
    aclient: aioredis.Redis,
) -> None:
    connection = aclient.connection_pool.make_connection()  # type: ignore[no-untyped-call]  # unannotated in redis-py
    await connection.connect()
    transport = connection._writer.transport
    assert isinstance(transport, asyncio.Transport) and not transport.is_closing()
    connection._close()
    assert transport.is_closing()


def test_redis_pys_error_reply_parser_gives_its_own_error_classes() -> None:
    from redis._parsers import BaseParser

    parse: Callable[[str], Exception] = BaseParser.parse_error  # unannotated in redis-py
    assert isinstance(
        parse("LOADING Redis is loading the dataset in memory"), redis.exceptions.BusyLoadingError
    )
    assert isinstance(parse("NOSCRIPT No matching script"), redis.exceptions.NoScriptError)
    assert isinstance(parse("NOPERM no permissions"), redis.exceptions.NoPermissionError)
    assert type(parse("WRONGTYPE Operation against a key")) is redis.exceptions.ResponseError


# --- what one connection read by the API gives --------------------------------------------------------
async def test_concurrent_commands_share_one_connection(aclient: aioredis.Redis) -> None:
    commands = BatchedCommands(aclient, WireLink(aclient))
    ids = await asyncio.gather(*(commands.execute("CLIENT", "ID") for _ in range(100)))
    later = await commands.execute("CLIENT", "ID")
    assert len({*ids, later}) == 1
    await commands.aclose()


async def test_an_undecodable_reply_fails_only_its_own_command(aclient: aioredis.Redis) -> None:
    """The commands answered before and after it in the same read get their replies, and the
    connection stays."""
    commands = BatchedCommands(aclient, WireLink(aclient))
    await aclient.set(b"raw", b"\xff\xfe not utf-8")
    connection = await commands.execute("CLIENT", "ID")
    replies = await asyncio.gather(
        commands.execute("SET", "a", "1"),
        commands.execute("GET", "raw"),
        commands.execute("GET", "a"),
        return_exceptions=True,
    )
    ok, undecodable, after = replies
    assert ok is True and after == "1"
    assert isinstance(undecodable, UnicodeDecodeError)
    assert await commands.execute("CLIENT", "ID") == connection
    await commands.aclose()


async def test_a_loading_reply_fails_its_command(aclient: aioredis.Redis) -> None:
    """Right after a restart Redis answers "-LOADING ..." while it replays its AOF: the command
    fails with redis-py's BusyLoadingError (a ConnectionError: 503 at the API), not returned as
    its reply (a caller then indexed the error object: a bare 500, seen in the chaos soak). The
    bytes are Redis's own reply; a live server in that state answers only between chunks of its
    load (racy to catch)."""
    replies = await wire._Replies.open(aclient)
    future: asyncio.Future[object] = asyncio.get_running_loop().create_future()
    replies._waiting.append((future, None, 0.0))
    replies.data_received(b"-LOADING Redis is loading the dataset in memory\r\n")
    with pytest.raises(redis.exceptions.BusyLoadingError):
        await future
    replies.close()


# --- the fence --------------------------------------------------------------------------------------
def broken_take_over(*args: object) -> None:
    """What a redis-py upgrade that renamed a private name would do to the take-over."""
    raise AttributeError("'Connection' object has no attribute '_writer'")


async def connected_clients(client: aioredis.Redis) -> set[str]:
    """The ids of the connections Redis holds (ids, not a count: an earlier test's connection that
    closes meanwhile must not pass for the one a take-over failed to close)."""
    return {entry["id"] for entry in await client.client_list()}


async def test_a_take_over_that_breaks_falls_back_on_redis_pys_pipelines(
    aclient: aioredis.Redis, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    before = await connected_clients(aclient)
    monkeypatch.setattr(wire, "take_over", broken_take_over)
    caplog.set_level(logging.WARNING, logger="genq.api")
    commands = await open_commands(aclient)
    assert isinstance(commands, BatchedCommands) and isinstance(commands._link, PipelineLink)
    [record] = [r for r in caplog.records if r.getMessage() == "redis_wire_off"]
    assert "_writer" in getattr(record, FIELDS)["error"]
    await commands.execute("SET", "fenced", "1")
    assert await commands.execute("GET", "fenced") == "1"
    assert await connected_clients(aclient) <= before  # the connection opened for the take-over is closed


async def test_a_take_over_that_breaks_later_fails_its_commands_as_a_redis_error(
    aclient: aioredis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Not a bare exception (a 500 on every request): a redis-py ConnectionError, which the API
    answers with 503; the connection opened for it is closed, not leaked on every try."""
    before = await connected_clients(aclient)
    commands = BatchedCommands(aclient, WireLink(aclient))
    monkeypatch.setattr(wire, "take_over", broken_take_over)
    for _ in range(3):
        with pytest.raises(redis.exceptions.ConnectionError) as raised:
            await commands.execute("PING")
        assert isinstance(raised.value, TakeOverFailed)
    assert await connected_clients(aclient) <= before


async def test_the_wire_can_be_turned_off(aclient: aioredis.Redis) -> None:
    on = await open_commands(aclient)
    off = await open_commands(aclient, wire=False)
    assert isinstance(on, BatchedCommands) and isinstance(on._link, WireLink)
    assert isinstance(off, BatchedCommands) and isinstance(off._link, PipelineLink)
    await on.aclose()


async def test_the_api_serves_through_the_fallback(
    make_settings: Callable[..., Settings], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(wire, "take_over", broken_take_over)
    async with api_client(make_settings()) as api:
        submitted = await api.post("/v1/jobs", json={"prompt": "through the fallback"})
        assert submitted.status_code == 202
        assert (await api.get(submitted.headers["location"])).json()["status"] == "queued"
