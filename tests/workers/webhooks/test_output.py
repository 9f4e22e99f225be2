"""workers/webhooks/output.py: `output` notices become at most one delivery message per second per
job, never block the engine's hook, and only for jobs whose webhook filter holds `output`. (Output
deliveries reaching a receiver end to end: tests/workers/webhooks/test_tasks.py.)"""

from __future__ import annotations

import base64
import itertools
import json
import time
from collections.abc import Callable
from pathlib import Path

import redis

from cli.redis_server import EmbeddedRedis, free_port
from shared.config import Settings
from shared.jobspec import JobSpec
from tests.conftest import suite_settings
from workers.webhooks.output import OutputWebhooks, wants_output

#: The spec of a job whose webhook asks for `output` (what OutputWebhooks.follow reads of it).
OUTPUT_HOOKED = JobSpec.model_validate(
    {
        "prompt": "hi",
        "max_tokens": 1,
        "webhook": "https://receiver.example/hook",
        "webhook_events_filter": ["output"],
    }
)


def test_output_notices_are_throttled_to_one_per_second_per_job(
    redis_server: EmbeddedRedis, tmp_path: Path
) -> None:
    settings = suite_settings(redis_server.url[:-1] + "3", tmp_path)  # a database no worker consumes
    client = redis.Redis.from_url(settings.require_redis_url(), decode_responses=True)
    client.flushdb()
    notifier = OutputWebhooks(client, settings)
    notifier.follow("job", OUTPUT_HOOKED)
    pushes: list[float] = []
    started = time.monotonic()
    while time.monotonic() - started < 3.5:
        if time.monotonic() - started < 2.5:
            notifier.on_output("job")
        while client.llen("webhooks") > len(pushes):
            pushes.append(time.monotonic() - started)
        time.sleep(0.02)
    notifier.close()
    messages = [json.loads(m) for m in client.lrange("webhooks", 0, -1)]
    assert {json.dumps(json.loads(base64.b64decode(m["body"]))[0]) for m in messages} == {'["job", "output"]'}
    assert 3 <= len(pushes) <= 4, pushes  # at 0, 1, 2 s, and the last call's trailing notice at 3 s
    assert pushes[0] < 0.3
    assert all(later - earlier >= 0.9 for earlier, later in itertools.pairwise(pushes)), pushes


def test_on_output_never_blocks_or_raises_when_redis_is_down(make_settings: Callable[..., Settings]) -> None:
    unreachable = redis.Redis(port=free_port(), socket_connect_timeout=5)
    notifier = OutputWebhooks(unreachable, make_settings())
    notifier.follow("job", OUTPUT_HOOKED)
    started = time.monotonic()
    for _ in range(100):
        notifier.on_output("job")
    assert time.monotonic() - started < 0.5
    notifier.close()


def test_wants_output_reads_the_webhook_and_its_filter() -> None:
    def spec(**fields: object) -> JobSpec:
        return JobSpec.model_validate({"prompt": "hi", "max_tokens": 1} | fields)

    hook = "http://127.0.0.1:9/"
    assert wants_output(spec(webhook=hook, webhook_events_filter=["start", "output"]))
    assert not wants_output(spec(webhook=hook, webhook_events_filter=["completed"]))
    assert not wants_output(spec(webhook=hook))  # the default filter: completed
    assert not wants_output(spec(webhook_events_filter=["output"]))  # no webhook
    assert not wants_output(spec())
