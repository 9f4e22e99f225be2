"""The worker runtime (workers/runtime.py) driven directly, without Celery: a real Redis, jobs
accepted by the real API, the placeholder engine (a real engine lifecycle, zero-cost tokens).
What a task thread does with one message: claim, generate, finish; skip what it does not hold;
hand a drained job back without counting an attempt."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Callable
from typing import cast

import pytest
import redis

from shared import keys
from shared.config import Settings
from tests.conftest import api_client, wait_until_running
from workers.engine import build_engine
from workers.runtime import WorkerRuntime
from workers.worker import engine_config

pytestmark = pytest.mark.anyio


@pytest.fixture
async def runtime(
    make_settings: Callable[..., Settings], redis_client: redis.Redis
) -> AsyncIterator[WorkerRuntime]:
    settings = make_settings(placeholder_step_s=0.01)
    worker = WorkerRuntime(settings)
    worker.attach_engine(build_engine(engine_config(settings, on_fatal=worker.on_engine_fatal)))
    worker.start()
    yield worker
    worker.stop()


async def accepted(settings: Settings, **body: object) -> str:
    async with api_client(settings) as api:
        response = await api.post("/v1/jobs", json={"prompt": "one two three", "cache": False, **body})
    assert response.status_code == 202, response.text
    return str(response.json()["id"])


async def test_a_job_is_claimed_run_and_finished_once(
    runtime: WorkerRuntime, redis_client: redis.Redis
) -> None:
    job_id = await accepted(runtime.settings, max_tokens=3)
    await asyncio.to_thread(runtime.run, job_id)
    record = redis_client.hgetall(keys.job(job_id))
    assert (record["status"], record["worker"], record["attempts"]) == ("succeeded", runtime.worker_id, "1")
    assert runtime.inflight == 0
    await asyncio.to_thread(runtime.run, job_id)  # the broker handed the message out again
    assert redis_client.hget(keys.job(job_id), "attempts") == "1"  # skipped: it is over


async def test_a_job_canceled_before_it_runs_is_skipped(
    runtime: WorkerRuntime, redis_client: redis.Redis
) -> None:
    job_id = await accepted(runtime.settings, max_tokens=3)
    async with api_client(runtime.settings) as api:
        assert (await api.post(f"/v1/jobs/{job_id}/cancel")).json()["status"] == "canceled"
    await asyncio.to_thread(runtime.run, job_id)
    assert redis_client.hget(keys.job(job_id), "status") == "canceled"
    assert redis_client.hget(keys.job(job_id), "attempts") in (None, "0")


async def test_a_job_refused_by_the_engine_fails_with_its_reason(
    runtime: WorkerRuntime, redis_client: redis.Redis
) -> None:
    job_id = await accepted(runtime.settings, max_tokens=3, logprobs=True)
    await asyncio.to_thread(runtime.run, job_id)
    record = redis_client.hgetall(keys.job(job_id))
    assert record["status"] == "failed" and '"invalid_request"' in record["error"]


async def test_a_drained_job_goes_back_to_the_queue_without_an_attempt(
    runtime: WorkerRuntime, redis_client: redis.Redis
) -> None:
    job_id = await accepted(runtime.settings, max_tokens=500)
    running = threading.Thread(target=runtime.run, args=(job_id,))
    running.start()
    await wait_until_running(redis_client, [job_id])
    runtime.drain(timeout_s=0.05)  # SIGTERM: the job is stopped and handed back at the timeout
    await asyncio.to_thread(running.join, 30)
    record = cast(dict[str, str], redis_client.hgetall(keys.job(job_id)))
    assert (record["status"], record["attempts"], record["worker"]) == ("queued", "0", "")
    assert redis_client.zscore(keys.queued(record["queue"]), job_id) is not None  # findable again
