"""One pub/sub subscription read by an asyncio Protocol of ours: each message's data goes to a
callback straight from `data_received`, with no task, timeout object or reply dict per message.

Why: the API's two listeners (api/jobs/wakes.py) get a message for every job that ends and for
every batch of a stream's entries, and redis-py's `PubSub.get_message` loop wraps every read in a
timeout context, a retry and a readiness check, then builds a dict per message: a visible share
of the API's CPU when streams are busy (`python -m bench.pubsub` compares the two).

How: redis-py opens the connection (the pool's address, TLS, AUTH and SELECT), then it is taken
over as AutoPipeline's connection is (`take_over` in api/edge/resp.py, behind the same fence: a
redis-py that no longer allows it raises TakeOverFailed, and the listener falls back on redis-py's
PubSub). Replies are read as bytes, so a message that is no UTF-8 is the callback's to judge. An
error reply (an ACL that forbids SUBSCRIBE) or a lost connection ends the subscription, as it
ends redis-py's."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import Any

import hiredis
import redis.asyncio as aioredis
import redis.exceptions
from redis.exceptions import InvalidResponse, RedisError

from api.edge.resp import TakeOverFailed, pack_command, replies, take_over

OnMessage = Callable[[bytes], None]


class Subscription(asyncio.Protocol):
    """A connection subscribed to one channel, its messages' data handed to `on_message`."""

    def __init__(
        self, connection: Any, transport: asyncio.Transport, reader: hiredis.Reader, on_message: OnMessage
    ) -> None:
        loop = asyncio.get_running_loop()
        self._connection = connection
        self._transport = transport
        self._reader = reader
        self._on_message = on_message
        #: Done once Redis confirmed the SUBSCRIBE (or failed with why it never will).
        self._confirmed: asyncio.Future[None] = loop.create_future()
        #: Failed with why the subscription ended (done without error once closed by us).
        self._ended: asyncio.Future[None] = loop.create_future()

    @classmethod
    async def open(cls, client: aioredis.Redis, channel: str, on_message: OnMessage) -> Subscription:
        """Connect (a redis-py ConnectionError or TimeoutError when Redis is out of reach) and send
        SUBSCRIBE; `confirmed()` waits for Redis to take it."""
        connection = client.connection_pool.make_connection()  # type: ignore[no-untyped-call]
        await connection.connect()
        try:
            subscription = take_over(
                connection,
                lambda transport, reader: cls(connection, transport, reader, on_message),
                decode=False,
            )
        except Exception as exc:  # redis-py changed underneath: close what we opened
            with contextlib.suppress(Exception):
                await connection.disconnect()
            raise TakeOverFailed(f"could not take over a redis-py connection: {exc!r}") from exc
        subscription._transport.write(pack_command(("SUBSCRIBE", channel)))
        return subscription

    async def confirmed(self, timeout_s: float) -> None:
        """Return once Redis confirmed the subscription: messages published from then on reach
        `on_message`. TimeoutError after `timeout_s`; the error that ended it, if it ended first."""
        async with asyncio.timeout(timeout_s):
            await asyncio.shield(self._confirmed)

    async def held_for(self, timeout_s: float) -> None:
        """Return after `timeout_s` with the subscription still held; raise why it ended (a
        redis-py ConnectionError for a lost connection) as soon as it does."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout_s):
                await asyncio.shield(self._ended)

    def close(self) -> None:
        self._end(None)

    def data_received(self, data: bytes) -> None:
        try:
            for reply in replies(self._reader, data):
                if isinstance(reply, RedisError):
                    self._end(reply)
                    return
                kind = reply[0]
                if kind == b"message":
                    self._on_message(reply[2])
                elif kind == b"subscribe" and not self._confirmed.done():
                    self._confirmed.set_result(None)
        except InvalidResponse as exc:
            self._end(exc)

    def connection_lost(self, exc: Exception | None) -> None:
        reason = f" ({exc})" if exc else ""
        self._end(redis.exceptions.ConnectionError(f"Connection closed by server.{reason}"))

    def _end(self, error: Exception | None) -> None:
        """Close the connection (once); whoever waits on the subscription learns why it ended."""
        if self._ended.done():
            return
        self._connection._close()  # closes the transport, and leaves redis-py nothing to close later
        if not self._confirmed.done():
            self._confirmed.set_exception(error or redis.exceptions.ConnectionError("Subscription closed."))
            self._confirmed.exception()  # retrieved: nobody may be waiting for it any more
        if error is None:
            self._ended.set_result(None)
        else:
            self._ended.set_exception(error)
            self._ended.exception()
