"""The API's job machinery as the running app wires it (its lifespan entered, so the events
subscription and the stream hub run), and a job driven through the worker's own store calls: for
the job services' tests (tests/api/jobs) and the OpenAI layer's above them (tests/api/openai)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import orjson
import pytest
import redis
from fastapi import FastAPI

from api.edge.auth import ANONYMOUS
from api.jobs.queue import JobQueue
from shared import keys
from shared.config import Settings
from shared.schemas import JobCreate
from workers.jobs import ClaimOutcome, WorkerJobs

OWNER = ANONYMOUS  # the owner of every job of an API without keys


@pytest.fixture
async def app(settings: Settings) -> AsyncIterator[FastAPI]:
    from api.app import create_app

    app = create_app(settings)
    async with app.router.lifespan_context(app):
        yield app


@pytest.fixture
def queue(app: FastAPI) -> JobQueue:
    job_queue: JobQueue = app.state.queue
    return job_queue


class ScriptedWorker:
    """Runs a job the way a genq worker does (workers/jobs.py's WorkerJobs: its claim and finish scripts,
    XADDs to the job's output stream), step by step as a test says, with no model."""

    def __init__(self, client: redis.Redis, settings: Settings) -> None:
        self._redis = client
        self._jobs = WorkerJobs(client, settings.lease_ttl_s, settings.max_attempts, settings.job_timeout_s)

    def claim(self, job_id: str) -> None:
        assert self._jobs.claim(job_id, "scripted").outcome is ClaimOutcome.CLAIMED

    def publish(self, job_id: str, delta: str, tokens: int) -> str:
        """One output entry of the first completion, and the message that wakes the API's followers,
        as workers/publish.py sends them; the entry's id."""
        entry_id = str(self._redis.xadd(keys.job_stream(job_id), {"delta": delta, "tokens": tokens}))
        self._redis.publish(keys.JOB_OUTPUT_CHANNEL, job_id)
        return entry_id

    def succeed(self, job_id: str, text: str, completion_tokens: int) -> None:
        output = {"text": text, "finish_reason": "length",
                  "usage": {"prompt_tokens": 1, "completion_tokens": completion_tokens}}  # fmt: skip
        fields: dict[str, str | bytes] = {"status": "succeeded", "output": orjson.dumps(output),
                                          "metrics": '{"inference_ms": 1}'}  # fmt: skip
        assert self._jobs.finish(job_id, "scripted", fields)


@pytest.fixture
def scripted(redis_client: redis.Redis, settings: Settings) -> ScriptedWorker:
    return ScriptedWorker(redis_client, settings)


async def submitted(queue: JobQueue, prompt: str = "a prompt", owner: str = OWNER) -> str:
    """A new queued job's id (cache off: every submission is a job of its own)."""
    accepted = await queue.submit(JobCreate(prompt=prompt, cache=False), owner, None)
    return accepted.job["id"]


async def woken(event: asyncio.Event, timeout_s: float = 2.0) -> bool:
    """Whether `event` is set within `timeout_s` (a listener's wake-up came)."""
    try:
        await asyncio.wait_for(event.wait(), timeout_s)
    except TimeoutError:
        return False
    return True
