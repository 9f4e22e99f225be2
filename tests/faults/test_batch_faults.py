"""A batch through faults, with real processes: a worker killed with SIGKILL while it runs the
batch's lines, then the API process (the feeder's home) killed with SIGKILL and started again;
and Redis (AOF on) restarted mid-batch. The batch completes and every custom_id is in the output
exactly once: the feeder's progress is in Redis (cursor, window, committed parts), submissions are
idempotent per line, and the reaper hands the dead worker's jobs back."""

from __future__ import annotations

import signal
import time
from collections.abc import Callable
from pathlib import Path

import openai
import pytest
import redis

from cli.redis_server import EmbeddedRedis
from shared.config import Settings
from tests.api.routes.test_batches import CHAT, chat_line, completed, results, upload, wait_for
from tests.api.routes.test_openai import client_for
from tests.conftest import ApiProcess, WorkerProcess, wait_until_acked

pytestmark = [pytest.mark.slow, pytest.mark.anyio]

LINES = 300


def wait_completed(client: openai.OpenAI, batch_id: str, at_least: int) -> None:
    deadline = time.monotonic() + 60
    while completed(client, batch_id) < at_least:
        assert time.monotonic() < deadline
        time.sleep(0.05)


async def test_a_batch_survives_a_killed_worker_and_a_killed_api(
    make_settings: Callable[..., Settings],
    redis_client: redis.Redis,
    start_worker: Callable[..., WorkerProcess],
    start_api: Callable[[Settings], ApiProcess],
) -> None:
    settings = make_settings(placeholder_step_s=0.01, batch_window=16, visibility_timeout_s=900)
    doomed = start_worker(settings, "--concurrency=8")
    api = start_api(settings)
    client = client_for(api.url)
    content = b"".join(chat_line(f"req-{i}", f"line {i}", max_tokens=8, temperature=0) for i in range(LINES))
    batch = client.batches.create(
        input_file_id=upload(client, content), endpoint=CHAT, completion_window="24h"
    )
    wait_completed(client, batch.id, 40)
    doomed.kill()  # SIGKILL with lines running on it
    start_worker(settings, "--concurrency=8")
    wait_completed(client, batch.id, 120)
    api.process.send_signal(signal.SIGKILL)  # the feeder dies mid-batch, holding its lock
    api.process.wait(10)
    client = client_for(start_api(settings).url)
    done = wait_for(client, batch.id, {"completed", "failed", "expired"}, timeout_s=120)
    assert done.status == "completed", done
    assert done.request_counts.total == LINES and done.request_counts.completed == LINES
    output = results(client, done.output_file_id)  # asserts each custom_id appears once
    assert set(output) == {f"req-{i}" for i in range(LINES)}
    assert done.error_file_id is None
    await wait_until_acked(redis_client)


async def test_a_batch_survives_a_redis_restart(
    make_settings: Callable[..., Settings],
    start_worker: Callable[..., WorkerProcess],
    start_api: Callable[[Settings], ApiProcess],
    tmp_path: Path,
) -> None:
    """Redis (append-only file on, as the manifests run it) restarts mid-batch: the feeder, the
    workers and the API reconnect, and the batch completes with every custom_id once."""
    server = EmbeddedRedis(tmp_path / "aof", appendonly=True)
    server.start()
    try:
        settings = make_settings(redis_url=server.url, placeholder_step_s=0.01, batch_window=16)
        start_worker(settings, "--concurrency=8")
        # As a client would, it retries the 503s the API answers while Redis is down.
        api_url = start_api(settings).url
        client = openai.OpenAI(base_url=f"{api_url}/v1", api_key="unused", max_retries=10, timeout=60)
        content = b"".join(
            chat_line(f"req-{i}", f"line {i}", max_tokens=8, temperature=0) for i in range(LINES)
        )
        batch = client.batches.create(
            input_file_id=upload(client, content), endpoint=CHAT, completion_window="24h"
        )
        wait_completed(client, batch.id, 60)
        server.restart(down_s=1.0)
        done = wait_for(client, batch.id, {"completed", "failed", "expired"}, timeout_s=180)
        assert done.status == "completed", done
        assert done.request_counts.total == LINES and done.request_counts.completed == LINES
        output = results(client, done.output_file_id)  # asserts each custom_id appears once
        assert set(output) == {f"req-{i}" for i in range(LINES)}
    finally:
        server.stop()
