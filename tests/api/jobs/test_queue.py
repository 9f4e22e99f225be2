"""api/jobs/queue.py's own rules, against the running app's queue and the suite's Redis: storage
back-pressure, the long-poll's cap, what a job's summary previews, and who may read what. (The
HTTP contract it serves is tests/api/routes/test_jobs.py's; its input checks, test_bad_input's;
its admission control, test_admission's.)"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

import pytest
import redis

from api.jobs.queue import PREVIEW_CHARS, JobQueue, job_preview
from shared.config import Settings
from shared.errors import NotFound, StorageRefused
from shared.schemas import JobCreate, JobStatus
from tests.api.conftest import OWNER, submitted
from tests.conftest import assert_nothing_written

pytestmark = pytest.mark.anyio


@pytest.fixture
def maxmemory(redis_client: redis.Redis) -> Iterator[Callable[[int], object]]:
    """Sets the suite's Redis's maxmemory for one test (0, no limit, again after it)."""
    yield lambda limit: redis_client.config_set("maxmemory", limit)
    redis_client.config_set("maxmemory", 0)


@pytest.fixture
def settings(make_settings: Callable[..., Settings], redis_client: redis.Redis) -> Settings:
    return make_settings(storage_headroom=0.5, max_wait_s=0.5)


async def test_past_the_storage_headroom_a_submission_is_refused_and_writes_nothing(
    queue: JobQueue, redis_client: redis.Redis, maxmemory: Callable[[int], object]
) -> None:
    used = int(redis_client.info("memory")["used_memory"])
    maxmemory(int(used * 1.5))  # about 67% in use, past the 50% headroom
    with pytest.raises(StorageRefused) as refused:
        await queue.submit(JobCreate(prompt="x"), OWNER, None)
    assert "GENQ_STORAGE_HEADROOM 0.5" in refused.value.message
    assert refused.value.type == "unavailable" and refused.value.headers == {"Retry-After": "5"}
    assert_nothing_written(redis_client)


async def test_below_the_headroom_submissions_go_on(
    queue: JobQueue, redis_client: redis.Redis, maxmemory: Callable[[int], object]
) -> None:
    maxmemory(int(redis_client.info("memory")["used_memory"]) * 4)  # about 25% in use
    job = (await queue.submit(JobCreate(prompt="x"), OWNER, None)).job
    assert job["status"] is JobStatus.QUEUED


async def test_a_long_poll_waits_no_longer_than_max_wait_s(queue: JobQueue) -> None:
    job_id = await submitted(queue)  # no worker: it stays queued
    started = time.monotonic()
    job = await queue.wait(job_id, OWNER, timeout_s=30)
    assert job["status"] is JobStatus.QUEUED
    assert 0.4 <= time.monotonic() - started < 2  # GENQ_MAX_WAIT_S is 0.5 here


async def test_another_owners_job_reads_as_missing_everywhere(queue: JobQueue) -> None:
    job_id = await submitted(queue)
    for read in (queue.get, queue.webhook_log, queue.cancel):
        with pytest.raises(NotFound):
            await read(job_id, "key-0123456789abcdef")
    with pytest.raises(NotFound):
        await queue.wait(job_id, "key-0123456789abcdef", 1)
    assert (await queue.get(job_id, OWNER))["status"] is JobStatus.QUEUED  # the cancel changed nothing


def test_a_preview_is_the_start_of_the_prompt_or_of_the_last_message() -> None:
    assert job_preview(JobCreate(prompt="p" * 500)) == "p" * PREVIEW_CHARS
    messages = [{"role": "user", "content": "first"}, {"role": "assistant", "content": "last"}]
    assert job_preview(JobCreate.model_validate({"messages": messages})) == "last"
