"""api/jobs/queue_stats.py: the queue lengths, running counts, unacknowledged messages and Redis
memory that admission control and /metrics read, from the job store's own counts (real Redis,
its keys written as the job store and kombu write them), at most once per max_age_s."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
import redis
import redis.asyncio as aioredis

from api.jobs.queue_stats import QueueStatsReader
from cli.redis_server import EmbeddedRedis
from shared import keys
from shared.metrics import QueueStats

pytestmark = pytest.mark.anyio

QUEUE = keys.queue_for_model("placeholder-echo")


@pytest.fixture
async def client(redis_server: EmbeddedRedis, redis_client: redis.Redis) -> AsyncIterator[aioredis.Redis]:
    client = aioredis.Redis.from_url(redis_server.url, decode_responses=True)
    yield client
    await client.aclose()


def fill(redis_client: redis.Redis, queued: int, running: int, deliveries: int, unacked: int) -> None:
    if queued:
        redis_client.zadd(keys.queued(QUEUE), {f"job-{i}": i for i in range(queued)})
    if running:
        redis_client.sadd(keys.running(QUEUE), *[f"run-{i}" for i in range(running)])
    if deliveries:
        redis_client.rpush(keys.queue_key(keys.WEBHOOK_QUEUE, 0), *[f"d{i}" for i in range(deliveries)])
    if unacked:
        redis_client.hset(keys.KOMBU_UNACKED, mapping={f"tag-{i}": "m" for i in range(unacked)})


async def test_a_snapshot_counts_each_queue_and_the_unacknowledged(
    client: aioredis.Redis, redis_client: redis.Redis
) -> None:
    fill(redis_client, queued=3, running=2, deliveries=4, unacked=5)
    reader = QueueStatsReader(client, [QUEUE, keys.WEBHOOK_QUEUE])
    snapshot = await reader.read()
    assert snapshot.stats == [QueueStats(QUEUE, 3, 2), QueueStats(keys.WEBHOOK_QUEUE, 4, 0)]
    assert snapshot.unacked_total == 5
    assert snapshot.memory.used_bytes > 0 and snapshot.memory.max_bytes == 0
    assert await reader.length(QUEUE) == 3 and await reader.length("genq.other-model") == 0


async def test_a_snapshot_is_reused_until_it_is_max_age_s_old(
    client: aioredis.Redis, redis_client: redis.Redis
) -> None:
    reader = QueueStatsReader(client, [QUEUE], max_age_s=0.3)
    assert await reader.length(QUEUE) == 0
    fill(redis_client, queued=2, running=0, deliveries=0, unacked=0)
    assert await reader.length(QUEUE) == 0  # still the cached snapshot
    await asyncio.sleep(0.35)
    assert await reader.length(QUEUE) == 2


async def test_readers_that_find_it_stale_together_share_one_round_trip(
    client: aioredis.Redis, redis_client: redis.Redis
) -> None:
    def zcard_calls() -> int:
        stats = redis_client.info("commandstats").get("cmdstat_zcard", {})
        return int(stats.get("calls", 0)) if isinstance(stats, dict) else 0

    reader = QueueStatsReader(client, [QUEUE])
    before = zcard_calls()
    snapshots = await asyncio.gather(*(reader.read() for _ in range(50)))
    assert zcard_calls() - before == 1
    assert all(snapshot is snapshots[0] for snapshot in snapshots)
