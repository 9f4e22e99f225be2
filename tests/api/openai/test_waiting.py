"""api/openai/waiting.py: a non-streaming completion waits for its job past max_wait_s, in rounds,
and a client that left between rounds cancels its job (against the running app's queue and the
suite's Redis, with no worker: a test ends the job itself)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import pytest
import redis
from starlette.requests import Request
from starlette.types import Message

from api.jobs.queue import JobQueue
from api.openai.waiting import wait_for_job
from shared.config import Settings
from shared.schemas import JobStatus
from tests.api.conftest import OWNER, ScriptedWorker, submitted

pytestmark = pytest.mark.anyio


@pytest.fixture
def settings(make_settings: Callable[..., Settings], redis_client: redis.Redis) -> Settings:
    return make_settings(max_wait_s=0.2)


def client_request(connected: bool) -> Request:
    """The completion's HTTP request, its client still there or gone."""

    async def receive() -> Message:
        if connected:
            await asyncio.Event().wait()  # nothing more from the client: it waits for the answer
        return {"type": "http.disconnect"}

    return Request({"type": "http", "method": "POST", "path": "/v1/completions", "headers": []}, receive)


async def test_a_job_that_ends_after_max_wait_s_is_still_answered(
    queue: JobQueue, scripted: ScriptedWorker
) -> None:
    """max_wait_s bounds one round, not the wait: the job's answer comes when it ends."""
    job_id = await submitted(queue)

    async def run_job_late() -> None:
        await asyncio.sleep(0.5)
        scripted.claim(job_id)
        scripted.succeed(job_id, "done", completion_tokens=1)

    running = asyncio.create_task(run_job_late())
    started = time.monotonic()
    first = await queue.get(job_id, OWNER)
    job = await wait_for_job(queue, first, OWNER, client_request(connected=True), max_wait_s=0.2)
    await running
    assert job["status"] is JobStatus.SUCCEEDED and job["output"] is not None
    assert job["output"]["text"] == "done"
    assert time.monotonic() - started >= 0.5


async def test_a_client_that_left_cancels_its_job(queue: JobQueue) -> None:
    """Nobody will read the answer: the job stops holding a worker (or its queue place)."""
    job_id = await submitted(queue)
    started = time.monotonic()
    first = await queue.get(job_id, OWNER)
    job = await wait_for_job(queue, first, OWNER, client_request(connected=False), max_wait_s=0.2)
    assert job["status"] is JobStatus.CANCELED
    assert (await queue.get(job_id, OWNER))["status"] is JobStatus.CANCELED
    assert time.monotonic() - started < 2  # after one round
