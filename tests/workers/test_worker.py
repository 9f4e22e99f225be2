"""Several workers on one host, as docs/webhooks.md describes (`genq worker` beside
`genq worker --queues webhooks`), with default settings: both run, the second's taken metrics
port is one warning line and a port of its own, and only the model worker makes the API ready."""

from __future__ import annotations

import json
from collections.abc import Callable

import httpx
import pytest
import redis

from cli.redis_server import free_port
from shared import keys
from shared.config import Settings
from tests.conftest import WorkerProcess, api_client

pytestmark = [pytest.mark.anyio, pytest.mark.slow]


async def test_a_second_worker_on_the_same_metrics_port_runs(
    make_settings: Callable[..., Settings],
    redis_client: redis.Redis,
    start_worker: Callable[..., WorkerProcess],
) -> None:
    port = free_port()
    settings = make_settings(worker_metrics_port=port)
    model_worker = start_worker(settings)
    webhook_worker = start_worker(settings, "--queues", keys.WEBHOOK_QUEUE)
    assert model_worker.process.poll() is None and webhook_worker.process.poll() is None
    log = webhook_worker.log_path.read_text()
    (taken,) = [json.loads(line) for line in log.splitlines() if '"metrics_port_taken"' in line]
    assert taken["port"] > port and f"GENQ_WORKER_METRICS_PORT {port} is taken" in taken["message"]
    assert "Traceback" not in log
    for metrics_port in (port, taken["port"]):
        assert "genq_" in httpx.get(f"http://127.0.0.1:{metrics_port}/metrics").text


async def test_a_webhook_only_worker_does_not_make_the_api_ready(
    make_settings: Callable[..., Settings],
    redis_client: redis.Redis,
    start_worker: Callable[..., WorkerProcess],
) -> None:
    settings = make_settings()
    start_worker(settings, "--queues", keys.WEBHOOK_QUEUE)
    async with api_client(settings) as api:
        not_ready = await api.get("/readyz")
        assert not_ready.status_code == 503, not_ready.text
        start_worker(settings)
        assert (await api.get("/readyz")).json()["workers"] == 1
