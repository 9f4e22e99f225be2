"""Job records as both tiers read them (shared/store.py): the views the API returns, and the
fleet's job slots as workers publish them with their heartbeats (a real Redis)."""

from __future__ import annotations

import time

import pytest
import redis
import redis.asyncio as aioredis

from shared import keys
from shared.config import Settings
from shared.schemas import JobStatus
from shared.store import fleet_slots, job_summary, public_job
from workers.jobs import WorkerJobs

RECORD = {
    "id": "j1", "owner": "key-a", "status": "succeeded", "model": "placeholder-echo",
    "input": '{"prompt":"hi"}', "output": '{"text":"hi"}', "metadata": '{"team":"a"}',
    "created_at": "1700000000.0", "started_at": "1700000000.25", "completed_at": "1700000001.0",
    "cached": "0", "preview": "hi",
}  # fmt: skip


def test_a_job_view_carries_times_as_rfc3339_and_its_queue_time() -> None:
    job = public_job(RECORD)
    assert job["status"] is JobStatus.SUCCEEDED
    assert (job["created_at"], job["started_at"]) == ("2023-11-14T22:13:20.000Z", "2023-11-14T22:13:20.250Z")
    assert job["metrics"]["queue_ms"] == 250.0
    assert job["output"] == {"text": "hi"} and job["metadata"] == {"team": "a"}
    assert job["urls"]["cancel"] == "/v1/jobs/j1/cancel"


def test_a_summary_has_the_preview_and_never_the_input_or_output() -> None:
    summary = job_summary(RECORD)
    assert summary["preview"] == "hi"
    assert "input" not in summary and "output" not in summary


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
