"""The job runner (workers/job_runner.py) driven through its worker's runtime, without Celery: a
real Redis, jobs accepted by the real API, the placeholder engine (a real engine lifecycle,
zero-cost tokens). What a task thread does with one message: claim, generate, finish; skip what it
does not hold; take the next job with its finish, but not once draining; tell the `output`
notifier about the jobs whose webhook asked for it, and only those, without reading their input
back."""

from __future__ import annotations

import asyncio
import threading

import pytest
import redis

from shared import keys
from tests.conftest import api_client, monitored, wait_until_running
from tests.workers.test_runtime import accepted, runtime
from workers.runtime import WorkerRuntime
from workers.webhooks.output import OutputWebhooks

pytestmark = pytest.mark.anyio
__all__ = ["runtime"]  # the fixture, shared with the runtime's tests


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
