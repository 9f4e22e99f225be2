"""The adapter: batches written on one long-lived connection that the API reads itself, each reply
parsed by hiredis straight into its caller's future (what ioredis's auto-pipelining does).

Why: redis-py's public path (batching.py's PipelineLink) costs a pool checkout, a Pipeline and a
timeout context per reply for every batch; at the API's usual batch sizes that is a visible share
of a request (`python -m bench.redis_io` measures the two, as requests served and their latency).

How: redis-py opens and authenticates the connection (the pool's address, TLS, AUTH, SELECT); its
transport is then handed to a Protocol of ours. Replies are parsed with redis-py's error classes
and response callbacks, so callers see what `client.execute_command` would give them. Each command
keeps its own reply or error, an undecodable reply included; a lost connection or `socket_timeout`
fails the commands waiting on it, and the next batch opens a new connection.

Fenced: this is the one module that reads redis-py's private names, `Connection._writer` and
`Connection._close()` and `redis._parsers.BaseParser` (redis==8.1.0, pinned;
tests/api/redis_io/test_wire.py holds the contract). Should an upgrade break them, the take-over
raises TakeOverFailed (a redis-py ConnectionError): commands.py finds out at start-up, logs
`redis_wire_off` and serves through redis-py's pipelines, as GENQ_API_REDIS_WIRE=0 does."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import Callable
from typing import Any

import hiredis
import redis.asyncio as aioredis
import redis.exceptions
from redis.exceptions import DataError, InvalidResponse, RedisError

from api.redis_io.batching import Queued, fail_all
from api.redis_io.packing import pack_command
from shared.metrics import REDIS_BATCH

_Callback = Callable[[Any], Any] | None


class TakeOverFailed(redis.exceptions.ConnectionError):
    """A redis-py connection could not be taken over (redis-py changed underneath)."""


class WireLink:
    """Where BatchedCommands sends its batches: one connection, read by `_Replies`."""

    #: Batches are written as they come: the connection carries any number at once.
    max_in_flight: int | None = None

    def __init__(self, client: aioredis.Redis) -> None:
        self._client = client
        self._replies: _Replies | None = None
        self._connecting: asyncio.Task[None] | None = None
        #: Batches sent while there was no connection: written once there is one.
        self._held: list[list[Queued]] = []
        #: redis-py's response callback per command name, looked up once per name.
        self._callbacks: dict[Any, _Callback] = {}

    def send(self, batch: list[Queued]) -> None:
        replies = self._replies
        if replies is None or replies.lost:
            self._held.append(batch)
            if self._connecting is None:
                self._connecting = asyncio.create_task(self._connect())
            return
        self._write(replies, batch)

    async def aclose(self) -> None:
        """Close the connection once the commands already sent have their replies."""
        if self._connecting is not None:
            await asyncio.gather(self._connecting, return_exceptions=True)
        replies, self._replies = self._replies, None
        if replies is not None:
            await replies.drain()
            replies.close()

    def _write(self, replies: _Replies, batch: list[Queued]) -> None:
        chunks: list[bytes] = []
        waiting: list[tuple[asyncio.Future[Any], _Callback]] = []
        for args, future, _ in batch:
            if future.done():  # its caller is gone
                continue
            try:
                chunks += pack_command(*args)
            except (DataError, UnicodeEncodeError) as exc:  # refused: its own command fails
                future.set_exception(exc)
                continue
            waiting.append((future, self._callback(args[0])))
        if waiting:
            REDIS_BATCH.observe(len(waiting))
            replies.send(b"".join(chunks), waiting)

    def _callback(self, name: Any) -> _Callback:
        try:
            return self._callbacks[name]
        except KeyError:
            callback = self._callbacks[name] = self._client.response_callbacks.get(name)
            return callback

    async def _connect(self) -> None:
        """Open the connection (redis-py's handshake), then write what waited for it. A failure
        fails the waiting commands with redis-py's error, as a pool checkout would have."""
        try:
            self._replies = await _Replies.open(self._client)
        except Exception as exc:
            held, self._held = self._held, []
            for batch in held:
                fail_all(batch, exc)
            return
        finally:
            self._connecting = None
        held, self._held = self._held, []
        for batch in held:
            self._write(self._replies, batch)


class _Replies(asyncio.Protocol):
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
    async def open(cls, client: aioredis.Redis) -> _Replies:
        """A new connection of the client's pool, taken over (TakeOverFailed if redis-py no
        longer allows it: the connection opened for it is closed)."""
        connection = client.connection_pool.make_connection()  # type: ignore[no-untyped-call]
        await connection.connect()
        try:
            return take_over(connection, lambda transport, reader: cls(connection, transport, reader))
        except Exception as exc:
            with contextlib.suppress(Exception):
                await connection.disconnect()
            raise TakeOverFailed(f"could not take over a redis-py connection: {exc!r}") from exc

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
        self._fail(redis.exceptions.ConnectionError(f"Connection closed by server.{reason}"))

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
            timeout = redis.exceptions.TimeoutError(
                f"Timeout reading from Redis: no reply in {self._timeout_s:g} s"
            )
            self._fail(timeout)
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


def take_over(connection: Any, protocol: Callable[[asyncio.Transport, hiredis.Reader], _Replies]) -> _Replies:
    """Read a connected redis-py connection with `protocol` from now on, its replies parsed by the
    hiredis reader handed to it, as redis-py's client would parse them (strings if it decodes).
    redis-py keeps its stream writer in `_writer` and its error-reply parser in
    `redis._parsers.BaseParser` (redis==8.1.0): the private names this module is fenced for."""
    from redis._parsers import BaseParser  # here, so that its absence is a failed take-over

    encoder = connection.encoder
    options: dict[str, Any] = {"protocolError": InvalidResponse, "replyError": BaseParser.parse_error}
    if encoder.decode_responses:
        options |= {"encoding": encoder.encoding, "errors": encoder.encoding_errors}
    transport = connection._writer.transport
    taken = protocol(transport, hiredis.Reader(**options))
    transport.set_protocol(taken)
    return taken


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
