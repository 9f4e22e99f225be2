"""shared/reaper.py as it runs in a process: its own thread reclaims a lapsed lease and leaves a
live one alone, counts and logs each action with the job id, and a Redis error skips one period
instead of ending the thread. (Each reaper script's state before and after is tested in
tests/shared/test_store_scripts.py.)"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import redis
from prometheus_client import REGISTRY

from cli.redis_server import EmbeddedRedis
from shared import keys
from shared.config import Settings
from shared.logging import JsonFormatter
from shared.reaper import Reaper
from tests.shared.test_store_scripts import LEASE_S, MAX_ATTEMPTS, TIMEOUT_S, deliver, lapse, record, submit
from workers.jobs import WorkerJobs


def _running(client: redis.Redis, job_id: str) -> None:
    submit(client, job_id)
    deliver(client, job_id)
    assert WorkerJobs(client, LEASE_S, MAX_ATTEMPTS, TIMEOUT_S).claim(job_id, "w1")


def _requeued_total() -> float:
    return REGISTRY.get_sample_value("genq_reaper_actions_total", {"action": "requeued"}) or 0.0


def test_the_reaper_thread_reclaims_a_lapsed_lease_and_not_a_live_one(
    redis_client: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    _running(redis_client, "lapsed")
    _running(redis_client, "live")
    lapse(redis_client, "lapsed")
    before = _requeued_total()
    reaper = Reaper(redis_client, MAX_ATTEMPTS, TIMEOUT_S, 0.1)
    with caplog.at_level(logging.WARNING, logger="genq.reaper"):
        thread = reaper.start()
        deadline = time.monotonic() + 10
        while record(redis_client, "lapsed")["status"] != "queued" and time.monotonic() < deadline:
            time.sleep(0.05)
        reaper.stop()
        thread.join(timeout=5)
    assert not thread.is_alive()
    assert record(redis_client, "lapsed")["status"] == "queued"
    assert record(redis_client, "live")["status"] == "running"
    assert _requeued_total() == before + 1
    lines = [json.loads(JsonFormatter().format(r)) for r in caplog.records]
    assert {"event": "reaper_action", "action": "requeued", "job_id": "lapsed"}.items() <= lines[0].items()


def test_a_redis_error_skips_a_period_and_the_thread_goes_on(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    server = EmbeddedRedis(tmp_path, appendonly=False)
    server.start()
    client = redis.Redis.from_url(server.url, socket_timeout=1, socket_connect_timeout=1)
    reaper = Reaper(client, MAX_ATTEMPTS, TIMEOUT_S, 0.1)
    server.stop()  # the scripts are registered; every period now fails to connect
    with caplog.at_level(logging.WARNING, logger="genq.reaper"):
        thread = reaper.start()
        time.sleep(1.0)
        alive = thread.is_alive()
        reaper.stop()
        thread.join(timeout=5)
    client.close()
    assert alive and not thread.is_alive()
    skipped = [r for r in caplog.records if r.getMessage() == "reaper_skipped"]
    assert skipped and json.loads(JsonFormatter().format(skipped[0]))["error"] == "ConnectionError"


def test_from_settings_uses_the_settings_interval(
    redis_client: redis.Redis, make_settings: Callable[..., Settings]
) -> None:
    """The lock lasts a little less than one period, so the next period's reaper may run."""
    settings = make_settings(reaper_interval_s=2.0)
    Reaper.from_settings(redis_client, settings).run_once()
    assert 1000 < redis_client.pttl(keys.REAPER_LOCK) <= 1800
