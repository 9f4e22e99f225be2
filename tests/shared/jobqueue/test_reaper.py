"""shared/jobqueue/reaper.py as it runs in a process: its own thread reclaims a lapsed lease and leaves a
live one alone, counts and logs each action with the job id, and a Redis error skips one period
instead of ending the thread. (Each reaper script's state before and after is tested in
tests/shared/jobqueue/test_job_scripts.py.)"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import redis
from prometheus_client import REGISTRY

from cli.redis_server import EmbeddedRedis
from shared import keys
from shared.config import Settings
from shared.jobqueue import scripts
from shared.jobqueue.reaper import Reaper
from shared.logging import JsonFormatter
from tests.shared.jobqueue.test_job_scripts import (
    LEASE_S,
    LIST,
    MAX_ATTEMPTS,
    TIMEOUT_S,
    deliver,
    lapse,
    messages_in_list,
    record,
    submit,
)
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


class _HeldReaper(Reaper):
    """A reaper whose period holds until the test lets it go: a period caught in progress."""

    def __init__(self, client: redis.Redis) -> None:
        super().__init__(client, MAX_ATTEMPTS, TIMEOUT_S, 0.01)
        self.in_period, self.release = threading.Event(), threading.Event()

    def run_once(self, now: float | None = None) -> dict[str, int]:
        self.in_period.set()
        self.release.wait(10)
        return super().run_once(now)


def test_stop_returns_once_a_period_in_progress_has_ended(redis_client: redis.Redis) -> None:
    """Whoever stops the reaper closes its client next: no period may still be using it."""
    reaper = _HeldReaper(redis_client)
    thread = reaper.start()
    assert reaper.in_period.wait(10)
    threading.Timer(0.2, reaper.release.set).start()
    reaper.stop()
    assert not thread.is_alive()


def test_from_settings_uses_the_settings_interval(
    redis_client: redis.Redis, make_settings: Callable[..., Settings]
) -> None:
    """The lock lasts a little less than one period, so the next period's reaper may run."""
    settings = make_settings(reaper_interval_s=2.0)
    Reaper.from_settings(redis_client, settings).run_once()
    assert 1000 < redis_client.pttl(keys.REAPER_LOCK) <= 1800


def _lpos_calls(client: redis.Redis) -> int:
    return int(client.info("commandstats").get("cmdstat_lpos", {}).get("calls", 0))


@pytest.mark.parametrize("decoded", [False, True])  # the API's reaper client reads bytes, the worker's text
def test_orphan_checks_read_each_list_once_a_period_not_once_a_job(
    redis_client: redis.Redis, settings: Settings, decoded: bool
) -> None:
    """Checking N queued jobs scanned the list once per job (O(N^2) a period, bench/orphan_checks.py):
    the reaper now reads each list's delivery tags in one pass, and the scripts run no LPOS for the
    messages it found there."""
    for index in range(50):
        submit(redis_client, f"j{index}")
    client = redis.Redis.from_url(settings.require_redis_url(), decode_responses=decoded)
    redis_client.config_resetstat()
    due = time.time() + scripts.ORPHAN_CHECK_S + 1
    assert Reaper(client, MAX_ATTEMPTS, TIMEOUT_S, 1.0).run_once(due) == {}
    assert _lpos_calls(redis_client) == 0
    assert all(messages_in_list(redis_client, f"j{index}") == 1 for index in range(50))
    checked = redis_client.zrangebyscore(keys.ORPHAN_CHECKS, due + scripts.ORPHAN_CHECK_S, "+inf")
    assert len(checked) == 50  # each was checked (held), and is next due a period later


def test_a_message_lost_after_the_list_was_read_is_found_on_the_next_read(redis_client: redis.Redis) -> None:
    """A list read is trusted only for the period it was read in: a message taken and lost after it
    is missed once, then found missing on the next period's read and pushed again."""
    submit(redis_client, "j1")
    reaper = Reaper(redis_client, MAX_ATTEMPTS, TIMEOUT_S, 1.0)
    first = time.time() + scripts.ORPHAN_CHECK_S + 1
    assert reaper.run_once(first) == {}  # found in the list: held
    redis_client.rpop(LIST)  # a worker takes it and dies before kombu records it unacked
    redis_client.delete(keys.REAPER_LOCK)
    second = first + scripts.ORPHAN_CHECK_S + 1
    assert reaper.run_once(second) == {}  # a fresh read: missing once, suspect
    redis_client.delete(keys.REAPER_LOCK)
    assert reaper.run_once(second + scripts.ORPHAN_RECHECK_S + 1) == {"repushed": 1}
    assert messages_in_list(redis_client, "j1") == 1


class _Meanwhile(redis.Redis):
    """A real client that runs `between` before each LRANGE it sends: another client's real writes
    to the list (a producer pushing, a worker taking) landing while the reaper reads it."""

    between: Callable[[], object] = staticmethod(lambda: None)

    def lrange(self, *args: Any, **kwargs: Any) -> Any:
        self.between()
        return super().lrange(*args, **kwargs)


def _foreign_message(index: int) -> str:
    """A message of no job (its check is not the test's), with a delivery tag of its own."""
    return json.dumps({"headers": {"id": f"other{index}"}, "properties": {"delivery_tag": f"other-{index}"}})


def test_messages_pushed_during_a_list_read_hide_none_of_the_oldest(
    redis_client: redis.Redis, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A producer pushing while the reaper reads a queue list in chunks: a read counted from the head
    missed the oldest messages (as many as were pushed meanwhile), whose checks come due first, and
    each then cost its script a scan of the whole list (a core of Redis at ~10^5 queued). Counted
    from the tail, every message queued before the read is found, and no script scans."""
    monkeypatch.setattr("shared.jobqueue.reaper.LIST_CHUNK", 10)
    monkeypatch.setattr("shared.jobqueue.reaper.LIST_OVERLAP", 3)
    for index in range(40):
        submit(redis_client, f"j{index}")
    pushed = iter(range(1000))
    client = _Meanwhile(connection_pool=redis.ConnectionPool.from_url(settings.require_redis_url()))
    client.between = lambda: redis_client.lpush(LIST, *(_foreign_message(next(pushed)) for _ in range(5)))
    redis_client.config_resetstat()
    due = time.time() + scripts.ORPHAN_CHECK_S + 1
    with client:
        assert Reaper(client, MAX_ATTEMPTS, TIMEOUT_S, 1.0).run_once(due) == {}
    assert _lpos_calls(redis_client) == 0
    checked = redis_client.zrangebyscore(keys.ORPHAN_CHECKS, due + scripts.ORPHAN_CHECK_S, "+inf")
    assert len(checked) == 40  # each found in the read: held, next due a period later


def test_messages_taken_during_a_list_read_hide_none_of_the_rest(
    redis_client: redis.Redis, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker taking messages from the tail while the reaper reads: each take moves the rest one
    place towards the tail, and chunks that share LIST_OVERLAP messages miss none of those left
    when fewer than that are taken between two reads."""
    monkeypatch.setattr("shared.jobqueue.reaper.LIST_CHUNK", 10)
    monkeypatch.setattr("shared.jobqueue.reaper.LIST_OVERLAP", 3)
    redis_client.lpush(LIST, *(_foreign_message(index) for index in range(40)))
    client = _Meanwhile(connection_pool=redis.ConnectionPool.from_url(settings.require_redis_url()))
    client.between = lambda: redis_client.rpop(LIST, 2)
    with client:
        tags = Reaper(client, MAX_ATTEMPTS, TIMEOUT_S, 1.0)._read_tags(LIST)
    left = {json.loads(message)["properties"]["delivery_tag"] for message in redis_client.lrange(LIST, 0, -1)}
    assert left and left <= tags
