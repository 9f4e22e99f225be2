"""Automatic pipelining for redis-py's asyncio client: the commands that concurrent requests issue
in the same event-loop turn go to Redis together, in one write on one long-lived connection, and
each reply goes back to its caller as it arrives (what ioredis's `enableAutoPipelining` does).

Why: redis-py spends as much CPU on each command sent alone (pool checkout, connect check,
timeout contexts around each write and read) as uvicorn does on a whole request, and the API has
dozens of requests in flight, each waiting on one command.

How: one connection per AutoPipeline, opened by redis-py itself and then read by an asyncio
Protocol of ours; replies are parsed by hiredis into the callers' futures in order, with redis-py's
own error classes and response callbacks, so callers see what `client.execute_command` would
give them. Each command keeps its own reply or error (this is not a transaction); a lost
connection or a `socket_timeout` fails the commands waiting on it, and the next command opens a
new one. Never send blocking commands (BLPOP, XREAD BLOCK, SUBSCRIBE) here: they would hold up
everyone's replies.

Fenced: the take-over (api/edge/resp.py) uses three private names of redis-py. Should an upgrade
break it, `open_commands` finds out at start-up, logs `autopipeline_off` and serves through
redis-py's own pool (`DirectCommands`), as GENQ_API_AUTOPIPELINE=0 does."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import hiredis
import redis.asyncio as aioredis
import redis.exceptions
from redis.commands.core import AsyncScript
from redis.exceptions import DataError, InvalidResponse, NoScriptError, RedisError

from api.edge.resp import TakeOverFailed, pack_command, take_over
from shared.logging import fields
from shared.metrics import REDIS_BATCH

#: The most commands one write carries; more in one turn go out as several writes at once.
MAX_BATCH = 256

_Pending = tuple[tuple[Any, ...], "asyncio.Future[Any]"]

log = logging.getLogger("genq.autopipeline")


class Commands(Protocol):
    """How the API sends single commands and scripts: AutoPipeline, or DirectCommands."""

    async def execute(self, *args: Any) -> Any: ...

    async def execute_in_order(self, *commands: Sequence[Any]) -> list[Any]: ...

    async def run_script(self, script: AsyncScript, keys: Sequence[Any], args: Sequence[Any]) -> Any: ...

    async def aclose(self) -> None: ...


class DirectCommands:
    """Each command through redis-py's own connection pool: AutoPipeline's fallback."""

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


async def open_commands(client: aioredis.Redis, enabled: bool = True) -> Commands:
    """AutoPipeline when enabled and its take-over works here (checked with one PING), else
    DirectCommands. Redis being down at start-up is not a reason to fall back."""
    if not enabled:
        return DirectCommands(client)
    commands = AutoPipeline(client)
    try:
        await commands.execute("PING")
    except TakeOverFailed as exc:
        await commands.aclose()
        log.warning(
            "autopipeline_off",
            extra=fields(
                error=repr(exc.__cause__ or exc), message="serving through redis-py's own connection pool"
            ),
        )
        return DirectCommands(client)
    except redis.exceptions.RedisError:
        pass  # Redis down: the next command connects again
    return commands


_Callback = Callable[[Any], Any] | None


class AutoPipeline:
    def __init__(self, client: aioredis.Redis, max_batch: int = MAX_BATCH) -> None:
        self._client = client
        self._max_batch = max_batch
        self._pending: list[_Pending] = []
        self._flush_scheduled = False
        self._link: _Link | None = None
        self._connecting: asyncio.Task[None] | None = None
        #: redis-py's response callback per command name, looked up once per name.
        self._callbacks: dict[str, _Callback] = {}

    async def execute(self, *args: Any) -> Any:
        """Run one command (its name, then its arguments) and return its parsed reply, as
        `client.execute_command(*args)` would."""
        return await self._queued(args, asyncio.get_running_loop())

    async def execute_in_order(self, *commands: Sequence[Any]) -> list[Any]:
        """Several commands, sent in this order in the same turn on the one connection, so Redis
        runs each after the one before it (not atomically: another client's command may run in
        between): a read placed after another sees what that one saw, or newer. One round trip
        for all. Their replies, in order, once all came; the first error among them is raised."""
        loop = asyncio.get_running_loop()
        replies = await asyncio.gather(
            *(self._queued(tuple(c), loop) for c in commands), return_exceptions=True
        )
        for reply in replies:
            if isinstance(reply, BaseException):
                raise reply
        return replies

    def _queued(self, args: tuple[Any, ...], loop: asyncio.AbstractEventLoop) -> asyncio.Future[Any]:
        """A future for the reply to `args`, which goes out at the end of this turn."""
        future: asyncio.Future[Any] = loop.create_future()
        self._pending.append((args, future))
        if not self._flush_scheduled:
            self._flush_scheduled = True
            loop.call_soon(self._flush)
        return future

    async def run_script(self, script: AsyncScript, keys: Sequence[Any], args: Sequence[Any]) -> Any:
        """EVALSHA of a registered script, loading it first if the server does not know it yet
        (after a restart or SCRIPT FLUSH), as redis-py's Script.__call__ does."""
        try:
            return await self.execute("EVALSHA", script.sha, len(keys), *keys, *args)
        except NoScriptError:
            script.sha = await self._client.script_load(script.script)
            return await self.execute("EVALSHA", script.sha, len(keys), *keys, *args)

    async def aclose(self) -> None:
        """Close the connection once the commands already sent have their replies (their callers
        are waiting for them)."""
        if self._connecting is not None:
            await asyncio.gather(self._connecting, return_exceptions=True)
        link, self._link = self._link, None
        if link is not None:
            await link.drain()
            link.close()

    def _flush(self) -> None:
        self._flush_scheduled = False
        link = self._link
        if link is None or link.lost:
            if self._connecting is None:
                self._connecting = asyncio.create_task(self._connect())
            return  # the pending commands go out once connected
        pending, self._pending = self._pending, []
        for start in range(0, len(pending), self._max_batch):
            self._send(link, pending[start : start + self._max_batch])

    def _send(self, link: _Link, batch: list[_Pending]) -> None:
        chunks: list[bytes] = []
        waiting: list[tuple[asyncio.Future[Any], _Callback]] = []
        for args, future in batch:
            if future.done():  # its caller is gone
                continue
            try:
                chunks.append(pack_command(args))
            except (DataError, UnicodeEncodeError) as exc:
                # An argument redis-py would refuse, or a str that is no UTF-8 (a lone surrogate),
                # fails its own command; the batch's others go out.
                future.set_exception(exc)
                continue
            waiting.append((future, self._callback(args[0])))
        if waiting:
            REDIS_BATCH.observe(len(waiting))
            link.send(b"".join(chunks), waiting)

    def _callback(self, name: Any) -> _Callback:
        try:
            return self._callbacks[name]
        except KeyError:
            callback = self._callbacks[name] = self._client.response_callbacks.get(name)
            return callback

    async def _connect(self) -> None:
        """Open the connection (redis-py's handshake), then send what waited for it. A failure
        fails the waiting commands with redis-py's error, as a pool checkout would have."""
        connection = None
        try:
            connection = self._client.connection_pool.make_connection()  # type: ignore[no-untyped-call]
            await connection.connect()
            self._link = _Link.take_over(connection)
        except Exception as exc:
            error = exc
            if not isinstance(exc, RedisError):  # redis-py changed underneath: close what we opened
                error = TakeOverFailed(f"could not take over a redis-py connection: {exc!r}")
                error.__cause__ = exc
                if connection is not None:
                    with contextlib.suppress(Exception):
                        await connection.disconnect()
            pending, self._pending = self._pending, []
            for _, future in pending:
                if not future.done():
                    future.set_exception(error)
            return
        finally:
            self._connecting = None
        self._flush()


class _Link(asyncio.Protocol):
    """One connection's replies, in order, into the futures of the commands that were sent."""

    def __init__(self, connection: Any, transport: asyncio.Transport, reader: hiredis.Reader) -> None:
        #: Held so that redis-py's finalizer, which closes what it still thinks it owns, runs only
        #: once we are done with the transport.
        self._connection = connection
        self._transport = transport
        self._reader = reader
        self._timeout_s: float | None = connection.socket_timeout
        #: What was sent and not yet answered, oldest first: (future, callback, sent at).
        self._waiting: deque[tuple[asyncio.Future[Any], _Callback, float]] = deque()
        self._watchdog: asyncio.TimerHandle | None = None
        self.lost = False

    @classmethod
    def take_over(cls, connection: Any) -> _Link:
        """Read a connected redis-py connection ourselves from now on (`take_over`)."""
        return take_over(connection, lambda transport, reader: cls(connection, transport, reader))

    def send(self, data: bytes, waiting: list[tuple[asyncio.Future[Any], _Callback]]) -> None:
        """Write one batch (callers check `lost` first: a lost link is replaced, not written to)."""
        now = time.monotonic()
        self._waiting.extend((future, callback, now) for future, callback in waiting)
        self._transport.write(data)
        if self._watchdog is None and self._timeout_s:
            self._watchdog = asyncio.get_running_loop().call_later(self._timeout_s, self._check_timeout)

    def data_received(self, data: bytes) -> None:
        self._reader.feed(data)
        while True:
            try:
                reply = self._reader.gets()
            except InvalidResponse as exc:
                self._fail(exc)
                return
            except UnicodeDecodeError as exc:
                # hiredis consumed the whole reply before decoding it: the stream is still in step,
                # so only the command it answers fails (redis-py's client would raise the same).
                reply = exc
            if reply is False:
                return
            if not self._waiting:  # out of step with what we sent: nothing on it can be trusted
                self._fail(InvalidResponse("Redis sent a reply that no command was waiting for"))
                return
            future, callback, _ = self._waiting.popleft()
            if not future.done():
                _answer(future, callback, reply)

    def connection_lost(self, exc: Exception | None) -> None:
        reason = f" ({exc})" if exc else ""
        error = redis.exceptions.ConnectionError(f"Connection closed by server.{reason}")
        self._fail(error)

    async def drain(self) -> None:
        if self._waiting:
            await asyncio.gather(*(future for future, _, _ in self._waiting), return_exceptions=True)

    def close(self) -> None:
        self._fail(redis.exceptions.ConnectionError("Connection closed by the client."))

    def _check_timeout(self) -> None:
        self._watchdog = None
        if not self._waiting:
            return
        overdue_at = self._waiting[0][2] + (self._timeout_s or 0.0)
        now = time.monotonic()
        if now >= overdue_at:
            self._fail(
                redis.exceptions.TimeoutError(
                    f"Timeout reading from Redis: no reply in {self._timeout_s:g} s"
                )
            )
        else:
            self._watchdog = asyncio.get_running_loop().call_later(overdue_at - now, self._check_timeout)

    def _fail(self, error: Exception) -> None:
        """Drop the connection; every command still waiting on it fails with `error`."""
        self.lost = True
        if self._watchdog is not None:
            self._watchdog.cancel()
            self._watchdog = None
        self._connection._close()  # closes the transport, and leaves redis-py nothing to close later
        waiting, self._waiting = self._waiting, deque()
        for future, _, _ in waiting:
            if not future.done():
                future.set_exception(error)


def _answer(future: asyncio.Future[Any], callback: _Callback, reply: Any) -> None:
    # Every error reply, ResponseError or not: redis-py parses "-LOADING" (Redis replaying its
    # AOF after a restart) as BusyLoadingError, a ConnectionError (-> 503 at the API).
    if isinstance(reply, RedisError | UnicodeDecodeError):
        future.set_exception(reply)
    elif callback is None:
        future.set_result(reply)
    else:
        try:
            future.set_result(callback(reply))
        except Exception as exc:  # a reply its callback cannot parse fails its command only
            future.set_exception(exc)
