"""Automatic pipelining for redis-py's asyncio client: the commands that concurrent requests issue
in the same event-loop turn go to Redis together, one write and then the replies in order.

Why: redis-py spends ~220 us of CPU per command sent alone (pool checkout, retry, timeout and
observability wrappers), as much as uvicorn's whole request. Under load the API has dozens of
requests in flight, each waiting on one command, so sending them together is the largest saving
on the hot paths: measured in a bare ASGI app under wrk (bench/README.md), one HGETALL per request
costs ~220 us through `client.hgetall` and ~90 us here (batches of ~10). This is what ioredis's
`enableAutoPipelining` and Lettuce do; redis-py has no such option. It is built on redis-py's own
parts: its connection pool, connections, hiredis parser, response callbacks and error types.

Latency: a command waits only for the end of the current loop turn, never for a timer, so a lone
request goes out as soon as it would have alone. Each command keeps its own reply or its own error
(this is not a transaction: one command failing does not fail the others). A connection failure
fails every command of that batch with redis-py's ConnectionError or TimeoutError, as it would
have failed each of them sent alone, and the connection is dropped, not reused.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import redis.asyncio as aioredis
from redis.commands.core import AsyncScript
from redis.exceptions import DataError, NoScriptError, ResponseError

from shared.metrics import REDIS_BATCH

#: The most commands one batch carries; more in one turn go out as several batches at once.
MAX_BATCH = 256

_Pending = tuple[tuple[Any, ...], "asyncio.Future[Any]"]


class AutoPipeline:
    def __init__(self, client: aioredis.Redis, max_batch: int = MAX_BATCH) -> None:
        self._client = client
        self._max_batch = max_batch
        self._pending: list[_Pending] = []
        self._flush_scheduled = False
        self._in_flight: set[asyncio.Task[None]] = set()

    async def execute(self, *args: Any) -> Any:
        """Run one command (its name, then its arguments) and return its parsed reply, as
        `client.execute_command(*args)` would."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()
        self._pending.append((args, future))
        if not self._flush_scheduled:
            self._flush_scheduled = True
            loop.call_soon(self._flush)
        return await future

    async def run_script(self, script: AsyncScript, keys: Sequence[Any], args: Sequence[Any]) -> Any:
        """EVALSHA of a registered script, loading it first if the server does not know it yet
        (after a restart or SCRIPT FLUSH), as redis-py's Script.__call__ does."""
        try:
            return await self.execute("EVALSHA", script.sha, len(keys), *keys, *args)
        except NoScriptError:
            script.sha = await self._client.script_load(script.script)
            return await self.execute("EVALSHA", script.sha, len(keys), *keys, *args)

    async def aclose(self) -> None:
        """Wait for the batches already sent (their callers are waiting for them)."""
        if self._in_flight:
            await asyncio.gather(*self._in_flight, return_exceptions=True)

    def _flush(self) -> None:
        self._flush_scheduled = False
        pending, self._pending = self._pending, []
        for start in range(0, len(pending), self._max_batch):
            task = asyncio.create_task(self._send(pending[start : start + self._max_batch]))
            self._in_flight.add(task)
            task.add_done_callback(self._in_flight.discard)

    async def _send(self, batch: list[_Pending]) -> None:
        live = [(args, future) for args, future in batch if not future.done()]  # callers gone: skip
        if not live:
            return
        REDIS_BATCH.observe(len(live))
        try:
            replies = await self._send_now([args for args, _ in live])
        except BaseException as exc:
            for _, future in live:
                if not future.done():
                    future.set_exception(exc)
            if not isinstance(exc, Exception):
                raise
            return
        for (_, future), reply in zip(live, replies, strict=True):
            if future.done():
                continue
            if isinstance(reply, Exception):
                future.set_exception(reply)
            else:
                future.set_result(reply)

    async def _send_now(self, commands: list[tuple[Any, ...]]) -> list[Any]:
        """Send the batch on one pooled connection; each command's reply, or its error reply."""
        pool = self._client.connection_pool
        conn = await pool.get_connection()  # type: ignore[no-untyped-call]
        try:
            await conn.send_packed_command(pack(commands), check_health=False)
            replies: list[Any] = []
            for args in commands:
                try:
                    reply = await conn.read_response()
                except ResponseError as exc:
                    reply = exc
                else:
                    callback = self._client.response_callbacks.get(args[0])
                    if callback is not None:
                        reply = callback(reply)
                replies.append(reply)
            return replies
        except BaseException:
            await conn.disconnect()
            raise
        finally:
            await pool.release(conn)


def pack(commands: Sequence[Sequence[Any]]) -> bytes:
    """The commands in the Redis protocol (RESP), encoding arguments as redis-py's Encoder does
    (str as UTF-8, int and float as their repr, bytes as they are; a bool is refused).

    redis-py's own packer re-joins its growing buffer for every argument: ~40 us for a job
    submission's 21 arguments, ~11 us here."""
    out: list[bytes] = []
    push = out.append
    for args in commands:
        push(b"*%d\r\n" % len(args))
        for arg in args:
            data = _encode(arg)
            push(b"$%d\r\n" % len(data))
            push(data)
            push(b"\r\n")
    return b"".join(out)


def _encode(arg: Any) -> bytes:
    if type(arg) is bytes:
        return arg
    if type(arg) is str:
        return arg.encode()
    if isinstance(arg, bool):
        raise DataError("Invalid input of type: 'bool'. Convert to a bytes, string, int or float first.")
    if isinstance(arg, (int, float)):
        return repr(arg).encode()
    if isinstance(arg, (bytearray, memoryview)):
        return bytes(arg)
    if isinstance(arg, str):
        return arg.encode()
    raise DataError(
        f"Invalid input of type: {type(arg).__name__!r}. Convert to a bytes, string, int or float first."
    )
