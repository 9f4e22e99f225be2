"""The API's side of job records (api/jobs/store.py) against a real Redis: a submitted job is
readable by its owner only, an Idempotency-Key replay returns the first job, and a key at its
bound is refused with an error that names the setting, writing nothing."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

import pytest
import redis
import redis.asyncio as aioredis

from api.jobs.store import JobStore, NewJob, OwnerBounds
from api.redis_io.commands import DirectCommands
from shared import keys
from shared.config import Settings
from shared.errors import QuotaExceeded
from shared.jobqueue.records import job_message

QUEUE = keys.queue_for_model("placeholder-echo")


@pytest.fixture
async def client(settings: Settings) -> AsyncIterator[aioredis.Redis]:
    client = aioredis.Redis.from_url(settings.require_redis_url(), decode_responses=True)
    yield client
    await client.aclose()


def store(client: aioredis.Redis, bounds: OwnerBounds | None = None) -> JobStore:
    bounds = bounds or OwnerBounds()
    return JobStore(client, DirectCommands(client), job_ttl_s=3600, idempotency_ttl_s=60,
                    bounds=lambda _owner: bounds)  # fmt: skip


def new_job(job_id: str, owner: str = "key-a") -> NewJob:
    now = time.time()
    return NewJob(job_id=job_id, owner=owner, model="placeholder-echo", queue=QUEUE,
                  input_json=b'{"prompt":"hi"}', metadata_json=b"{}", created_at=now,
                  deadline=now + 60)  # fmt: skip


async def submit(jobs: JobStore, job: NewJob, idempotency: tuple[str, str] | None = None) -> str:
    message, queue_list = job_message(job.job_id, QUEUE, 0)
    return (await jobs.submit(job, message, queue_list, idempotency)).job_id


@pytest.mark.anyio
async def test_a_submitted_job_is_queued_and_read_by_its_owner_only(client: aioredis.Redis) -> None:
    jobs = store(client)
    assert await submit(jobs, new_job("j1")) == "j1"
    record = await jobs.get("j1", "key-a")
    assert record is not None and record["status"] == "queued"
    assert await jobs.get("j1", "key-b") is None
    assert await client.llen(keys.queue_key(QUEUE, 0)) == 1


@pytest.mark.anyio
async def test_an_idempotency_key_replay_returns_the_first_job(client: aioredis.Redis) -> None:
    jobs = store(client)
    idem = (keys.idempotency("key-a", "k1"), "digest-1")
    assert await submit(jobs, new_job("j1"), idem) == "j1"
    assert await submit(jobs, new_job("j2"), idem) == "j1"
    assert await jobs.get("j2", "key-a") is None


@pytest.mark.anyio
async def test_a_key_at_its_live_job_bound_is_refused_naming_the_setting(
    client: aioredis.Redis, redis_client: redis.Redis
) -> None:
    jobs = store(client, OwnerBounds(live_jobs=1))
    await submit(jobs, new_job("j1"))
    with pytest.raises(QuotaExceeded) as refused:
        await submit(jobs, new_job("j2"))
    assert refused.value.param == "live_jobs" and "GENQ_MAX_LIVE_JOBS_PER_KEY" in refused.value.message
    assert redis_client.exists(keys.job("j2")) == 0
    assert await submit(jobs, new_job("j3", owner="key-b")) == "j3"  # another key is not held to it
