"""The Redis server restarts (append-only persistence on) while jobs are queued and running:
every accepted job still ends in a terminal state, and the API and worker recover by themselves.

With persistence off a restart empties Redis: every queued message, job record and unacknowledged
message is gone (README, "Reliability"). This test is the AOF configuration the stack ships."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from cli.redis_server import EmbeddedRedis
from shared.config import Settings
from tests.conftest import WorkerProcess, api_client

pytestmark = [pytest.mark.anyio, pytest.mark.slow]


async def test_jobs_survive_a_redis_restart_with_aof(
    make_settings: Callable[..., Settings], start_worker: Callable[..., WorkerProcess], tmp_path: Path
) -> None:
    server = EmbeddedRedis(tmp_path / "aof", appendonly=True)
    server.start()
    settings = make_settings(redis_url=server.url, placeholder_step_s=0.02, heartbeat_ttl_s=30)
    try:
        start_worker(settings, "--concurrency=4")
        async with api_client(settings) as api:
            ids = [
                (await api.post("/v1/jobs", json={"prompt": f"r{i}", "max_tokens": 20})).json()["id"]
                for i in range(24)
            ]
            await asyncio.sleep(0.3)  # some run, most wait
            server.restart(down_s=1.0)
            deadline = time.monotonic() + 90
            pending = set(ids)
            while pending and time.monotonic() < deadline:
                for job_id in list(pending):
                    response = await api.get(f"/v1/jobs/{job_id}")
                    if response.status_code == 200 and response.json()["status"] in ("succeeded", "failed"):
                        pending.discard(job_id)
                await asyncio.sleep(0.2)
            assert not pending, f"{len(pending)} accepted jobs never finished"
            statuses = [(await api.get(f"/v1/jobs/{i}")).json()["status"] for i in ids]
        assert statuses == ["succeeded"] * len(ids)
    finally:
        server.stop()
