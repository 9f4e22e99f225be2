"""Job notifications: what the API's two pub/sub listeners share (api/jobs/events.py: jobs that may
have ended; api/jobs/stream_hub.py: job streams that got entries). One subscription per process,
whose messages name a job, fanned out to the asyncio.Events that local requests registered for
that job; and a listening task that outlives Redis going away. Pub/sub delivers only while
subscribed, so every waiter is woken whenever the subscription is lost, and whenever Redis has
confirmed it (again): each then reads for itself what it may have missed. The subscription is
redis-py's PubSub, held by api/redis_io/subscription.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterator

import redis.asyncio as aioredis
import redis.exceptions

from api.redis_io.subscription import Subscription
from shared.logging import fields

log = logging.getLogger("genq.api")

#: How long a lost subscription waits before it subscribes again.
RECONNECT_S = 0.5
#: Longest wait for Redis to confirm the subscription before the listener tries again.
CONFIRM_S = 5.0


class JobNotifications:
    """A job id's waiters, woken by the messages on `channel` (each names a job). `name` prefixes
    the log events `<name>_reconnect` and `<name>_failed` and names the task. The client is the
    listener's own (api/redis_io/client.py's listener_client), closed by stop()."""

    name = "job_notifications"
    channel = ""
    #: How often the listener asks whether its subscription is still wanted (and still held).
    poll_s = 1.0

    def __init__(self, client: aioredis.Redis) -> None:
        self._redis = client
        self._waiters: dict[str, set[asyncio.Event]] = {}
        self._task: asyncio.Task[None] | None = None
        #: Set by stop(): the task ends at its next turn even if redis-py lost the cancel.
        self._stopping = False

    def start(self) -> None:
        self._task = asyncio.create_task(self._listen_forever(), name=f"genq-{self.name}")

    async def stop(self) -> None:
        self._stopping = True
        if self._task is not None:
            self._task.cancel()
            # Bounded: a cancel that lands mid-subscribe can leave redis-py's pubsub close waiting
            # on a reply that never comes; the client is closed right after anyway.
            await asyncio.wait({self._task}, timeout=1.0)
        await self._redis.aclose()

    @contextlib.contextmanager
    def _registered(self, job_id: str, event: asyncio.Event) -> Iterator[None]:
        """Within the block, `event` is set by every message naming the job (and every wake-all)."""
        self._waiters.setdefault(job_id, set()).add(event)
        try:
            yield
        finally:
            waiting = self._waiters.get(job_id)
            if waiting is not None:
                waiting.discard(event)
                if not waiting:
                    del self._waiters[job_id]
                    if not self._waiters:
                        self._now_idle()

    def _now_idle(self) -> None:
        """The last waiter left."""

    def _wake(self, job_id: str) -> None:
        for event in self._waiters.get(job_id, ()):
            event.set()

    def _wake_all(self) -> None:
        for job_id in list(self._waiters):
            self._wake(job_id)

    async def _listen_forever(self) -> None:
        # Not `while True`: a cancel that lands in redis-py's subscribe or close can come out as a
        # ConnectionError once stop() closes the client, and the loop would then reconnect and
        # hold the process's shutdown (seen once in the suite: a 300 s teardown).
        while not self._stopping:
            await self._until_wanted()
            try:
                await self._listen()
            except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError, OSError) as exc:
                if self._stopping:
                    return
                # OSError includes TimeoutError: Redis never confirmed the subscription.
                log.warning(f"{self.name}_reconnect", extra=fields(error=type(exc).__name__))
                self._wake_all()  # waiters fall back on their own reads until Redis is back
                await asyncio.sleep(RECONNECT_S)
            except Exception:  # anything else (a message it cannot read) must not end the listener
                log.exception(f"{self.name}_failed")
                self._wake_all()
                await asyncio.sleep(RECONNECT_S)
            self._listened()

    async def _until_wanted(self) -> None:
        """Returns when the subscription should be held (at once, unless a listener holds it only
        while someone waits)."""

    def _still_wanted(self) -> bool:
        """Whether the subscription should still be held."""
        return True

    def _listened(self) -> None:
        """The subscription ended (it was no longer wanted, or it was lost)."""

    async def _listen(self) -> None:
        """Hold the subscription, waking the waiters its messages name, until it is not wanted.
        Each confirmation wakes everyone: a waiter's read sent before Redis ran the SUBSCRIBE (or
        while redis-py subscribed again after a lost connection) may have missed news."""
        subscription = await Subscription.open(self._redis, self.channel, self._on_message, self._wake_all)
        try:
            await subscription.confirmed(CONFIRM_S)
            while self._still_wanted() and not self._stopping:
                await subscription.held_for(self.poll_s)
        finally:
            await subscription.aclose()

    def _on_message(self, data: bytes) -> None:
        # Anyone who can PUBLISH can send bytes that are no UTF-8: they name no job, wake nobody.
        self._wake(data.decode(errors="replace"))
