"""One reader per API process for every followed job's output stream, fanned out to followers.

Each follower used to loop its own XREAD BLOCK, and a blocking read holds a pooled connection for
its whole block: 512 open streams took every connection of the pool, and every request of every
key got 503. Here one task on one dedicated connection issues XREAD BLOCK over all followed
streams at once and, when entries arrive, wakes that job's followers; a follower then reads its
entries after its own cursor with one short XRANGE. An idle stream costs the process an
asyncio.Event and its place in that one command, never a connection (README, Reliability).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterator
from typing import Any

import redis.asyncio as aioredis
import redis.exceptions

from api.jobs.streams import entry_order
from shared import keys
from shared.logging import fields

log = logging.getLogger("genq.api")

#: Longest XREAD BLOCK: a stream that starts being followed joins the read within this long (its
#: follower reads what was there on its own first, so nothing is missed meanwhile).
BLOCK_MS = 250


class StreamHub:
    def __init__(self, client: aioredis.Redis) -> None:
        #: A client of its own (one connection): the blocking read never takes a pooled one.
        self._redis = client
        self._followers: dict[str, set[asyncio.Event]] = {}
        #: Per followed job, the newest entry id the hub has seen (where its next read starts).
        self._cursors: dict[str, str] = {}
        self._someone = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._read_forever(), name="genq-stream-hub")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.wait({self._task}, timeout=1.0)
        await self._redis.aclose()

    @contextlib.contextmanager
    def follow(self, job_id: str, after_id: str, event: asyncio.Event) -> Iterator[None]:
        """While the block runs, `event` is set whenever entries newer than the hub's cursor arrive
        on the job's stream. `after_id`: the follower's cursor (the hub's never starts later)."""
        known = self._cursors.get(job_id)
        if known is None or entry_order(after_id) < entry_order(known):
            self._cursors[job_id] = after_id
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
            self._cursors.pop(job_id, None)
        if not self._followers:
            self._someone.clear()

    async def _read_forever(self) -> None:
        while True:
            await self._someone.wait()
            try:
                await self._read_once()
            except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError, OSError) as exc:
                log.warning("stream_hub_reconnect", extra=fields(error=type(exc).__name__))
                self._wake_all()  # followers fall back on their own reads until Redis is back
                await asyncio.sleep(0.5)

    async def _read_once(self) -> None:
        job_of = {keys.job_stream(job_id): job_id for job_id in self._cursors}
        streams: dict[Any, Any] = {stream: self._cursors[job_id] for stream, job_id in job_of.items()}
        reply: list[tuple[str, list[tuple[str, Any]]]] = await self._redis.xread(  # type: ignore[assignment]
            streams, count=1, block=BLOCK_MS
        )
        # count=1: the hub only needs to know which streams moved; each follower reads the rest.
        for stream, rows in reply or []:
            job_id = job_of.get(str(stream), "")
            if job_id in self._cursors and rows:
                self._cursors[job_id] = str(rows[-1][0])
                self._wake(job_id)

    def _wake(self, job_id: str) -> None:
        for event in self._followers.get(job_id, ()):
            event.set()

    def _wake_all(self) -> None:
        for job_id in list(self._followers):
            self._wake(job_id)
