"""A webhook retry delay longer than half the visibility timeout is waited in hops: no delivery
message sits unacknowledged long enough for the broker to hand it out again, and the attempt
still happens once, when due (real workers, real broker, a real receiver)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path
from typing import cast

import pytest
import redis

from cli.redis_server import EmbeddedRedis
from tests.conftest import WorkerProcess, api_client
from tests.workers.webhooks.test_tasks import Receiver, hook_settings

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

VISIBILITY_S = 6
DELAY_S = 8.0  # > the visibility timeout: one eta'd message would be handed out twice


async def test_a_long_retry_delay_is_waited_in_hops(
    redis_server: EmbeddedRedis, redis_client: redis.Redis, tmp_path: Path
) -> None:
    settings = hook_settings(redis_server.url, tmp_path / "genq", visibility_timeout_s=VISIBILITY_S,
                             job_timeout_s=5, webhook_retry_delays_s=[str(DELAY_S)])  # fmt: skip
    receiver = Receiver({"job.completed": [500]})
    workers = [WorkerProcess(settings, tmp_path / "model.log"),
               WorkerProcess(settings, tmp_path / "hooks.log", "--queues=webhooks")]  # fmt: skip
    try:
        for worker in workers:
            worker.wait_ready()
        async with api_client(settings) as api:
            body = {"prompt": "hop", "max_tokens": 2, "webhook": receiver.url, "cache": False,
                    "webhook_events_filter": ["completed"]}  # fmt: skip
            job_id = (await api.post("/v1/jobs", json=body)).json()["id"]
            oldest = await _watch_unacked_until(redis_client, lambda: len(receiver.received) >= 2, 40)
            log = (await api.get(f"/v1/jobs/{job_id}/webhooks")).json()["data"]
    finally:
        for worker in workers:
            worker.close()
        receiver.close()
    assert oldest < VISIBILITY_S / 2 + 1.5, f"a message waited {oldest:.1f} s unacknowledged"
    assert [entry["outcome"] for entry in log] == ["retrying", "delivered"]
    assert len(receiver.received) == 2  # one failed attempt, one retry: the hops sent nothing
    assert receiver.received[1].at - receiver.received[0].at >= DELAY_S - 0.5


async def _watch_unacked_until(client: redis.Redis, done: Callable[[], object], timeout_s: float) -> float:
    """The longest any message sat in kombu's unacked index while waiting for `done`."""
    oldest = 0.0
    deadline = time.monotonic() + timeout_s
    while not done():
        assert time.monotonic() < deadline, "the retry never came"
        now = time.time()
        for _, since in cast(list[tuple[str, float]], client.zrange("unacked_index", 0, -1, withscores=True)):
            oldest = max(oldest, now - since)
        await asyncio.sleep(0.1)
    return oldest
