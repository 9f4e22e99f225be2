"""A worker killed with SIGKILL mid-job: its jobs' leases lapse, the reaper hands them back, and
they finish on another worker, each exactly once (real processes, real broker). The visibility
timeout is left long: the lease, not the broker, brings the jobs back, and the broker's copies of
the dead worker's messages are dropped with them (nothing left unacknowledged)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import redis

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
