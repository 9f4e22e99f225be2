"""SIGTERM (the Kubernetes scale-in path): a worker stops taking jobs, finishes what it holds
within GENQ_DRAIN_TIMEOUT_S, hands back what it cannot finish, and exits; nothing is lost."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import pytest
import redis

from shared.config import Settings
from tests.conftest import WorkerProcess, api_client, wait_until_running

pytestmark = [pytest.mark.anyio, pytest.mark.slow]


async def test_sigterm_finishes_jobs_in_flight(
    make_settings: Callable[..., Settings],
    redis_client: redis.Redis,
    start_worker: Callable[..., WorkerProcess],
) -> None:
    settings = make_settings(placeholder_step_s=0.05, drain_timeout_s=30)
    worker = start_worker(settings, "--concurrency=2")
    async with api_client(settings) as api:
        held = [
            (await api.post("/v1/jobs", json={"prompt": f"a{i}", "max_tokens": 30})).json()["id"]
            for i in range(2)
        ]
        await wait_until_running(redis_client, held)
        waiting = (await api.post("/v1/jobs", json={"prompt": "later", "max_tokens": 2})).json()["id"]
        assert await asyncio.to_thread(worker.terminate) == 0
        assert not worker.ready_file.exists()
        for job_id in held:
            job = (await api.get(f"/v1/jobs/{job_id}")).json()
            assert job["status"] == "succeeded", job
        # The job it never took is still queued, for the next worker.
        assert (await api.get(f"/v1/jobs/{waiting}")).json()["status"] == "queued"
        start_worker(settings)
        assert (await api.get(f"/v1/jobs/{waiting}", params={"wait": 30})).json()["status"] == "succeeded"


async def test_drain_timeout_hands_unfinished_jobs_back(
    make_settings: Callable[..., Settings],
    redis_client: redis.Redis,
    start_worker: Callable[..., WorkerProcess],
) -> None:
    settings = make_settings(placeholder_step_s=0.05, drain_timeout_s=1, visibility_timeout_s=900)
    worker = start_worker(settings, "--concurrency=2")
    async with api_client(settings) as api:
        long = [
            (await api.post("/v1/jobs", json={"prompt": f"a{i}", "max_tokens": 400})).json()["id"]
            for i in range(2)
        ]
        await wait_until_running(redis_client, long)
        started = time.monotonic()
        await asyncio.to_thread(worker.terminate)
        assert time.monotonic() - started < 15  # far less than the 20 s the jobs need
        for job_id in long:
            assert redis_client.hget(f"genq:job:{job_id}", "status") == "queued"
        start_worker(make_settings(placeholder_step_s=0.001))
        for job_id in long:
            job = (await api.get(f"/v1/jobs/{job_id}", params={"wait": 30})).json()
            assert job["status"] == "succeeded"
            assert job["output"]["usage"]["completion_tokens"] == 400
