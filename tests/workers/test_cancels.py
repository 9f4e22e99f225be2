"""workers/cancels.py against a real Redis: a job id published on the cancel channel reaches the
runtime's callback, and the listener subscribes again after Redis dropped its connection."""

from __future__ import annotations

import threading
import time

import pytest
import redis

from shared import keys
from workers.cancels import CancelListener

#: The listener's thread must never end on an error (it ended on one from redis-py's parser).
pytestmark = pytest.mark.filterwarnings("error::pytest.PytestUnhandledThreadExceptionWarning")


def published_until_heard(client: redis.Redis, job_id: str, heard: list[str]) -> None:
    """Publish job_id until the listener heard it (its subscription may not be up yet)."""
    deadline = time.monotonic() + 10
    while job_id not in heard:
        assert time.monotonic() < deadline, heard
        client.publish(keys.CANCEL_CHANNEL, job_id)
        time.sleep(0.05)


def test_a_published_cancel_reaches_the_runtime_even_after_a_dropped_connection(
    redis_client: redis.Redis,
) -> None:
    heard: list[str] = []
    stopped = threading.Event()
    CancelListener(redis_client, stopped, heard.append).start()
    try:
        published_until_heard(redis_client, "job-1", heard)
        redis_client.client_kill_filter(_type="pubsub")
        published_until_heard(redis_client, "job-2", heard)
    finally:
        stopped.set()
    assert heard[0] == "job-1" and "job-2" in heard
