"""Admission control: a full queue sheds new jobs with 503 + Retry-After, or routes those that
allow it to the fallback model's queue, where the fallback's workers run them."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest
import redis
from prometheus_client import REGISTRY

from shared.config import Settings
from tests.conftest import WorkerProcess, api_client

pytestmark = pytest.mark.anyio


async def test_full_queue_sheds_with_503_and_changes_nothing(
    make_settings: Callable[..., Settings], redis_client: redis.Redis
) -> None:
    settings = make_settings(max_queue_length=3)
    # The counter is the process's: earlier tests in the suite may have shed too.
    shed_before = REGISTRY.get_sample_value("genq_shed_total", {"reason": "queue_full"}) or 0.0
    async with api_client(settings) as api:
        for _ in range(3):
            assert (await api.post("/v1/jobs", json={"prompt": "x"})).status_code == 202
        await asyncio.sleep(1.05)  # queue statistics are cached for a second
        shed = await api.post("/v1/jobs", json={"prompt": "x"})
        assert shed.status_code == 503
        assert shed.json()["error"]["type"] == "overloaded"
        assert shed.headers["retry-after"] == "5"
        assert "allow_fallback" in shed.json()["error"]["message"]
        assert len(redis_client.keys("genq:job:*")) == 3
        metrics = (await api.get("/metrics")).text
        assert f'genq_shed_total{{reason="queue_full"}} {shed_before + 1}' in metrics


async def test_fallback_routes_to_the_smaller_models_queue(
    make_settings: Callable[..., Settings],
    redis_client: redis.Redis,
    start_worker: Callable[..., WorkerProcess],
) -> None:
    settings = make_settings(max_queue_length=2, fallback_model="random-tiny")
    async with api_client(settings) as api:
        for _ in range(2):
            await api.post("/v1/jobs", json={"prompt": "x"})
        await asyncio.sleep(1.05)
        routed = await api.post("/v1/jobs", json={"prompt": "hello", "max_tokens": 4, "allow_fallback": True})
        assert routed.status_code == 202
        job = routed.json()
        assert job["model"] == "random-tiny"
        assert redis_client.llen("genq.random-tiny") == 1
        start_worker(make_settings(model="random-tiny", max_queue_length=2, fallback_model="random-tiny"))
        done = (await api.get(f"/v1/jobs/{job['id']}", params={"wait": 60})).json()
        assert done["status"] == "succeeded"
        assert done["model"] == "random-tiny" and "random weights" in done["model_label"]
        refused = await api.post("/v1/jobs", json={"prompt": "x"})  # no allow_fallback: shed
        assert refused.status_code == 503
