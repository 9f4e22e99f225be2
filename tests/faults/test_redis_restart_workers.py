"""A Redis restart while a webhook worker holds deliveries waiting for their retry (unacknowledged
messages it tries to restore as it loses the connection): kombu's close used to fail there with
an AttributeError that Celery takes as unrecoverable, and the worker stopped consuming for good.
Now every worker reconnects and keeps working, and the held retries are not lost: they stay in
the broker's unacknowledged hash until the visibility timeout hands them out again (real Redis
with AOF, real workers, a real receiver)."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest
import redis

from cli.redis_server import EmbeddedRedis
from tests.conftest import WorkerProcess, api_client
from tests.workers.webhooks.test_tasks import Receiver, hook_settings, submit_completed_hook, until

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

HELD = 6


async def test_workers_holding_messages_survive_a_redis_restart(tmp_path: Path) -> None:
    server = EmbeddedRedis(tmp_path / "aof", appendonly=True)
    server.start()
    settings = hook_settings(server.url, tmp_path / "genq", webhook_retry_delays_s=["600"],
                             lease_ttl_s=3.0, reaper_interval_s=0.5)  # fmt: skip
    receiver = Receiver({"job.completed": [500] * HELD})
    workers = [WorkerProcess(settings, tmp_path / "model.log", "--concurrency=4"),
               WorkerProcess(settings, tmp_path / "hooks.log", "--queues=webhooks")]  # fmt: skip
    try:
        for worker in workers:
            worker.wait_ready()
        async with api_client(settings) as api:
            held = [
                await submit_completed_hook(api, receiver) for _ in range(HELD)
            ]  # each first attempt fails
            await until(lambda: len(receiver.received) >= HELD, 60, "first attempts")
            server.restart(down_s=1.0)
            after = await submit_completed_hook(api, receiver)  # a delivery after the restart arrives
            await until(
                lambda: any(r.payload["data"]["id"] == after for r in receiver.received), 60, "delivery"
            )
        for worker in workers:
            assert worker.process.poll() is None, worker.log_path.read_text()[-3000:]
            assert "Unrecoverable error" not in worker.log_path.read_text()
        # None lost: each is in the list or the unacked hash (looked at again briefly, since a
        # message a worker is taking sits in neither for an instant).
        broker = redis.Redis.from_url(server.url)
        await until(lambda: _waiting_deliveries(broker) >= set(held), 10, "every held retry")
    finally:
        for worker in workers:
            worker.close()
        receiver.close()
        server.stop()


def _waiting_deliveries(client: redis.Redis) -> set[str]:
    """Job ids of the delivery messages the broker still has: held unacknowledged by a worker, or
    back in the webhooks list."""
    raw = [json.loads(value)[0] for value in client.hvals("unacked")]
    raw += [json.loads(value) for value in client.lrange("webhooks", 0, -1)]
    return {json.loads(base64.b64decode(message["body"]))[0][0] for message in raw}
