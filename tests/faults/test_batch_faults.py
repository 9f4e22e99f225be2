"""A batch through faults, with real processes: a worker killed with SIGKILL while it runs the
batch's lines, then the API process (the feeder's home) killed with SIGKILL and started again;
and Redis (AOF on) restarted mid-batch. The batch completes and every custom_id is in the output
exactly once: the feeder's progress is in Redis (cursor, window, committed parts), submissions are
idempotent per line, and the reaper hands the dead worker's jobs back. And hostile input files
through a live API: an over-long line is refused unread, refused lines are echoed cut short and
copied into no Redis hash, and a key's active batches are bounded."""

from __future__ import annotations

import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import openai
import orjson
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


KEY_A, KEY_B = "batch-key-a", "batch-key-b"
#: GENQ_BATCH_LINE_MAX_BYTES for the hostile-input tests.
LINE_MAX = 64 << 10


def hostile_file(bad_lines: int) -> bytes:
    """One good line (no worker runs it: its batch stays active), one line over LINE_MAX, and
    `bad_lines` lines refused for a 3 KB url each."""
    bad = (
        orjson.dumps({"custom_id": f"bad-{i}", "method": "POST", "url": "/v1/" + "u" * 3000, "body": {}})
        + b"\n"
        for i in range(bad_lines)
    )
    return chat_line("good", "hi") + chat_line("long", "x" * LINE_MAX) + b"".join(bad)


def batch_bytes(redis_client: redis.Redis) -> int:
    """Redis memory held by every batch key (records, windows, anything per line)."""
    return sum(int(redis_client.memory_usage(key) or 0) for key in redis_client.scan_iter("genq:batch:*"))


async def test_refused_lines_are_cut_short_and_kept_out_of_redis(
    make_settings: Callable[..., Settings],
    redis_client: redis.Redis,
    start_api: Callable[[Settings], ApiProcess],
) -> None:
    settings = make_settings(api_keys=[KEY_A], batch_line_max_bytes=LINE_MAX)
    client = client_for(start_api(settings).url, KEY_A)
    file_id = upload(client, hostile_file(bad_lines=300))  # about 1 MB
    created = [client.batches.create(input_file_id=file_id, endpoint=CHAT, completion_window="24h")
               for _ in range(3)]  # fmt: skip
    for batch in created:
        assert wait_for(client, batch.id, {"in_progress"}).request_counts.total == 302
    # Three batches of a 1 MB file of refused lines: Redis holds their records and windows
    # (bounded, messages cut short), not a copy of each refused line.
    assert batch_bytes(redis_client) < 200_000
    client.batches.cancel(created[0].id)
    done = wait_for(client, created[0].id, {"cancelled"})
    errors = [orjson.loads(line) for line in client.files.content(done.error_file_id).content.splitlines()]
    by_id: dict[Any, dict[str, Any]] = {line["custom_id"]: line["error"] for line in errors}
    assert len(errors) == 302 and by_id["good"]["code"] == "batch_cancelled"
    assert by_id[None]["code"] == "line_too_long" and "GENQ_BATCH_LINE_MAX_BYTES" in by_id[None]["message"]
    assert by_id["bad-7"]["code"] == "invalid_url" and len(by_id["bad-7"]["message"]) <= 300
    assert max(len(line) for line in client.files.content(done.error_file_id).content.splitlines()) < 1000


async def test_a_key_has_a_bound_on_its_active_batches(
    make_settings: Callable[..., Settings],
    redis_client: redis.Redis,  # a flushed Redis: no other test's batches count
    start_api: Callable[[Settings], ApiProcess],
) -> None:
    settings = make_settings(api_keys=[KEY_A, KEY_B], batch_active_max=2)
    url = start_api(settings).url
    client, other = client_for(url, KEY_A), client_for(url, KEY_B)
    file_id = upload(client, chat_line("good", "hi"))  # no worker: its batches stay active
    first = client.batches.create(input_file_id=file_id, endpoint=CHAT, completion_window="24h")
    client.batches.create(input_file_id=file_id, endpoint=CHAT, completion_window="24h")
    with pytest.raises(openai.RateLimitError) as refused:
        client.batches.create(input_file_id=file_id, endpoint=CHAT, completion_window="24h")
    error = refused.value.body
    assert (
        isinstance(error, dict) and error["type"] == "rate_limit_error" and error["param"] == "active_batches"
    )
    assert error["code"] == "quota_exceeded"  # a bound to free room under, not a rate to wait out
    assert "GENQ_BATCH_ACTIVE_MAX" in error["message"]
    assert len(client.batches.list().data) == 2  # the refused create made nothing
    other.batches.create(
        input_file_id=upload(other, chat_line("b", "hi")), endpoint=CHAT, completion_window="24h"
    )
    # A batch that ended (cancelled: the feeder cancels its line and ends it) frees its slot.
    client.batches.cancel(first.id)
    wait_for(client, first.id, {"cancelled"})
    client.batches.create(input_file_id=file_id, endpoint=CHAT, completion_window="24h")
