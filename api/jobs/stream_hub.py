"""Wakes the followers of jobs whose output moved: one pub/sub subscription per API process.

Workers PUBLISH a job's id on JOB_OUTPUT_CHANNEL in the same pipeline as each XADD to its output
stream (workers/publish.py). While anyone in this process follows a stream, and LINGER_S after the
last one left, one task here holds that subscription and sets the events of the followers of the
job each message names; a follower then reads its entries after its own cursor with one short
XRANGE. A wake costs the job's own followers only, and an idle stream costs an asyncio.Event and
nothing in Redis. (The hub used to issue one XREAD BLOCK naming every followed stream, again after
each entry: O(streams followed) per entry, ~11% of the API's CPU with 256 streams open.)

Pub/sub delivers only while subscribed: right after (re)subscribing the hub wakes every follower,
so one that read its stream before the subscription took effect reads again, and follow.py re-reads
on its own every RECHECK_S, which bounds the delay of anything else lost.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterator

import redis.asyncio as aioredis
import redis.exceptions
from redis.asyncio.client import PubSub

from shared import keys
from shared.logging import fields

log = logging.getLogger("genq.api")

#: The subscription is kept this long after the last follower left, so a process that serves
#: streams now and then does not subscribe and unsubscribe for each.
LINGER_S = 10.0
#: How long a lost subscription waits before it subscribes again.
RECONNECT_S = 0.5
#: Longest wait for Redis to confirm the subscription before the hub tries again.
CONFIRM_S = 5.0
#: Longest wait for a message, between checks of whether anyone still follows.
POLL_S = 1.0


class StreamHub:
    def __init__(self, client: aioredis.Redis) -> None:
        #: A client of its own (one connection): the subscription never takes a pooled one.
        self._redis = client
        self._followers: dict[str, set[asyncio.Event]] = {}
        self._someone = asyncio.Event()
        #: When the last follower left (loop time): the subscription ends LINGER_S later.
        self._idle_since = 0.0
        self._task: asyncio.Task[None] | None = None
        #: Set by stop(): the task ends at its next turn even if redis-py lost the cancel.
        self._stopping = False

    def start(self) -> None:
        self._task = asyncio.create_task(self._listen_forever(), name="genq-stream-hub")

    async def stop(self) -> None:
        self._stopping = True
        if self._task is not None:
            self._task.cancel()
            # Bounded, as JobEvents.stop: a cancel mid-subscribe can leave the pubsub close waiting.
            await asyncio.wait({self._task}, timeout=1.0)
        await self._redis.aclose()

    @property
    def subscribed(self) -> bool:
        """Whether the hub holds its subscription now (or is opening it)."""
        return self._someone.is_set()

    @contextlib.contextmanager
    def follow(self, job_id: str, event: asyncio.Event) -> Iterator[None]:
        """Within the block, `event` is set whenever the job's stream gets entries (and whenever
        the hub (re)subscribes: then its follower cannot know what it missed)."""
        self._followers.setdefault(job_id, set()).add(event)
        self._someone.set()
        try:
            yield
        finally:
            self._unfollow(job_id, event)

    def _unfollow(self, job_id: str, event: asyncio.Event) -> None:
        waiting = self._followers.get(job_id)
        if waiting is None:
            return
        waiting.discard(event)
        if not waiting:
            del self._followers[job_id]
            if not self._followers:
                self._idle_since = asyncio.get_running_loop().time()

    async def _listen_forever(self) -> None:
        # Not `while True`: a cancel that lands in redis-py's subscribe or close can come out as a
        # ConnectionError once stop() closes the client, and the loop would then reconnect and
        # hold the process's shutdown (seen once in the suite: a 300 s teardown).
        while not self._stopping:
            await self._someone.wait()
            try:
                await self._listen()
            except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError, OSError) as exc:
                if self._stopping:
                    return
                # OSError includes TimeoutError: Redis never confirmed the subscription.
                log.warning("stream_hub_reconnect", extra=fields(error=type(exc).__name__))
                self._wake_all()  # followers fall back on their own reads until Redis is back
                await asyncio.sleep(RECONNECT_S)
            except Exception:  # anything else (a message it cannot read) must not end the hub
                log.exception("stream_hub_failed")
                self._wake_all()
                await asyncio.sleep(RECONNECT_S)
            if not self._wanted():
                self._someone.clear()  # the next follow() subscribes again (Redis down: no retries)

    async def _listen(self) -> None:
        """Hold the subscription until nobody has followed a stream for LINGER_S."""
        pubsub = self._redis.pubsub()
        try:
            await pubsub.subscribe(keys.JOB_OUTPUT_CHANNEL)
            await _confirmed(pubsub)
            # Only now: a follower's read sent before Redis ran the SUBSCRIBE may have missed news.
            self._wake_all()
            while self._wanted() and not self._stopping:
                message = await pubsub.get_message(timeout=POLL_S)
                if message is not None and message["type"] == "message":
                    data = message["data"]
                    self._wake(data.decode() if isinstance(data, bytes) else str(data))
        finally:
            await asyncio.shield(pubsub.aclose())  # type: ignore[no-untyped-call]

    def _wanted(self) -> bool:
        """Whether anyone follows a stream, or did less than LINGER_S ago."""
        return bool(self._followers) or asyncio.get_running_loop().time() - self._idle_since < LINGER_S

    def _wake(self, job_id: str) -> None:
        for event in self._followers.get(job_id, ()):
            event.set()

    def _wake_all(self) -> None:
        for job_id in list(self._followers):
            self._wake(job_id)


async def _confirmed(pubsub: PubSub) -> None:
    """Wait for Redis's confirmation of the subscription (TimeoutError after CONFIRM_S)."""
    async with asyncio.timeout(CONFIRM_S):
        while True:
            message = await pubsub.get_message(timeout=POLL_S)
            if message is not None and message["type"] == "subscribe":
                return
