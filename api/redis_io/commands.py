"""How the API sends single commands and scripts to Redis: the `Commands` its services depend on,
batched across concurrent requests (batching.py: on a connection of its own, wire.py, or through
redis-py's pipelines) or, with GENQ_API_AUTOPIPELINE off, each through redis-py's connection pool
on its own (`DirectCommands`)."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any, Protocol

import redis.asyncio as aioredis
import redis.exceptions
from redis.commands.core import AsyncScript

from api.redis_io.batching import BatchedCommands
from api.redis_io.wire import TakeOverFailed, WireLink
from shared.logging import fields

log = logging.getLogger("genq.api")


class Commands(Protocol):
    """Single commands and scripts, each with its own reply or error, as
    `client.execute_command` gives them (redis-py's response callbacks applied)."""

    async def execute(self, *args: Any) -> Any: ...

    async def execute_in_order(self, *commands: Sequence[Any]) -> list[Any]: ...

    async def run_script(self, script: AsyncScript, keys: Sequence[Any], args: Sequence[Any]) -> Any: ...

    async def aclose(self) -> None: ...


class DirectCommands:
    """Each command through redis-py's own connection pool, one round trip each."""

    def __init__(self, client: aioredis.Redis) -> None:
        self._client = client

    async def execute(self, *args: Any) -> Any:
        return await self._client.execute_command(*args)  # type: ignore[no-untyped-call]

    async def execute_in_order(self, *commands: Sequence[Any]) -> list[Any]:
        """One after another, each sent once the one before it was answered (a pool may hand each
        command another connection); the first error is raised and the rest are not sent."""
        return [await self.execute(*command) for command in commands]

    async def run_script(self, script: AsyncScript, keys: Sequence[Any], args: Sequence[Any]) -> Any:
        return await script(keys=keys, args=args)

    async def aclose(self) -> None:
        """Nothing of its own to close: the pool is the client's."""


async def open_commands(client: aioredis.Redis, batched: bool = True, wire: bool = True) -> Commands:
    """The API's commands on `client`: batched (GENQ_API_AUTOPIPELINE) on a connection of their
    own (GENQ_API_REDIS_WIRE, checked here with one PING) or through redis-py's pipelines should
    its take-over fail (logged as `redis_wire_off`); or each on its own. Redis being down at
    start-up is no reason to fall back: the next command connects again."""
    if not batched:
        return DirectCommands(client)
    if not wire:
        return BatchedCommands(client)
    commands = BatchedCommands(client, WireLink(client))
    try:
        await commands.execute("PING")
    except TakeOverFailed as exc:
        await commands.aclose()
        message = "serving through redis-py's pipelines"
        log.warning("redis_wire_off", extra=fields(error=repr(exc.__cause__ or exc), message=message))
        return BatchedCommands(client)
    except redis.exceptions.RedisError:
        pass
    return commands
