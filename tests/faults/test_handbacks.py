"""Jobs a worker cannot finish go back to the queue through the job store, and are finished by
another worker, each exactly once (real worker processes, real broker)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path
from typing import cast

import pytest
import redis

from shared import keys
from shared.celery_app import queue_lists
from shared.config import Settings
from tests.conftest import TEST_MODEL, WorkerProcess, api_client, wait_until_acked, wait_until_running
from workers.runtime import FATAL_EXIT

pytestmark = [pytest.mark.anyio, pytest.mark.slow]


async def test_engine_death_hands_every_job_back_and_fails_none(
    make_settings: Callable[..., Settings],
    redis_client: redis.Redis,
    start_worker: Callable[..., WorkerProcess],
    tmp_path: Path,
) -> None:
    """The engine's step fails fatally (the test-only fault file): the worker hands its jobs back
    before it exits, so none is recorded `failed`; the next worker finishes them."""
    fault = tmp_path / "engine-fault"
    doomed = start_worker(make_settings(placeholder_step_s=0.05, fault_engine_fatal_file=fault),
                          "--concurrency=3")  # fmt: skip
    async with api_client(make_settings()) as api:
        ids = [
            (await api.post("/v1/jobs", json={"prompt": f"job {i}", "max_tokens": 40})).json()["id"]
            for i in range(3)
        ]
        await wait_until_running(redis_client, ids)
        fault.touch()
        assert await asyncio.to_thread(doomed.process.wait, 30) == FATAL_EXIT
        assert {redis_client.hget(f"genq:job:{i}", "status") for i in ids} == {"queued"}
        start_worker(make_settings(placeholder_step_s=0.01), "--concurrency=3")
        finished = [(await api.get(f"/v1/jobs/{i}", params={"wait": 30})).json() for i in ids]
    assert [job["status"] for job in finished] == ["succeeded"] * 3
    assert [redis_client.hget(f"genq:job:{i}", "attempts") for i in ids] == ["2"] * 3
    await wait_until_acked(redis_client)


async def test_a_job_handed_back_late_in_its_window_still_runs(
    make_settings: Callable[..., Settings],
    redis_client: redis.Redis,
    start_worker: Callable[..., WorkerProcess],
) -> None:
    """Drained near its queue deadline, a job gets a fresh one: the next worker runs it instead
    of failing it as 'timeout before it ran'. The API gives jobs 5 s in the queue; the workers
    (whose hand-back sets the fresh deadline) 60 s, so a slow start of the second one on a busy
    machine cannot expire the job a second time."""
    worker = start_worker(make_settings(placeholder_step_s=0.2, drain_timeout_s=3, job_timeout_s=60))
    async with api_client(make_settings(job_timeout_s=5)) as api:
        job_id = (await api.post("/v1/jobs", json={"prompt": "late", "max_tokens": 40})).json()["id"]
        submitted = time.monotonic()
        await wait_until_running(redis_client, [job_id])
        await asyncio.to_thread(worker.terminate)
        assert redis_client.hget(f"genq:job:{job_id}", "status") == "queued"
        await asyncio.sleep(max(0.0, 5.5 - (time.monotonic() - submitted)))  # past the first deadline
        start_worker(make_settings(placeholder_step_s=0.01, job_timeout_s=60))
        job = (await api.get(f"/v1/jobs/{job_id}", params={"wait": 30})).json()
    assert job["status"] == "succeeded", job
    assert redis_client.hget(f"genq:job:{job_id}", "attempts") == "1"  # a drain is not an attempt


async def test_a_job_dropped_by_a_live_worker_is_rescued_by_its_lease(
    make_settings: Callable[..., Settings],
    redis_client: redis.Redis,
    start_worker: Callable[..., WorkerProcess],
) -> None:
    """A worker that keeps heart-beating but no longer runs a job (here: its record says running
    on that worker, and the worker never received it) does not hold it for the record's TTL: the
    lease lapses and the reaper hands it back."""
    settings = make_settings(placeholder_step_s=0.01)
    worker = start_worker(settings)
    async with api_client(settings) as api:
        job_id = (await api.post("/v1/jobs", json={"prompt": "dropped", "max_tokens": 3})).json()["id"]
        (await api.get(f"/v1/jobs/{job_id}", params={"wait": 30})).json()
        live_worker = redis_client.hget(f"genq:job:{job_id}", "worker")
        # Roll the finished job back to "running on a live worker that holds nothing".
        redis_client.hset(f"genq:job:{job_id}", mapping={"status": "running", "lease": time.time() + 1})
        redis_client.zadd("genq:leases", {job_id: time.time() + 1})
        owner = cast(str, redis_client.hget(f"genq:job:{job_id}", "owner"))
        redis_client.sadd(f"genq:owner:{owner}:live", job_id)
        assert live_worker and worker.process.poll() is None
        deadline = time.monotonic() + 20
        while redis_client.hget(f"genq:job:{job_id}", "status") != "succeeded":
            assert time.monotonic() < deadline, redis_client.hgetall(f"genq:job:{job_id}")
            await asyncio.sleep(0.1)
    assert redis_client.hget(f"genq:job:{job_id}", "attempts") == "2"


async def test_a_dying_worker_takes_nothing_new(
    make_settings: Callable[..., Settings],
    redis_client: redis.Redis,
    start_worker: Callable[..., WorkerProcess],
    tmp_path: Path,
) -> None:
    """A worker whose engine died stops consuming before it hands its jobs back: with a task
    thread free, its consumer used to take the job it had just handed back, and the job then sat
    in the dead worker's unacknowledged messages until the reaper freed it. Here the job waits on
    its queue, and the next worker runs it at once."""
    fault = tmp_path / "engine-fault"
    doomed = start_worker(make_settings(placeholder_step_s=0.05, fault_engine_fatal_file=fault),
                          "--concurrency=2")  # fmt: skip
    async with api_client(make_settings()) as api:
        job_id = (await api.post("/v1/jobs", json={"prompt": "doomed", "max_tokens": 40})).json()["id"]
        await wait_until_running(redis_client, [job_id])
        fault.touch()
        assert await asyncio.to_thread(doomed.process.wait, 30) == FATAL_EXIT
        assert redis_client.hget(f"genq:job:{job_id}", "status") == "queued"
        queue = keys.queue_for_model(TEST_MODEL)
        assert sum(redis_client.llen(name) for name in queue_lists(queue)) == 1  # its message waits
        assert redis_client.hlen(keys.KOMBU_UNACKED) == 0  # and no one holds it
        assert doomed.log_path.read_text().count(f"[{job_id}] received") == 1  # taken once, at first
        healthy = start_worker(make_settings(placeholder_step_s=0.01))
        job = (await api.get(f"/v1/jobs/{job_id}", params={"wait": 30})).json()
    assert job["status"] == "succeeded", job
    assert f":{healthy.process.pid}:" in str(redis_client.hget(f"genq:job:{job_id}", "worker"))
    assert redis_client.hget(f"genq:job:{job_id}", "attempts") == "2"
    await wait_until_acked(redis_client)
