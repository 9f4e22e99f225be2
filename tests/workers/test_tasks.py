"""workers/tasks.py: the generate task runs its job through the process's runtime (a real runtime,
the placeholder engine, a job accepted by the real API), and a job the runtime hands back is
rejected with requeue, so the broker gives its message to a worker again. The task keeps its
message until the job is over (acks_late) and after its worker dies (reject_on_worker_lost)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Iterator
from typing import cast

import pytest
import redis
from celery.exceptions import Reject

from shared import keys
from shared.config import Settings
from tests.workers.test_runtime import accepted
from workers import context
from workers.context import Runtime
from workers.engine import build_engine
from workers.job_runner import HandBack
from workers.runtime import WorkerRuntime
from workers.tasks import generate
from workers.worker import engine_config

pytestmark = pytest.mark.anyio


@pytest.fixture(autouse=True)
def restored() -> Iterator[None]:
    saved = list(context._current)
    yield
    context._current[:] = saved


@pytest.fixture
async def runtime(
    make_settings: Callable[..., Settings], redis_client: redis.Redis
) -> AsyncIterator[WorkerRuntime]:
    settings = make_settings(placeholder_step_s=0.005)
    worker = WorkerRuntime(settings)
    worker.attach_engine(build_engine(engine_config(settings, on_fatal=worker.on_engine_fatal)))
    worker.start()
    context.install(worker)
    yield worker
    worker.stop()


def test_the_task_keeps_its_message_until_the_job_is_over() -> None:
    assert generate.name == keys.GENERATE_TASK
    assert generate.acks_late and generate.reject_on_worker_lost


async def test_the_task_runs_its_job_through_the_installed_runtime(
    runtime: WorkerRuntime, redis_client: redis.Redis
) -> None:
    job_id = await accepted(runtime.settings, max_tokens=3)
    await asyncio.to_thread(generate, job_id)
    assert redis_client.hget(keys.job(job_id), "status") == "succeeded"


class _HandsBack:
    """A runtime whose store stayed unreachable past its store-call retries."""

    def run(self, job_id: str) -> None:
        raise HandBack(f"Redis unreachable: ConnectionError ({job_id})")


def test_a_handed_back_job_is_rejected_with_requeue() -> None:
    context.install(cast(Runtime, _HandsBack()))
    with pytest.raises(Reject) as caught:
        generate("job-1")
    assert caught.value.requeue and "job-1" in str(caught.value.reason)
