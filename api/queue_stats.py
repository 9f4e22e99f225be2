"""Queue statistics (and the Redis's memory) for /metrics and admission control: one pipelined
round trip, cached for about a second per process, so scrapes and submissions never hammer Redis."""

from __future__ import annotations

import asyncio
import time

import redis.asyncio as aioredis

from shared import keys
from shared.metrics import UNACKED_BY_QUEUE_LUA, QueueSnapshot, QueueStats, RedisMemory, queue_list_keys
from shared.store import as_text


class QueueStatsReader:
    def __init__(self, client: aioredis.Redis, queues: list[str], max_age_s: float = 1.0) -> None:
        self._redis = client
        self._queues = queues
        self._max_age_s = max_age_s
        self._unacked_script = client.register_script(UNACKED_BY_QUEUE_LUA)
        self._cached: tuple[float, QueueSnapshot] | None = None
        #: One read in flight per process, however many requests find the cache stale together
        #: (as ModelFingerprints in api/cache.py).
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
        async with self._redis.pipeline(transaction=False) as pipe:
            for queue in self._queues:
                for key in queue_list_keys(queue):
                    pipe.llen(key)
                pipe.scard(keys.running(queue))
            await self._unacked_script(keys=[keys.KOMBU_UNACKED], client=pipe)  # queued, not run yet
            pipe.info("memory")
            replies = await pipe.execute()
        memory = replies.pop()
        total, flat = replies[-1]
        unacked = {as_text(flat[i]): int(flat[i + 1]) for i in range(0, len(flat), 2)}
        stats = []
        per_queue = len(queue_list_keys("")) + 1
        for index, queue in enumerate(self._queues):
            chunk = replies[index * per_queue : (index + 1) * per_queue]
            stats.append(QueueStats(queue, sum(chunk[:-1]), unacked.get(queue, 0), int(chunk[-1])))
        used = RedisMemory(int(memory["used_memory"]), int(memory.get("maxmemory", 0)))
        return QueueSnapshot(stats, int(total), used)
