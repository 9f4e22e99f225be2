"""The worker runtime (workers/runtime.py) driven directly, without Celery: a real Redis, jobs
accepted by the real API, the placeholder engine (a real engine lifecycle, zero-cost tokens).
Start-up loads the job scripts; a drain hands a running job back without counting an attempt.
What a task thread does with one job: tests/workers/test_job_runner.py."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Callable
from typing import cast

import pytest
import redis

from shared import keys
from shared.config import Settings
from shared.jobqueue import scripts
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


def loaded(client: redis.Redis, names: list[str]) -> list[bool]:
    """Whether Redis holds each job script, as EVALSHA would find it."""
    return list(client.script_exists(*[client.register_script(scripts.source(name)).sha for name in names]))


async def test_start_up_loads_the_job_scripts(
    make_settings: Callable[..., Settings], redis_client: redis.Redis
) -> None:
    """The first job after a start (or a SCRIPT FLUSH) pays no NOSCRIPT reply, load and retry."""
    names = ["claim", "renew", "finish", "hand_back", "take"]
    redis_client.script_flush()
    settings = make_settings(placeholder_step_s=0.01)
    worker = WorkerRuntime(settings)
    worker.attach_engine(build_engine(engine_config(settings, on_fatal=worker.on_engine_fatal)))
    worker.start()
    try:
        assert loaded(redis_client, names) == [True] * len(names)
        job_id = await accepted(settings, max_tokens=3)
        redis_client.config_resetstat()
        await asyncio.to_thread(worker.run, job_id)
    finally:
        worker.stop()
    assert redis_client.hget(keys.job(job_id), "status") == "succeeded"
    assert "errorstat_NOSCRIPT" not in redis_client.info("errorstats")


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
