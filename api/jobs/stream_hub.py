"""Wakes the followers of jobs whose output moved: one pub/sub subscription per API process.

Workers PUBLISH a job's id on JOB_OUTPUT_CHANNEL with each XADD to its output stream
(workers/publish.py). While anyone in this process follows a stream, and LINGER_S after the last
one left, one task here holds that subscription and wakes the followers of the job each message
names; each then reads its entries after its own cursor. A wake costs the job's own followers
only, and an idle stream costs nothing in Redis.

Pub/sub delivers only while subscribed: right after (re)subscribing the hub wakes every follower,
and follow.py re-reads on its own every RECHECK_S, which bounds the delay of anything lost. What
it shares with the job-events listener is in api/jobs/notifications.py."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator

import redis.asyncio as aioredis

from api.jobs.notifications import JobNotifications
from shared import keys

#: The subscription is kept this long after the last follower left, so a process that serves
#: streams now and then does not subscribe and unsubscribe for each.
LINGER_S = 10.0


class StreamHub(JobNotifications):
    name = "stream_hub"
    channel = keys.JOB_OUTPUT_CHANNEL

    def __init__(self, client: aioredis.Redis) -> None:
        super().__init__(client)
        self._someone = asyncio.Event()
        #: When the last follower left (loop time): the subscription ends LINGER_S later.
        self._idle_since = 0.0

    @property
    def subscribed(self) -> bool:
        """Whether the hub holds its subscription now (or is opening it)."""
        return self._someone.is_set()

    @contextlib.contextmanager
    def follow(self, job_id: str, event: asyncio.Event) -> Iterator[None]:
        """Within the block, `event` is set whenever the job's stream gets entries (and whenever
        the hub (re)subscribes: then its follower cannot know what it missed)."""
        with self._registered(job_id, event):
            self._someone.set()
            yield

    def _now_idle(self) -> None:
        self._idle_since = asyncio.get_running_loop().time()

    async def _until_wanted(self) -> None:
        await self._someone.wait()

    def _listened(self) -> None:
        if not self._still_wanted():
            self._someone.clear()  # the next follow() subscribes again (Redis down: no retries)

    def _still_wanted(self) -> bool:
        """Whether anyone follows a stream, or did less than LINGER_S ago."""
        return bool(self._waiters) or asyncio.get_running_loop().time() - self._idle_since < LINGER_S
