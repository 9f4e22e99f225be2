"""Queue statistics for /metrics and admission control: one pipelined round trip, cached for
about a second per process, so scrapes and submissions never hammer Redis."""

from __future__ import annotations

import asyncio
import time

import redis.asyncio as aioredis

from shared import keys
from shared.metrics import UNACKED_BY_QUEUE_LUA, QueueStats, RedisMemory, queue_list_keys
from shared.store import as_text


class QueueStatsReader:
    def __init__(self, client: aioredis.Redis, queues: list[str], max_age_s: float = 1.0) -> None:
        self._redis = client
        self._queues = queues
        self._max_age_s = max_age_s
        self._unacked_script = client.register_script(UNACKED_BY_QUEUE_LUA)
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
        async with self._redis.pipeline(transaction=False) as pipe:
            for queue in self._queues:
                for key in queue_list_keys(queue):
                    pipe.llen(key)
                pipe.scard(keys.running(queue))
            await self._unacked_script(keys=[keys.KOMBU_UNACKED], client=pipe)  # queued, not run yet
            pipe.info("memory")
            replies = await pipe.execute()
        memory = replies.pop()
        self.memory = RedisMemory(int(memory.get("used_memory", 0)), int(memory.get("maxmemory", 0)))
        total, flat = replies[-1]
        unacked = {as_text(flat[i]): int(flat[i + 1]) for i in range(0, len(flat), 2)}
        stats = []
        per_queue = len(queue_list_keys("")) + 1
        for index, queue in enumerate(self._queues):
            chunk = replies[index * per_queue : (index + 1) * per_queue]
            stats.append(QueueStats(queue, sum(chunk[:-1]), unacked.get(queue, 0), int(chunk[-1])))
        return stats, int(total)
