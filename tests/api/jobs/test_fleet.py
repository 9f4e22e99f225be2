"""The fleet as the API reads it (api/jobs/fleet.py): the job slots workers publish with their
heartbeats, live workers only (a real Redis, the worker's own heartbeat code)."""

from __future__ import annotations

import time

import pytest
import redis
import redis.asyncio as aioredis

from api.jobs.fleet import fleet_slots, live_workers
from shared import keys
from shared.config import Settings
from workers.jobs import WorkerJobs


@pytest.mark.anyio
async def test_fleet_slots_count_live_workers_only(settings: Settings, redis_client: redis.Redis) -> None:
    jobs = WorkerJobs(redis_client, lease_s=30, max_attempts=3, job_timeout_s=60)
    jobs.heartbeat("w1", slots=16)
    jobs.heartbeat("w2", slots=4)
    jobs.heartbeat("hooks", keys.WEBHOOK_WORKERS)  # a webhook-only worker runs no jobs
    redis_client.zadd(keys.WORKERS, {"old-version": time.time()})  # published no slots
    redis_client.zadd(keys.WORKERS, {"gone": time.time() - 3600})  # its heartbeat lapsed
    redis_client.hset(keys.WORKER_SLOTS, "gone", 64)
    client = aioredis.Redis.from_url(settings.require_redis_url(), decode_responses=True)
    try:
        assert await fleet_slots(client, heartbeat_ttl_s=30, unknown=8) == 16 + 4 + 8
        jobs.leave("w1")
        assert redis_client.hget(keys.WORKER_SLOTS, "w1") is None
        assert await fleet_slots(client, heartbeat_ttl_s=30, unknown=8) == 4 + 8
        redis_client.delete(keys.WORKERS)
        assert await fleet_slots(client, heartbeat_ttl_s=30, unknown=8) == 0
    finally:
        await client.aclose()


@pytest.mark.anyio
async def test_live_workers_counts_fresh_heartbeats(settings: Settings, redis_client: redis.Redis) -> None:
    jobs = WorkerJobs(redis_client, lease_s=30, max_attempts=3, job_timeout_s=60)
    client = aioredis.Redis.from_url(settings.require_redis_url(), decode_responses=True)
    try:
        assert await live_workers(client, heartbeat_ttl_s=30) == 0
        jobs.heartbeat("w1", slots=2)
        redis_client.zadd(keys.WORKERS, {"gone": time.time() - 3600})
        assert await live_workers(client, heartbeat_ttl_s=30) == 1
        jobs.leave("w1")
        assert await live_workers(client, heartbeat_ttl_s=30) == 0
    finally:
        await client.aclose()
