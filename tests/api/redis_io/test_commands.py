"""The API's commands (api/redis_io/commands.py) against the suite's real Redis: batched by
default and each on its own with GENQ_API_AUTOPIPELINE off, the API serving every way; commands
in order on their own run one after another and stop at the first error."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import redis
import redis.asyncio as aioredis
import redis.exceptions

from api.redis_io.batching import BatchedCommands
from api.redis_io.commands import DirectCommands, open_commands
from shared.config import Settings
from tests.conftest import api_client

pytestmark = pytest.mark.anyio


async def test_commands_are_batched_unless_turned_off(aclient: aioredis.Redis) -> None:
    batched = await open_commands(aclient)
    assert isinstance(batched, BatchedCommands)
    await batched.aclose()
    assert isinstance(await open_commands(aclient, batched=False), DirectCommands)


@pytest.mark.parametrize(("batched", "wire"), [(True, True), (True, False), (False, True)])
async def test_the_api_serves_every_way(
    make_settings: Callable[..., Settings], batched: bool, wire: bool
) -> None:
    async with api_client(make_settings(api_autopipeline=batched, api_redis_wire=wire)) as api:
        submitted = await api.post("/v1/jobs", json={"prompt": "either way"})
        assert submitted.status_code == 202
        assert (await api.get(submitted.headers["location"])).json()["status"] == "queued"


async def test_direct_commands_in_order_run_one_after_another(aclient: aioredis.Redis) -> None:
    """The replies in order, with redis-py's callbacks applied; an error reply is raised and the
    commands after it are not sent (each waits for the one before it)."""
    commands = DirectCommands(aclient)
    await aclient.hset("h", mapping={"n": "0"})
    replies = await commands.execute_in_order(("HINCRBY", "h", "n", 1), ("HGETALL", "h"))
    assert replies == [1, {"n": "1"}]
    await aclient.set("text", "not a hash")
    with pytest.raises(redis.exceptions.ResponseError, match="WRONGTYPE"):
        await commands.execute_in_order(("HGETALL", "text"), ("SET", "not-sent", "1"))
    assert await aclient.exists("not-sent") == 0


async def test_direct_commands_run_scripts(aclient: aioredis.Redis) -> None:
    commands = DirectCommands(aclient)
    script = aclient.register_script("return redis.call('INCRBY', KEYS[1], ARGV[1])")
    assert await commands.run_script(script, ["counter"], [5]) == 5
    await aclient.script_flush()
    assert await commands.run_script(script, ["counter"], [1]) == 6
    await commands.aclose()
