"""Redis at maxmemory with `noeviction` (what the shipped manifests set): submissions get 503 in
the JSON error shape with Retry-After, never a bare 500; reads keep working; the worker stays
up and every job accepted before finishes once memory is back (real Redis, real worker)."""

from __future__ import annotations

import asyncio
import shutil
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
import redis

from cli import redis_server
from cli.redis_server import EmbeddedRedis
from shared.config import Settings
from tests.conftest import WorkerProcess, api_client, wait_until_acked, wait_until_running

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

PROMPT = "x " * 1000  # ~2 KB per job, as the reproduction


async def test_a_full_redis_answers_503_and_loses_nothing(
    make_settings: Callable[..., Settings], start_worker: Callable[..., WorkerProcess], tmp_path: Path
) -> None:
    server = EmbeddedRedis(tmp_path / "full", appendonly=False)
    server.start()
    client = redis.Redis.from_url(server.url, decode_responses=True)
    settings = make_settings(redis_url=server.url, placeholder_step_s=0.05)
    try:
        worker = start_worker(settings, "--concurrency=4")
        async with api_client(settings) as api:
            first = (await api.post("/v1/jobs", json={"prompt": "before", "max_tokens": 2})).json()["id"]
            used = int(client.info("memory")["used_memory"])
            client.config_set("maxmemory-policy", "noeviction")
            client.config_set("maxmemory", used + 400_000)
            accepted, refusals = await _submit_until_refused(api)
            assert accepted, "nothing fit before the store filled"
            for response in refusals:
                assert response.status_code == 503, response.text
                assert response.json()["error"]["type"] == "unavailable", response.text
                assert int(response.headers["retry-after"]) >= 1
            # Reads keep working while writes are refused.
            read = await api.get(f"/v1/jobs/{first}")
            assert read.status_code == 200 and read.json()["id"] == first
            await asyncio.sleep(3)  # the worker meets the full store too
            assert worker.process.poll() is None, worker.log_path.read_text()[-3000:]
            client.config_set("maxmemory", 0)
            finished = [(await api.get(f"/v1/jobs/{i}", params={"wait": 60})).json() for i in accepted]
        assert [job["status"] for job in finished] == ["succeeded"] * len(accepted)
        assert worker.process.poll() is None
    finally:
        client.close()
        server.stop()


async def _submit_until_refused(api: httpx.AsyncClient) -> tuple[list[str], list[httpx.Response]]:
    accepted: list[str] = []
    refusals: list[httpx.Response] = []
    deadline = time.monotonic() + 60
    while len(refusals) < 5 and time.monotonic() < deadline:
        response = await api.post("/v1/jobs", json={"prompt": PROMPT, "max_tokens": 40, "cache": False})
        if response.status_code == 202:
            accepted.append(response.json()["id"])
        else:
            refusals.append(response)
    return accepted, refusals


@pytest.mark.parametrize("queues", [(), ("--queues=webhooks",)])
async def test_a_worker_that_reconnects_to_a_full_redis_stays_up(
    make_settings: Callable[..., Settings],
    start_worker: Callable[..., WorkerProcess],
    tmp_path: Path,
    queues: tuple[str, ...],
) -> None:
    """A consumer that reconnects declares its queues again (kombu writes its binding set): with
    the store full, that write is refused, and stock kombu's error stopped the worker for good
    (the chaos soak saw its webhook worker exit so). Here it waits for memory, then works on."""
    server = EmbeddedRedis(tmp_path / "full", appendonly=False)
    server.start()
    client = redis.Redis.from_url(server.url, decode_responses=True)
    settings = make_settings(redis_url=server.url, placeholder_step_s=0.01)
    try:
        worker = start_worker(settings, *queues)
        client.config_set("maxmemory-policy", "noeviction")
        # Far below what the store holds: the buffers the killed connections free cannot bring it
        # back under the limit (a limit just above its usage did, now and then, on a slow machine).
        client.config_set("maxmemory", 1)
        client.client_kill_filter(_type="normal", skipme=True)  # every worker connection: it reconnects
        deadline = time.monotonic() + 30
        while "broker_bind_refused" not in worker.log_path.read_text() and time.monotonic() < deadline:
            assert worker.process.poll() is None, worker.log_path.read_text()[-3000:]
            await asyncio.sleep(0.2)
        assert "broker_bind_refused" in worker.log_path.read_text()
        await asyncio.sleep(2)  # still refused a while later: it waits, it does not exit
        assert worker.process.poll() is None, worker.log_path.read_text()[-3000:]
        client.config_set("maxmemory", 0)
        if not queues:  # the model worker still takes jobs
            async with api_client(settings) as api:
                job = (await api.post("/v1/jobs", json={"prompt": "after", "max_tokens": 2})).json()
                done = (await api.get(f"/v1/jobs/{job['id']}", params={"wait": 30})).json()
            assert done["status"] == "succeeded"
        assert worker.process.poll() is None
    finally:
        client.close()
        server.stop()


#: Redis (not valkey, which queues a MULTI's commands that need no memory even when full): a
#: full Redis refuses kombu's acknowledgement, a MULTI of ZREM and HDEL.
REDIS_SERVER = shutil.which("redis-server")


@pytest.mark.skipif(REDIS_SERVER is None, reason="needs Redis's redis-server on PATH")
async def test_a_refused_acknowledgement_waits_for_memory(
    make_settings: Callable[..., Settings],
    start_worker: Callable[..., WorkerProcess],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A job ends while Redis is full: its end is written (finish.lua deletes before it writes),
    but kombu acknowledges its message with a MULTI, which a full Redis refuses; Celery took
    that as unrecoverable and the worker exited. Here the worker stays up, acknowledges once
    memory is back, and runs the next job."""
    monkeypatch.setattr(redis_server, "server_binary", lambda: REDIS_SERVER)
    server = EmbeddedRedis(tmp_path / "full", appendonly=False)
    server.start()
    client = redis.Redis.from_url(server.url, decode_responses=True)
    settings = make_settings(redis_url=server.url, placeholder_step_s=0.05)
    try:
        worker = start_worker(settings)
        async with api_client(settings) as api:
            job_id = (await api.post("/v1/jobs", json={"prompt": "full", "max_tokens": 30})).json()["id"]
            await wait_until_running(client, [job_id])
            client.config_set("maxmemory-policy", "noeviction")
            client.config_set("maxmemory", 1)  # far below its usage: every write is refused from now on
            deadline = time.monotonic() + 30
            while "broker_ack_refused" not in worker.log_path.read_text():
                assert worker.process.poll() is None, worker.log_path.read_text()[-3000:]
                assert time.monotonic() < deadline, worker.log_path.read_text()[-3000:]
                await asyncio.sleep(0.2)
            assert client.hget(f"genq:job:{job_id}", "status") == "succeeded"
            await asyncio.sleep(2)  # still refused a while later: it waits, it does not exit
            assert worker.process.poll() is None, worker.log_path.read_text()[-3000:]
            client.config_set("maxmemory", 0)
            await wait_until_acked(client)
            after = (await api.post("/v1/jobs", json={"prompt": "after", "max_tokens": 2})).json()["id"]
            done = (await api.get(f"/v1/jobs/{after}", params={"wait": 30})).json()
        assert done["status"] == "succeeded", done
        assert client.hmget(f"genq:job:{job_id}", "status", "attempts") == ["succeeded", "1"]
        ended = [line for line in worker.log_path.read_text().splitlines() if '"job_succeeded"' in line]
        assert sum(job_id in line for line in ended) == 1  # ended once, never run again
        assert worker.process.poll() is None, worker.log_path.read_text()[-3000:]
    finally:
        client.close()
        server.stop()
