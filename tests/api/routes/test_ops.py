"""Probes, and what the API does while Redis is down: 503 at once, then recovery by itself."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from cli.redis_server import EmbeddedRedis
from shared.config import Settings
from tests.conftest import WorkerProcess, api_client

pytestmark = pytest.mark.anyio


async def test_healthz_and_openapi(api: httpx.AsyncClient) -> None:
    assert (await api.get("/healthz")).json() == {"status": "ok"}
    schema = (await api.get("/openapi.json")).json()
    assert {"/v1/jobs", "/v1/jobs/{job_id}", "/v1/jobs/{job_id}/cancel"} <= set(schema["paths"])


async def test_readyz_needs_a_live_worker(api: httpx.AsyncClient, worker: WorkerProcess) -> None:
    ready = await api.get("/readyz")
    assert ready.status_code == 200 and ready.json()["workers"] == 1
    worker.kill()
    await asyncio.sleep(3.5)  # the heartbeat TTL of the test settings
    gone = await api.get("/readyz")
    assert gone.status_code == 503
    assert "no worker" in gone.json()["reason"]


async def test_redis_down_is_a_fast_503_and_the_api_recovers(
    make_settings: Callable[..., Settings], tmp_path: Path
) -> None:
    server = EmbeddedRedis(tmp_path / "flaky", appendonly=True)
    server.start()
    settings = make_settings(redis_url=server.url)
    try:
        async with api_client(settings) as api:
            assert (await api.post("/v1/jobs", json={"prompt": "before"})).status_code == 202
            server.stop()
            started = time.monotonic()
            down = await api.post("/v1/jobs", json={"prompt": "during"})
            assert time.monotonic() - started < 2.0
            assert down.status_code == 503
            assert down.json()["error"]["type"] == "unavailable"
            assert (await api.get("/v1/jobs")).status_code == 503
            ready = await api.get("/readyz")
            # What failed, never the client library's text (hosts, ports, credentials).
            assert ready.status_code == 503 and ready.json()["reason"] == "Redis unreachable"
            server.start()
            after = await api.post("/v1/jobs", json={"prompt": "after"})
            assert after.status_code == 202
            listed = (await api.get("/v1/jobs")).json()["data"]
            assert [j["preview"] for j in listed] == ["after", "before"]
    finally:
        server.stop()
