"""workers/heartbeat.py against a real Redis: a beat puts the worker in the fleet registry with
its slots, renews the lease of a job it runs, reports a job it no longer holds, and freshens the
ready file; a beat Redis refuses is logged by the loop, which goes on."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import redis

from shared import keys
from shared.config import Settings
from workers.heartbeat import Heartbeat
from workers.jobs import WorkerJobs

WORKER = "host:1:abcdef"


def heartbeat(
    settings: Settings, client: redis.Redis, ready: Path, held: list[str], lost: list[str]
) -> Heartbeat:
    jobs = WorkerJobs(client, settings.lease_ttl_s, settings.max_attempts, settings.job_timeout_s)
    return Heartbeat(jobs, WORKER, keys.WORKERS, 4, ready, lambda: held, lost.append, lambda: None)


def test_a_beat_registers_renews_and_reports_lost_jobs(
    make_settings: Callable[..., Settings], redis_client: redis.Redis, tmp_path: Path
) -> None:
    redis_client.hset(keys.job("mine"), mapping={"status": "running", "worker": WORKER, "lease": "1"})
    redis_client.hset(keys.job("taken"), mapping={"status": "running", "worker": "another", "lease": "1"})
    ready = tmp_path / "ready"
    ready.touch()
    stale = ready.stat().st_mtime - 60
    os.utime(ready, (stale, stale))
    lost: list[str] = []
    heartbeat(make_settings(), redis_client, ready, ["mine", "taken"], lost).beat()
    assert redis_client.zscore(keys.WORKERS, WORKER) is not None
    assert redis_client.hget(keys.WORKER_SLOTS, WORKER) == "4"
    assert float(str(redis_client.hget(keys.job("mine"), "lease"))) > time.time()
    assert lost == ["taken"]
    assert ready.stat().st_mtime > stale


def test_the_loop_outlives_a_refused_beat(
    make_settings: Callable[..., Settings],
    redis_client: redis.Redis,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    stopped = threading.Event()
    beat = heartbeat(make_settings(), redis_client, tmp_path / "ready", [], [])
    beat.start(0.05, stopped)
    redis_client.delete(keys.WORKERS)
    try:
        redis_client.config_set("maxmemory", 1)
        deadline = time.monotonic() + 10
        while "heartbeat_failed" not in caplog.messages:
            assert time.monotonic() < deadline
            time.sleep(0.05)
    finally:
        redis_client.config_set("maxmemory", 0)
    deadline = time.monotonic() + 10
    while redis_client.zscore(keys.WORKERS, WORKER) is None:  # it beats again once writes are taken
        assert time.monotonic() < deadline
        time.sleep(0.05)
    stopped.set()
