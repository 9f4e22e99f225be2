"""workers/store_retry.py: a job-store call from a task thread waits out a Redis that is down or
refuses writes (real servers: one stopped and started again, one at maxmemory), gives up after
its retries with StoreUnavailable (the task then puts its message back), and lets any other
Redis error through at once."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
import redis
import redis.exceptions
from prometheus_client import REGISTRY

from cli.redis_server import EmbeddedRedis
from workers import store_retry
from workers.store_retry import StoreUnavailable, retry_store_call


def _refused_total() -> float:
    return REGISTRY.get_sample_value("genq_storage_refused_total", {"tier": "worker"}) or 0.0


def test_a_call_waits_for_redis_to_come_back(tmp_path: Path) -> None:
    server = EmbeddedRedis(tmp_path, appendonly=False)
    client = redis.Redis.from_url(server.url, socket_connect_timeout=0.5, decode_responses=True)
    restart = threading.Timer(1.0, server.start)
    restart.start()
    try:
        assert retry_store_call(lambda: client.set("k", "v"), retry_s=30) is True
        assert client.get("k") == "v"
    finally:
        restart.join()
        client.close()
        server.stop()


def test_a_call_waits_while_writes_are_refused(
    redis_client: redis.Redis, redis_server: EmbeddedRedis
) -> None:
    before = _refused_total()
    admin = redis.Redis.from_url(redis_server.url)
    redis_client.config_set("maxmemory", "1")
    lift = threading.Timer(1.0, lambda: admin.config_set("maxmemory", "0"))
    lift.start()
    try:
        assert retry_store_call(lambda: redis_client.set("k", "v"), retry_s=30) is True
    finally:
        lift.join()
        admin.config_set("maxmemory", "0")
        admin.close()
    assert redis_client.get("k") == "v" and _refused_total() > before


def test_past_its_retry_time_the_call_gives_up(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(store_retry, "RETRY_PAUSE_S", 0.05)
    server = EmbeddedRedis(tmp_path, appendonly=False)  # never started
    client = redis.Redis.from_url(server.url, socket_connect_timeout=0.2)
    started = time.monotonic()
    with pytest.raises(StoreUnavailable, match="Redis unreachable: ConnectionError"):
        retry_store_call(client.ping, retry_s=0.5)
    assert 0.5 <= time.monotonic() - started < 5


def test_other_errors_are_raised_at_once(redis_client: redis.Redis) -> None:
    redis_client.set("text", "not a list")
    started = time.monotonic()
    with pytest.raises(redis.exceptions.ResponseError, match="WRONGTYPE"):
        retry_store_call(lambda: redis_client.lpush("text", "x"), retry_s=30)
    assert time.monotonic() - started < 1
