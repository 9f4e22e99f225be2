"""A worker killed with SIGKILL mid-job: its jobs' leases lapse, the reaper hands them back, and
they finish on another worker, each exactly once (real processes, real broker). The visibility
timeout is left long: the lease, not the broker, brings the jobs back, and the broker's copies of
the dead worker's messages are dropped with them (nothing left unacknowledged)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import redis

from shared import keys
from shared.config import Settings
from tests.conftest import WorkerProcess, api_client, wait_until_acked, wait_until_running

pytestmark = [pytest.mark.anyio, pytest.mark.slow]


async def test_sigkill_mid_batch_loses_nothing(
    make_settings: Callable[..., Settings],
    redis_client: redis.Redis,
    start_worker: Callable[..., WorkerProcess],
) -> None:
    settings = make_settings(placeholder_step_s=0.05, visibility_timeout_s=900, job_timeout_s=5)
    doomed = start_worker(settings, "--concurrency=4")
    async with api_client(settings) as api:
        ids = [
            (await api.post("/v1/jobs", json={"prompt": f"job {i}", "max_tokens": 30})).json()["id"]
            for i in range(4)
        ]
        await wait_until_running(redis_client, ids)
        doomed.kill()
        assert {redis_client.hget(f"genq:job:{i}", "status") for i in ids} == {"running"}
        start_worker(settings, "--concurrency=4")
        finished = [(await api.get(f"/v1/jobs/{i}", params={"wait": 30})).json() for i in ids]
    assert [job["status"] for job in finished] == ["succeeded"] * 4
    assert all(job["output"]["usage"]["completion_tokens"] == 30 for job in finished)
    # Each was started twice (once per worker) and completed once.
    assert [redis_client.hget(f"genq:job:{i}", "attempts") for i in ids] == ["2"] * 4
    await wait_until_acked(redis_client)


async def test_sigkill_of_a_worker_running_a_job_it_took_from_the_queue_loses_nothing(
    make_settings: Callable[..., Settings],
    redis_client: redis.Redis,
    start_worker: Callable[..., WorkerProcess],
) -> None:
    """A task thread whose job ended takes the next one straight from the queue (no delivery of
    its own, so the broker holds no copy of it): the job's lease alone brings it back."""
    settings = make_settings(placeholder_step_s=0.05, visibility_timeout_s=900, job_timeout_s=5)
    doomed = start_worker(settings, "--concurrency=1")
    async with api_client(settings) as api:

        async def submitted(prompt: str) -> str:
            return str((await api.post("/v1/jobs", json={"prompt": prompt, "max_tokens": 30})).json()["id"])

        delivered = await submitted("first")
        await wait_until_running(redis_client, [delivered])
        delivery = redis_client.hget(keys.job(delivered), "delivery_tag")
        taken, queued = [await submitted(prompt) for prompt in ("second", "third")]
        await wait_until_running(redis_client, [taken])  # the one thread took it when `first` ended
        first = (await api.get(f"/v1/jobs/{delivered}")).json()
        assert first["status"] == "succeeded"
        # Taken, not delivered: the broker holds no record of it, and `first`'s message (whose task
        # goes on taking) was forgotten when `first` ended.
        assert delivery and redis_client.hkeys(keys.KOMBU_UNACKED) == []
        assert redis_client.hget(keys.job(queued), "status") == "queued"
        doomed.kill()
        start_worker(settings, "--concurrency=1")
        finished = [(await api.get(f"/v1/jobs/{i}", params={"wait": 30})).json() for i in (taken, queued)]
    assert [job["status"] for job in finished] == ["succeeded"] * 2
    assert all(job["output"]["usage"]["completion_tokens"] == 30 for job in finished)
    assert [redis_client.hget(keys.job(i), "attempts") for i in (delivered, taken, queued)] == ["1", "2", "1"]
    await wait_until_acked(redis_client)  # nothing of the dead worker's left to be delivered again


@pytest.mark.parametrize("wait_s", [5.0, 0.0])
async def test_a_thread_whose_job_ended_waits_for_the_next_job_itself(
    make_settings: Callable[..., Settings],
    redis_client: redis.Redis,
    start_worker: Callable[..., WorkerProcess],
    wait_s: float,
) -> None:
    """A job submitted while the worker's one thread waits on the empty queue (worker_take_wait_s)
    runs with no delivery of its own; with no wait it is delivered by Celery, as every job was."""
    settings = make_settings(placeholder_step_s=0.05, worker_take_wait_s=wait_s)
    start_worker(settings, "--concurrency=1")
    async with api_client(settings) as api:
        warm = (await api.post("/v1/jobs", json={"prompt": "warm", "max_tokens": 2})).json()["id"]
        assert (await api.get(f"/v1/jobs/{warm}", params={"wait": 30})).json()["status"] == "succeeded"
        # The thread that ran it now waits on the queue itself (or, with no wait, went back to Celery).
        job_id = (await api.post("/v1/jobs", json={"prompt": "next", "max_tokens": 30})).json()["id"]
        await wait_until_running(redis_client, [job_id])
        tag = redis_client.hget(keys.job(job_id), "delivery_tag")
        delivered = tag in redis_client.hkeys(keys.KOMBU_UNACKED)  # kombu's record of a delivery
        assert (await api.get(f"/v1/jobs/{job_id}", params={"wait": 30})).json()["status"] == "succeeded"
    assert delivered is (wait_s == 0)
