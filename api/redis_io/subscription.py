"""One pub/sub subscription through redis-py's PubSub: each message's data goes to a callback, each
subscription Redis confirms (the first, and any after redis-py reconnected) to another, and its
holder checks now and then whether it still holds (`held_for`).

Why a task reading `PubSub.listen()`: a blocking read costs no timeout context per message, as a
`get_message(timeout=...)` loop does; whether the subscription is still wanted is the holder's
question, asked beside the reads rather than between messages.

Messages come as bytes, from a client that does not decode replies (client.py's
`listener_client`): one that is no UTF-8 is the callback's to judge, not a failed read. Pub/sub
delivers only while subscribed, so a confirmation after redis-py reconnected by itself (a client
that retries) tells `on_subscribed` that messages may have been lost. An error reply (an ACL
that forbids SUBSCRIBE) or a connection lost for good ends the subscription with redis-py's error.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import redis.asyncio as aioredis
import redis.exceptions
from redis.asyncio.client import PubSub

OnMessage = Callable[[bytes], None]
OnSubscribed = Callable[[], None]


def _nothing() -> None:
    """No one to tell."""


class Subscription:
    """A subscription to one channel, read by a task of its own until closed or lost."""

    def __init__(self, pubsub: PubSub, on_message: OnMessage, on_subscribed: OnSubscribed) -> None:
        self._pubsub = pubsub
        self._on_message = on_message
        self._on_subscribed = on_subscribed
        #: Done once Redis confirmed the SUBSCRIBE (or failed with why it never will).
        self._confirmed: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._reading: asyncio.Task[None] | None = None

    @classmethod
    async def open(
        cls,
        client: aioredis.Redis,
        channel: str,
        on_message: OnMessage,
        on_subscribed: OnSubscribed = _nothing,
    ) -> Subscription:
        """Connect (a redis-py ConnectionError or TimeoutError when Redis is out of reach) and send
        SUBSCRIBE; `confirmed()` waits for Redis to take it. ValueError for a client that decodes
        replies: its PubSub would fail on the first message that is no UTF-8."""
        if client.get_encoder().decode_responses:  # type: ignore[no-untyped-call]  # unannotated in redis-py
            raise ValueError("a subscription reads bytes: give it a client without decode_responses")
        subscription = cls(client.pubsub(), on_message, on_subscribed)
        try:
            await subscription._pubsub.subscribe(channel)
        except BaseException:
            await subscription.aclose()
            raise
        subscription._reading = asyncio.create_task(subscription._read(), name=f"genq-subscription-{channel}")
        return subscription

    async def confirmed(self, timeout_s: float) -> None:
        """Return once Redis confirmed the subscription: messages published from then on reach
        `on_message`. TimeoutError after `timeout_s`; the error that ended it, if it ended first."""
        async with asyncio.timeout(timeout_s):
            await asyncio.shield(self._confirmed)

    async def held_for(self, timeout_s: float) -> None:
        """Return after `timeout_s` with the subscription still held, or at once once closed by
        aclose(); raise why it ended (a redis-py ConnectionError for a lost connection) as soon as
        it does."""
        if self._reading is None:
            return
        done, _ = await asyncio.wait({self._reading}, timeout=timeout_s)
        if done and not self._reading.cancelled():
            self._reading.result()

    async def aclose(self) -> None:
        """Stop reading and close the connection (Redis drops the subscription with it)."""
        if self._reading is not None:
            self._reading.cancel()
            await asyncio.wait({self._reading})
            if not self._reading.cancelled():
                self._reading.exception()  # retrieved: held_for() may never be called again
        await asyncio.shield(self._pubsub.aclose())  # type: ignore[no-untyped-call]

    async def _read(self) -> None:
        try:
            async for message in self._pubsub.listen():
                self._handle(message)
            raise redis.exceptions.ConnectionError("Subscription ended.")  # no channel left
        except BaseException as exc:
            if not self._confirmed.done():
                error = (
                    exc
                    if isinstance(exc, Exception)
                    else redis.exceptions.ConnectionError("Subscription closed.")
                )
                self._confirmed.set_exception(error)
                self._confirmed.exception()  # retrieved: nobody may be waiting for it any more
            raise

    def _handle(self, message: dict[str, Any]) -> None:
        kind = message["type"]
        if kind == "message":
            self._on_message(message["data"])
        elif kind == "subscribe":
            if not self._confirmed.done():
                self._confirmed.set_result(None)
            self._on_subscribed()
