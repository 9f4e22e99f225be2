"""Webhook deliveries through a full Redis and a Redis restart: every job's `job.completed` is
delivered (2xx) under one webhook-id, none is lost. The chaos soak found deliveries that ended
`pending` with no message left: tasks that failed on a refused Redis were acknowledged, and a
message in flight when Redis went away was gone (the reaper now pushes such a message again:
shared/jobqueue/lua/reap_delivery.lua). Real Redis with AOF, real model and webhook workers, a real receiver
that fails first attempts so that retries are in flight when the fault hits."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import redis

from cli.redis_server import EmbeddedRedis
from shared.jobqueue import scripts
from tests.conftest import WorkerProcess, api_client
from tests.workers.webhooks.test_tasks import Receiver, hook_settings, submit_completed_hook, until

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

JOBS = 12


@pytest.mark.parametrize("fault", ["squeeze", "restart"])
async def test_no_completion_webhook_is_lost(tmp_path: Path, fault: str) -> None:
    server = EmbeddedRedis(tmp_path / "aof", appendonly=True)
    server.start()
    client = redis.Redis.from_url(server.url)
    delays = ["0.5", "1", "2", "4", "8"]
    settings = hook_settings(server.url, tmp_path / "genq", webhook_retry_delays_s=delays,
                             lease_ttl_s=3.0, reaper_interval_s=0.5)  # fmt: skip
    receiver = Receiver({"job.completed": [500] * (JOBS // 2)})
    workers = [WorkerProcess(settings, tmp_path / "model.log", "--concurrency=4"),
               WorkerProcess(settings, tmp_path / "hooks.log", "--queues=webhooks")]  # fmt: skip
    try:
        for worker in workers:
            worker.wait_ready()
        async with api_client(settings) as api:
            ids = [await submit_completed_hook(api, receiver) for _ in range(JOBS)]
            await until(lambda: len(receiver.received) >= JOBS // 2, 60, "first attempts")
            if fault == "restart":
                server.restart(down_s=1.0)
            else:
                client.config_set("maxmemory-policy", "noeviction")
                client.config_set("maxmemory", int(client.info("memory")["used_memory"]) + 32 * 1024)
                await asyncio.sleep(3)
                client.config_set("maxmemory", 0)
            # A message lost in flight is pushed again after the reaper's two orphan checks.
            recovery_s = scripts.ORPHAN_CHECK_S + scripts.ORPHAN_RECHECK_S
            await until(lambda: _delivered(receiver) >= set(ids), 90 + recovery_s, "every completion")
        for worker in workers:
            assert worker.process.poll() is None, worker.log_path.read_text()[-3000:]
    finally:
        for worker in workers:
            worker.close()
        receiver.close()
        client.close()
        server.stop()
    ok = [r for r, status in zip(receiver.received, receiver.statuses, strict=True) if status < 300]
    ids_by_job: dict[str, set[str]] = {}
    for received in ok:
        ids_by_job.setdefault(received.payload["data"]["id"], set()).add(received.headers["webhook-id"])
    assert all(len(webhook_ids) == 1 for webhook_ids in ids_by_job.values()), ids_by_job


def _delivered(receiver: Receiver) -> set[str]:
    return {
        r.payload["data"]["id"] for r, s in zip(receiver.received, receiver.statuses, strict=False) if s < 300
    }
