"""Automatic pipelining (api/redis_io/batching.py) against the suite's real Redis, through both
links (`wire`: one connection the API reads itself, api/redis_io/wire.py; `pipelines`: redis-py's):
concurrent commands share round trips and a few connections, each keeps its own reply or error,
scripts survive a SCRIPT FLUSH, a server that goes away or stops answering fails what waits on it
with redis-py's errors, and the next command is answered once it is back."""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Callable
from pathlib import Path
from typing import cast

import pytest
import redis
import redis.asyncio as aioredis
import redis.exceptions
from prometheus_client import REGISTRY
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from api.redis_io.batching import MAX_BATCH, MAX_IN_FLIGHT, BatchedCommands, PipelineLink
from api.redis_io.wire import WireLink
from cli.redis_server import EmbeddedRedis

pytestmark = pytest.mark.anyio

#: As the API's client (api/redis_io/client.py): a failure reaches the caller at once.
NO_RETRY = Retry(NoBackoff(), 0)

Make = Callable[..., BatchedCommands]


@pytest.fixture(params=["wire", "pipelines"])
def make(request: pytest.FixtureRequest) -> Make:
    """BatchedCommands on a client, through the link the test runs with."""

    def batched(
        client: aioredis.Redis, max_batch: int = MAX_BATCH, max_in_flight: int = MAX_IN_FLIGHT
    ) -> BatchedCommands:
        link = WireLink(client) if request.param == "wire" else PipelineLink(client, max_in_flight)
        return BatchedCommands(client, link, max_batch)

    return batched


def batches() -> tuple[float, float]:
    """(pipelines, commands) sent so far by every BatchedCommands of this process."""
    count = REGISTRY.get_sample_value("genq_api_redis_batch_commands_count") or 0.0
    total = REGISTRY.get_sample_value("genq_api_redis_batch_commands_sum") or 0.0
    return count, total


async def test_concurrent_commands_share_round_trips(aclient: aioredis.Redis, make: Make) -> None:
    commands = make(aclient)
    await aclient.hset("h", mapping={"a": "1", "b": "2"})
    trips_before, sent_before = batches()
    replies = await asyncio.gather(
        *(commands.execute("INCRBY", f"n{i % 10}", i) for i in range(200)),
        *(commands.execute("HGETALL", "h") for _ in range(50)),
    )
    trips, sent = batches()
    assert sent - sent_before == 250
    assert trips - trips_before <= 3  # all issued in one loop turn: one pipeline (or a few)
    assert replies[200:] == [{"a": "1", "b": "2"}] * 50  # redis-py's response callbacks applied
    assert sum([int(cast(str, await aclient.get(f"n{k}"))) for k in range(10)]) == sum(range(200))


async def test_an_error_reply_fails_only_its_own_command(aclient: aioredis.Redis, make: Make) -> None:
    commands = make(aclient)
    await aclient.set("text", "not a hash")
    replies = await asyncio.gather(
        commands.execute("SET", "a", "1"),
        commands.execute("HGETALL", "text"),
        commands.execute("GET", "a"),
        return_exceptions=True,
    )
    ok, wrong, also_ok = replies  # unpacked apart: mypy cannot type the unpacking of an awaited gather
    assert ok is True and also_ok == "1"
    assert isinstance(wrong, redis.exceptions.ResponseError) and "WRONGTYPE" in str(wrong)


async def test_a_bad_argument_fails_only_its_own_command(aclient: aioredis.Redis, make: Make) -> None:
    commands = make(aclient)
    replies = await asyncio.gather(
        commands.execute("SET", "a", "1"), commands.execute("SET", "b", True), return_exceptions=True
    )
    ok, refused = replies
    assert ok is True
    assert isinstance(refused, redis.exceptions.DataError)
    assert await aclient.exists("b") == 0


async def test_an_unencodable_argument_fails_only_its_own_command(
    aclient: aioredis.Redis, make: Make
) -> None:
    """A str with a lone surrogate cannot be UTF-8: its command fails with the UnicodeEncodeError
    redis-py's client would raise, and the others of the same loop turn are sent and answered."""
    commands = make(aclient)
    replies = await asyncio.wait_for(
        asyncio.gather(
            commands.execute("SET", "a", "1"),
            commands.execute("SET", "bad", "\ud800"),
            commands.execute("INCR", "n"),
            return_exceptions=True,
        ),
        timeout=10,  # a bound on a hang (the fault: futures never settled), not a timing check
    )
    ok, refused, counted = replies
    assert ok is True and counted == 1
    assert isinstance(refused, UnicodeEncodeError)
    assert await aclient.exists("bad") == 0
    assert await commands.execute("GET", "a") == "1"


async def test_an_undecodable_reply_fails_its_command_and_the_next_command_is_answered(
    aclient: aioredis.Redis, make: Make
) -> None:
    """Bytes that are not UTF-8 on a decoding client fail the command they answer (through
    pipelines, redis-py's read of the whole pipeline ends there: its other commands fail too), none
    hangs, and the next command gets its reply on a connection in step."""
    commands = make(aclient)
    await aclient.set(b"raw", b"\xff\xfe not utf-8")
    replies = await asyncio.wait_for(
        asyncio.gather(
            commands.execute("SET", "a", "1"),
            commands.execute("GET", "raw"),
            commands.execute("GET", "a"),
            return_exceptions=True,
        ),
        timeout=10,
    )
    assert isinstance(replies[1], UnicodeDecodeError)
    assert await commands.execute("GET", "a") == "1"
    assert await commands.execute("LRANGE", "nothing", 0, -1) == []


async def test_commands_in_order_run_one_after_another_in_one_pipeline(
    aclient: aioredis.Redis, make: Make
) -> None:
    """execute_in_order: each command runs after the one before it, and the replies come back in
    order, with redis-py's callbacks applied, in one round trip."""
    commands = make(aclient)
    await aclient.hset("h", mapping={"n": "0"})
    trips_before, sent_before = batches()
    replies = await commands.execute_in_order(
        ("HINCRBY", "h", "n", 1), ("HGETALL", "h"), ("HINCRBY", "h", "n", 1), ("HGETALL", "h")
    )
    assert replies == [1, {"n": "1"}, 2, {"n": "2"}]
    trips, sent = batches()
    assert (trips - trips_before, sent - sent_before) == (1, 4)


async def test_commands_in_order_are_not_split_across_pipelines(aclient: aioredis.Redis, make: Make) -> None:
    """A pipeline that fills up (max_batch) takes the whole of an in-order group rather than part:
    two pipelines on two connections could run its commands in either order."""
    commands = make(aclient, max_batch=2)
    single = commands.execute("SET", "x", "0")
    ordered = commands.execute_in_order(("CLIENT", "ID"), ("INCR", "n"), ("INCR", "n"), ("CLIENT", "ID"))
    _, (first, one, two, last) = await asyncio.gather(single, ordered)
    assert first == last and (one, two) == (1, 2)  # one connection: one pipeline


async def test_commands_in_order_raise_the_first_error_once_all_answered(
    aclient: aioredis.Redis, make: Make
) -> None:
    """An error reply fails the whole call with that error (redis-py's), but the commands after
    it still ran: they were sent in the same pipeline."""
    commands = make(aclient)
    await aclient.set("text", "not a hash")
    with pytest.raises(redis.exceptions.ResponseError, match="WRONGTYPE"):
        await commands.execute_in_order(("HGETALL", "text"), ("SET", "after", "1"))
    assert await aclient.get("after") == "1"


async def test_concurrent_commands_hold_a_few_connections_however_many(
    aclient: aioredis.Redis, make: Make
) -> None:
    """Thousands of commands at once (a hub reconnect wakes every follower) go out as full pipelines,
    MAX_IN_FLIGHT at a time: the pool is never run dry by one burst."""
    commands = make(aclient)
    ids = await asyncio.gather(*(commands.execute("CLIENT", "ID") for _ in range(3000)))
    assert len(set(ids)) <= MAX_IN_FLIGHT
    await commands.aclose()


async def test_aclose_waits_for_the_commands_already_issued(aclient: aioredis.Redis, make: Make) -> None:
    """What was issued before aclose() is sent and answered, however many pipelines it takes."""
    commands = make(aclient, max_in_flight=1)
    issued = [asyncio.ensure_future(commands.execute("INCR", "n")) for _ in range(600)]
    await asyncio.sleep(0)  # all queued: three pipelines' worth, one out at a time
    await commands.aclose()
    assert await aclient.get("n") == "600"
    assert sorted(await asyncio.gather(*issued)) == list(range(1, 601))


async def test_scripts_are_reloaded_after_a_flush(aclient: aioredis.Redis, make: Make) -> None:
    commands = make(aclient)
    script = aclient.register_script("return redis.call('INCRBY', KEYS[1], ARGV[1])")
    assert await commands.run_script(script, ["counter"], [5]) == 5
    await aclient.script_flush()
    again = await asyncio.gather(*(commands.run_script(script, ["counter"], [1]) for _ in range(3)))
    assert sorted(again) == [6, 7, 8]
    assert int(cast(str, await aclient.get("counter"))) == 8


async def test_a_lost_server_fails_the_batch_and_the_next_one_reconnects(tmp_path: Path, make: Make) -> None:
    server = EmbeddedRedis(tmp_path / "redis", appendonly=False)
    server.start()
    client = aioredis.Redis.from_url(
        server.url, decode_responses=True, socket_connect_timeout=1, retry=NO_RETRY
    )
    commands = make(client)
    try:
        assert await commands.execute("SET", "k", "v") is True
        server.stop()
        gets = (commands.execute("GET", "k") for _ in range(5))
        failures = await asyncio.gather(*gets, return_exceptions=True)
        assert all(isinstance(f, redis.exceptions.ConnectionError) for f in failures), failures
        server.start()
        assert await commands.execute("PING") is True
    finally:
        await commands.aclose()
        await client.aclose()
        server.stop()


async def test_a_server_that_stops_answering_times_out_and_the_next_command_reconnects(
    tmp_path: Path, make: Make
) -> None:
    server = EmbeddedRedis(tmp_path / "redis", appendonly=False)
    server.start()
    assert server.process is not None
    client = aioredis.Redis.from_url(server.url, decode_responses=True, socket_timeout=0.5, retry=NO_RETRY)
    commands = make(client)
    try:
        assert await commands.execute("SET", "k", "v") is True
        os.kill(server.process.pid, signal.SIGSTOP)
        try:
            gets = (commands.execute("GET", "k") for _ in range(3))
            failures = await asyncio.wait_for(asyncio.gather(*gets, return_exceptions=True), 10)
        finally:
            os.kill(server.process.pid, signal.SIGCONT)
        assert all(isinstance(f, redis.exceptions.TimeoutError) for f in failures), failures
        assert await commands.execute("GET", "k") == "v"
    finally:
        await commands.aclose()
        await client.aclose()
        server.stop()
