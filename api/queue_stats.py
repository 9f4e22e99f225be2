"""Queue statistics for /metrics and admission control: one pipelined round trip, cached for
about a second per process, so scrapes and submissions never hammer Redis."""

from __future__ import annotations

import asyncio
import time

import redis.asyncio as aioredis

from shared import keys
from shared.metrics import QueueStats, RedisMemory


class QueueStatsReader:
    def __init__(self, client: aioredis.Redis, queues: list[str], max_age_s: float = 1.0) -> None:
        self._redis = client
        self._queues = queues
        self._max_age_s = max_age_s
        self._cached: tuple[float, list[QueueStats], int] | None = None
        #: The job store's Redis memory as last read: (used bytes, maxmemory; 0 = no limit).
        self.memory = RedisMemory(0, 0)
        #: One read in flight per process, however many requests find the cache stale together
        #: (as ModelFingerprints in api/cache.py).
        self._refreshing: asyncio.Task[None] | None = None

    async def read(self) -> tuple[list[QueueStats], int]:
        if self._cached is None or time.monotonic() - self._cached[0] >= self._max_age_s:
            if self._refreshing is None or self._refreshing.done():
                self._refreshing = asyncio.create_task(self._refresh())
            await asyncio.shield(self._refreshing)
        assert self._cached is not None
        return self._cached[1], self._cached[2]

    async def _refresh(self) -> None:
        stats, total = await self._fetch()
        self._cached = (time.monotonic(), stats, total)

    async def length(self, queue: str) -> int:
        stats, _ = await self.read()
        return next((item.length for item in stats if item.queue == queue), 0)

    async def _fetch(self) -> tuple[list[QueueStats], int]:
        """Constant work per queue: counts the job store keeps, never a scan of the messages."""
        async with self._redis.pipeline(transaction=False) as pipe:
            for queue in self._queues:
                pipe.zcard(keys.queued(queue))
                pipe.scard(keys.running(queue))
            pipe.hlen(keys.KOMBU_UNACKED)
            pipe.info("memory")
            replies = await pipe.execute()
        memory = replies.pop()
        self.memory = RedisMemory(int(memory.get("used_memory", 0)), int(memory.get("maxmemory", 0)))
        unacked = int(replies.pop())
        stats = [
            QueueStats(queue, int(replies[2 * i]), int(replies[2 * i + 1]))
            for i, queue in enumerate(self._queues)
        ]
        return stats, unacked
