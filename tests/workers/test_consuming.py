"""workers/consuming.py with a real worker process: the stopper makes that worker alone stop
consuming its queue (Celery's own inspect says so), and a worker that does not answer is logged,
not waited for."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import cast

import pytest
import redis
from celery import Celery
from celery.utils.nodenames import default_nodename

from shared import keys
from shared.celery_app import create_celery_app
from shared.config import Settings
from tests.conftest import WorkerProcess
from workers.consuming import consumer_stopper

pytestmark = pytest.mark.anyio


def consumed(app: Celery, node: str) -> list[str]:
    """The queues `node` consumes, as it answers Celery's inspect."""
    answers = app.control.inspect([node], timeout=5).active_queues() or {}
    return [queue["name"] for queue in answers[node]]


async def test_a_worker_told_to_stop_consumes_nothing(
    make_settings: Callable[..., Settings],
    redis_client: redis.Redis,
    start_worker: Callable[..., WorkerProcess],
) -> None:
    settings = make_settings()
    start_worker(settings)
    (worker_id,) = cast(list[str], redis_client.zrange(keys.WORKERS, 0, -1))
    node, queue = default_nodename(f"genq-{worker_id}"), keys.queue_for_model(settings.model)
    app = create_celery_app(settings)
    assert consumed(app, node) == [queue]
    await asyncio.to_thread(consumer_stopper(app, node, [queue]))
    assert consumed(app, node) == []


def test_a_worker_that_does_not_answer_is_logged(
    make_settings: Callable[..., Settings], redis_client: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    settings = make_settings()
    with caplog.at_level(logging.WARNING, logger="genq.worker"):
        consumer_stopper(create_celery_app(settings), "celery@nobody", ["genq.nothing"])()
    assert "consumer_cancel_unanswered" in caplog.messages
