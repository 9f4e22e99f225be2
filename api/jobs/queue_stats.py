"""Queue statistics for /metrics and admission control: one pipelined round trip, cached for
about a second per process, so scrapes and submissions never hammer Redis."""

from __future__ import annotations

import asyncio
import time

import redis.asyncio as aioredis

from shared import keys
from shared.metrics import QueueSnapshot, QueueStats, RedisMemory


class QueueStatsReader:
    def __init__(self, client: aioredis.Redis, queues: list[str], max_age_s: float = 1.0) -> None:
        self._redis = client
        self._queues = queues
        self._max_age_s = max_age_s
        self._cached: tuple[float, QueueSnapshot] | None = None
        #: One read in flight per process, however many requests find the cache stale together
        #: (as ModelFingerprints in api/jobs/cache.py).
        self._refreshing: asyncio.Task[None] | None = None

    async def read(self) -> QueueSnapshot:
        if self._cached is None or time.monotonic() - self._cached[0] >= self._max_age_s:
            if self._refreshing is None or self._refreshing.done():
                self._refreshing = asyncio.create_task(self._refresh())
            await asyncio.shield(self._refreshing)
        assert self._cached is not None
        return self._cached[1]

    async def _refresh(self) -> None:
        self._cached = (time.monotonic(), await self._fetch())

    async def length(self, queue: str) -> int:
        snapshot = await self.read()
        return next((item.length for item in snapshot.stats if item.queue == queue), 0)

    async def _fetch(self) -> QueueSnapshot:
        """Constant work per queue: counts the job store keeps, never a scan of the messages."""
        async with self._redis.pipeline(transaction=False) as pipe:
            for queue in self._queues:
                if queue == keys.WEBHOOK_QUEUE:  # deliveries have no job-store index: their list
                    pipe.llen(keys.queue_key(queue, 0))
                else:
                    pipe.zcard(keys.queued(queue))
                pipe.scard(keys.running(queue))
            pipe.hlen(keys.KOMBU_UNACKED)
            pipe.info("memory")
            replies = await pipe.execute()
        memory = replies.pop()
        unacked = int(replies.pop())
        stats = [
            QueueStats(queue, int(replies[2 * i]), int(replies[2 * i + 1]))
            for i, queue in enumerate(self._queues)
        ]
        used = RedisMemory(int(memory["used_memory"]), int(memory.get("maxmemory", 0)))
        return QueueSnapshot(stats, unacked, used)
