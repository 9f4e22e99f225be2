"""The worker runtime (workers/runtime.py) driven directly, without Celery: a real Redis, jobs
accepted by the real API, the placeholder engine (a real engine lifecycle, zero-cost tokens).
What a task thread does with one message: claim, generate, finish; skip what it does not hold;
hand a drained job back without counting an attempt; tell the `output` notifier about the jobs
whose webhook asked for it, and only those, without reading their input back."""

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
from tests.conftest import api_client, monitored, wait_until_running
from workers.engine import build_engine
from workers.runtime import WorkerRuntime
from workers.webhooks.output import OutputWebhooks
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


async def test_a_thread_whose_job_ends_takes_the_next_with_its_finish_but_not_once_draining(
    runtime: WorkerRuntime, redis_client: redis.Redis
) -> None:
    """A thread's finish takes its next job in the same round trip (workers/jobs.py NextTake): a
    backlog is run by the one thread; a drain that began while a job ran takes none after it."""
    runtime.take_from([keys.queue_key(keys.queue_for_model(runtime.settings.model), 0)])
    first, second = [await accepted(runtime.settings, max_tokens=3) for _ in range(2)]
    await asyncio.to_thread(runtime.run, first)
    assert [redis_client.hget(keys.job(job), "status") for job in (first, second)] == ["succeeded"] * 2
    held, waiting = [await accepted(runtime.settings, max_tokens=40) for _ in range(2)]
    running = threading.Thread(target=runtime.run, args=(held,))
    running.start()
    await wait_until_running(redis_client, [held])
    runtime.drain(timeout_s=30)  # SIGTERM: `held` may end; nothing new is taken
    await asyncio.to_thread(running.join, 30)
    assert redis_client.hget(keys.job(held), "status") == "succeeded"
    assert redis_client.hget(keys.job(waiting), "status") == "queued"


async def test_only_jobs_whose_webhook_wants_output_reach_the_notifier(
    runtime: WorkerRuntime, redis_client: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The claimed input decides: a job with no `output` in its webhook filter (or no webhook)
    never reaches the notifier's sending thread, and nothing re-reads its input from Redis."""
    heard: list[str] = []  # the jobs the real notifier's thread took a notice of
    real_note = OutputWebhooks._note

    def note(notifier: OutputWebhooks, job_id: str) -> None:
        heard.append(job_id)
        real_note(notifier, job_id)

    monkeypatch.setattr(OutputWebhooks, "_note", note)
    hook = "http://127.0.0.1:9/hook"  # never called: no webhooks worker here
    api_settings = runtime.settings.model_copy(update={"webhook_allow_private": True})
    plain = await accepted(api_settings, max_tokens=3)
    completed_only = await accepted(api_settings, max_tokens=3, webhook=hook)  # filter: completed
    hooked = await accepted(api_settings, max_tokens=3, webhook=hook, webhook_events_filter=["output"])
    output_delivery = keys.WEBHOOK_DELIVERY.format(job_id=hooked, delivery="output:")
    with monitored(redis_client) as commands:
        for job_id in (plain, completed_only, hooked):
            await asyncio.to_thread(runtime.run, job_id)
        # The notifier takes its notices in order: once the hooked job's delivery is out, any
        # read that a notice of a job before it caused has been sent too.
        await until_pending(redis_client, output_delivery)
    for job_id in (plain, completed_only):
        assert redis_client.xlen(keys.job_stream(job_id)) >= 1  # it did publish output
        assert f"HGET {keys.job(job_id)} input" not in commands
    assert set(heard) == {hooked}


async def until_pending(client: redis.Redis, prefix: str, timeout_s: float = 10.0) -> None:
    """Until a webhook delivery whose key starts with `prefix` is pending."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not any(str(key).startswith(prefix) for key in client.zrange(keys.WEBHOOK_PENDING, 0, -1)):
        assert asyncio.get_running_loop().time() < deadline, f"no delivery {prefix}*"
        await asyncio.sleep(0.02)
