"""Flower, run by `genq flower` against the suite's broker, sees the real worker and the tasks it
ran (through Flower's own HTTP API, with basic auth), and refuses to run unauthenticated off
loopback."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import httpx
import pytest
import redis

from cli.redis_server import free_port
from shared.config import Settings
from tests.conftest import ROOT, WorkerProcess, api_client, settings_env

pytestmark = pytest.mark.anyio

T = TypeVar("T")


def _wait_for(check: Callable[[], T], timeout_s: float = 40.0) -> T:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            result = check()
            if result:
                return result
        except httpx.TransportError:
            pass
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.25)


async def test_flower_lists_the_worker_and_a_finished_task(
    make_settings: Callable[..., Settings],
    redis_client: redis.Redis,
    start_worker: Callable[..., WorkerProcess],
    tmp_path: Path,
) -> None:
    settings = make_settings(flower_basic_auth="ops:s3cret", worker_task_events=True)
    port = free_port()
    log = (tmp_path / "flower.log").open("w")
    flower = subprocess.Popen(
        [sys.executable, "-m", "cli.main", "flower", "--port", str(port)],
        env=settings_env(settings), cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        base = f"http://127.0.0.1:{port}"
        assert _wait_for(lambda: httpx.get(f"{base}/healthcheck").status_code == 200)
        assert httpx.get(f"{base}/api/workers").status_code == 401
        auth = ("ops", "s3cret")
        start_worker(settings)
        workers = _wait_for(
            lambda: httpx.get(f"{base}/api/workers", auth=auth, params={"refresh": "1"}).json()
        )
        assert any(name.startswith("celery@genq-") for name in workers)
        async with api_client(settings) as api:
            job = (await api.post("/v1/jobs", json={"prompt": "for flower", "max_tokens": 2},
                                  headers={"Prefer": "wait=30"})).json()  # fmt: skip
        assert job["status"] == "succeeded"

        def ended() -> dict[str, str]:
            task: dict[str, str] = httpx.get(f"{base}/api/tasks", auth=auth).json().get(job["id"]) or {}
            # The task ends once its thread found no next job (GENQ_WORKER_TAKE_WAIT_S after the job).
            return task if task.get("state") != "STARTED" else {}

        tasks = _wait_for(ended)
        assert tasks["state"] == "SUCCESS" and tasks["name"] == "genq.generate"
        assert "flower_events_total" in httpx.get(f"{base}/metrics", auth=auth).text
    finally:
        flower.terminate()
        flower.wait(10)
        log.close()


def test_flower_refuses_to_run_without_auth_off_loopback(make_settings: Callable[..., Settings]) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "cli.main", "flower", "--address", "0.0.0.0"],
        env=settings_env(make_settings()), cwd=ROOT, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert result.returncode == 2
    assert "without GENQ_FLOWER_BASIC_AUTH" in result.stderr
