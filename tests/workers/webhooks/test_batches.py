"""Batch webhooks end to end: a batch's end (batch.completed, batch.failed, batch.cancelled; and
batch.expired, the same path) is delivered once, signed like job webhooks, to the URL in the
batch's metadata or the key's default (real API, model and webhook workers, loopback receivers)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, cast

import openai
import pytest
import redis

from cli.redis_server import EmbeddedRedis
from shared.config import Settings
from tests.api.live_server import live_server
from tests.api.routes.test_batches import CHAT, chat_line, upload, wait_for
from tests.api.routes.test_openai import client_for
from tests.conftest import WorkerProcess
from tests.workers.webhooks.test_tasks import Receiver, hook_settings, receivers, verify_with_each_secret  # noqa: F401

pytestmark = pytest.mark.slow


@pytest.fixture
def stack(
    redis_server: EmbeddedRedis,
    redis_client: redis.Redis,
    tmp_path: Path,
    receivers: Callable[..., Receiver],  # noqa: F811
) -> Iterator[tuple[openai.OpenAI, Receiver, Receiver]]:
    metadata_receiver, default_receiver = receivers(), receivers()
    settings = hook_settings(
        redis_server.url, tmp_path / "genq", api_keys=["alice-key"],
        batch_webhook_urls={"key-" + _owner_digest("alice-key"): default_receiver.url},
    )  # fmt: skip
    workers = [WorkerProcess(settings, tmp_path / "model.log"),
               WorkerProcess(settings, tmp_path / "hooks.log", "--queues=webhooks")]  # fmt: skip
    try:
        for worker in workers:
            worker.wait_ready()
        with live_server(settings) as url:
            yield client_for(url, "alice-key"), metadata_receiver, default_receiver
    finally:
        for worker in workers:
            worker.close()


def _owner_digest(key: str) -> str:
    import hashlib

    return hashlib.sha256(key.encode()).hexdigest()[:16]


def until_received(receiver: Receiver, count: int) -> None:
    deadline = time.monotonic() + 30
    while len(receiver.received) < count:
        assert time.monotonic() < deadline, "the webhook never came"
        time.sleep(0.05)


def test_batch_events_are_signed_and_sent_once(stack: tuple[openai.OpenAI, Receiver, Receiver]) -> None:
    client, metadata_receiver, default_receiver = stack
    file_id = upload(client, chat_line("a", "x") + chat_line("b", "y"))
    # The URL in metadata wins over the key's default.
    batch = client.batches.create(input_file_id=file_id, endpoint=CHAT, completion_window="24h",
                                  metadata={"webhook_url": metadata_receiver.url})  # fmt: skip
    wait_for(client, batch.id, {"completed"})
    until_received(metadata_receiver, 1)
    payload = verify_with_each_secret(metadata_receiver.received[0])
    assert payload["type"] == "batch.completed" and payload["data"]["id"] == batch.id
    assert payload["data"]["status"] == "completed" and payload["data"]["request_counts"]["completed"] == 2
    assert metadata_receiver.received[0].headers["webhook-id"] == f"msg_{batch.id}_batch.completed"
    # No URL in metadata: the key's default; a failed batch sends batch.failed.
    failed = client.batches.create(
        input_file_id=upload(client, b"\n"), endpoint=CHAT, completion_window="24h"
    )
    wait_for(client, failed.id, {"failed"})
    until_received(default_receiver, 1)
    assert verify_with_each_secret(default_receiver.received[0])["type"] == "batch.failed"
    # A cancelled one sends batch.cancelled.
    cancelled = client.batches.create(input_file_id=file_id, endpoint=CHAT, completion_window="24h")
    client.batches.cancel(cancelled.id)
    wait_for(client, cancelled.id, {"cancelled", "completed"})
    until_received(default_receiver, 2)
    assert verify_with_each_secret(default_receiver.received[1])["type"] in (
        "batch.cancelled",
        "batch.completed",
    )
    time.sleep(1.0)  # nothing is sent twice
    assert len(metadata_receiver.received) == 1 and len(default_receiver.received) == 2


def test_a_webhook_url_the_policy_refuses_is_a_400(
    make_settings: Callable[..., Settings], redis_client: redis.Redis
) -> None:
    with live_server(make_settings()) as url:
        client = client_for(url)
        file_id = upload(client, chat_line("a", "x"))
        with pytest.raises(openai.BadRequestError) as refused:
            client.batches.create(input_file_id=file_id, endpoint=CHAT, completion_window="24h",
                                  metadata={"webhook_url": "http://127.0.0.1:8080/hook"})  # fmt: skip
        assert cast(dict[str, Any], refused.value.body)["param"] == "metadata.webhook_url"
