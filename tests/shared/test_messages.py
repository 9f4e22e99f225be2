"""The API publishes Celery task messages without Celery (shared/jobqueue/kombu_layout.py). They must be what
kombu itself writes for `send_task` on our Celery app, so that unmodified workers consume them:
publish one with Celery into the suite's real Redis, build ours for the same task, compare."""

from __future__ import annotations

import base64
import datetime
import json
import uuid
from collections.abc import Callable
from typing import Any

import pytest
import redis

from shared import keys
from shared.celery_app import create_celery_app
from shared.config import Settings
from shared.jobqueue.kombu_layout import retagged, task_message

#: Not ours to match: kombu draws a random delivery tag per message, and Celery sets reply_to to
#: its app's own id (a result queue; our jobs ignore results).
VARYING = ("delivery_tag", "reply_to")


def published_by_celery(
    settings: Settings, client: redis.Redis, name: str, task_id: str, args: list[str], queue: str,
    priority: int, **options: Any,
) -> dict[str, Any]:  # fmt: skip
    app = create_celery_app(settings)
    try:
        app.send_task(name, args=args, task_id=task_id, queue=queue, priority=priority, ignore_result=True,
                      **options)  # fmt: skip
    finally:
        app.close()
    raw = client.lpop(keys.queue_key(queue, priority))
    assert isinstance(raw, str), f"nothing published on {keys.queue_key(queue, priority)}"
    message: dict[str, Any] = json.loads(raw)
    return message


def comparable(message: dict[str, Any]) -> dict[str, Any]:
    """The message with its body decoded (kombu's JSON has other spacing than ours: both are JSON)."""
    properties = {k: v for k, v in message["properties"].items() if k not in VARYING}
    body = json.loads(base64.b64decode(message["body"]))
    return {**message, "body": body, "properties": properties}


@pytest.mark.parametrize(
    ("name", "args", "priority"),
    [
        (keys.GENERATE_TASK, ["JOB"], 0),
        (keys.GENERATE_TASK, ["JOB"], 9),
        (keys.WEBHOOK_TASK, ["JOB", "completed"], 0),
        (keys.GENERATE_TASK, ['a "quoted" id é'], 3),
    ],
)
def test_our_message_is_the_one_celery_publishes(
    make_settings: Callable[..., Settings],
    redis_client: redis.Redis,
    name: str,
    args: list[str],
    priority: int,
) -> None:
    task_id = str(uuid.uuid4())
    args = [task_id if arg == "JOB" else arg for arg in args]
    queue = "genq.test-messages"
    theirs = published_by_celery(make_settings(), redis_client, name, task_id, args, queue, priority)
    ours = json.loads(task_message(name, task_id, args, queue, priority))
    assert comparable(ours) == comparable(theirs)
    assert list(ours) == list(theirs)
    uuid.UUID(ours["properties"]["delivery_tag"])  # a fresh tag of the same form


def test_a_retry_message_is_the_one_celery_publishes(
    make_settings: Callable[..., Settings], redis_client: redis.Redis
) -> None:
    """A webhook delivery publishes its own next generation (workers/webhooks/delivery.py): a worker must
    read the same retry count, keyword arguments and eta from it as from Celery's own retry."""
    task_id, queue = str(uuid.uuid4()), "genq.test-messages"
    args, kwargs = [task_id, "completed"], {"due_at": 1234.5}
    eta = datetime.datetime(2026, 12, 1, 12, 0, 30, 250_000, tzinfo=datetime.UTC)
    theirs = published_by_celery(make_settings(), redis_client, keys.WEBHOOK_TASK, task_id, args, queue, 0,
                                 kwargs=kwargs, retries=3, eta=eta)  # fmt: skip
    ours = json.loads(
        task_message(keys.WEBHOOK_TASK, task_id, args, queue, 0, retries=3, kwargs=kwargs, eta=eta)
    )
    assert comparable(ours) == comparable(theirs)
    assert ours["headers"]["retries"] == 3 and ours["headers"]["eta"] == eta.isoformat()


def test_a_retagged_copy_differs_only_in_its_tag() -> None:
    message = task_message(keys.WEBHOOK_TASK, "j", ["j", "start"], "q", 0, retries=2)
    tag, copy = retagged(message)
    original, copied = json.loads(message), json.loads(copy)
    assert tag == original["properties"]["delivery_tag"] != copied["properties"]["delivery_tag"]
    copied["properties"]["delivery_tag"] = tag
    assert copied == original


def test_each_message_has_its_own_delivery_tag() -> None:
    tags = {json.loads(task_message(keys.GENERATE_TASK, "j", ["j"], "q", 0))["properties"]["delivery_tag"]
            for _ in range(3)}  # fmt: skip
    assert len(tags) == 3
