"""workers/intake.py: a task thread's next job without a delivery, against a real Redis and the
real scripts. Jobs are accepted through the real submit script (tests/shared/test_store_scripts.py)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import orjson
import pytest
import redis

from shared.celery_app import queue_lists
from tests.shared.test_store_scripts import LIST, QUEUE, client, jobs, record, submit
from workers.intake import Intake
from workers.jobs import WorkerJobs

__all__ = ["client", "jobs"]  # the fixtures, shared with the store scripts' tests


@pytest.fixture
def intake(client: redis.Redis, jobs: WorkerJobs) -> Callable[..., Intake]:
    def make(wait_s: float = 2.0, closing: threading.Event | None = None) -> Intake:
        return Intake(jobs, client, "w1", queue_lists(QUEUE), wait_s, closing or threading.Event())

    return make


def later(delay_s: float, action: Callable[[], object]) -> threading.Thread:
    thread = threading.Timer(delay_s, action)
    thread.start()
    return thread


def test_a_waiting_job_is_taken_at_once(client: redis.Redis, intake: Callable[..., Intake]) -> None:
    submit(client, "j1")
    started = time.monotonic()
    taken = intake(wait_s=5.0).next_job()
    assert taken is not None and taken[0] == "j1" and time.monotonic() - started < 1.0
    assert taken[1] == record(client, "j1") and taken[1]["status"] == "running"


def test_a_job_submitted_during_the_wait_is_claimed(
    client: redis.Redis, intake: Callable[..., Intake]
) -> None:
    later(0.2, lambda: submit(client, "j1"))
    taken = intake(wait_s=5.0).next_job()
    assert taken is not None and taken[0] == "j1"
    rec = record(client, "j1")
    assert (rec["status"], rec["worker"]) == ("running", "w1") and client.llen(LIST) == 0


def test_nothing_within_the_wait_gives_the_thread_back(intake: Callable[..., Intake]) -> None:
    started = time.monotonic()
    assert intake(wait_s=0.3).next_job() is None
    assert 0.25 < time.monotonic() - started < 2.0
    assert intake(wait_s=0.0).next_job() is None  # no wait: only a job already waiting


def test_a_message_of_a_job_that_cannot_run_is_passed_over(
    client: redis.Redis, intake: Callable[..., Intake]
) -> None:
    submit(client, "gone")
    submit(client, "j1")
    client.hset("genq:job:gone", "status", "canceled")
    gone, queued = client.rpop(LIST), client.rpop(LIST)  # out of the list, to come back in one push
    later(0.2, lambda: client.lpush(LIST, gone, queued))  # type: ignore[arg-type]  # `gone` is popped first
    taken = intake(wait_s=5.0).next_job()
    assert taken is not None and taken[0] == "j1"
    assert record(client, "gone")["status"] == "canceled"


def test_another_tasks_message_goes_back_for_celery(
    client: redis.Redis, intake: Callable[..., Intake]
) -> None:
    submit(client, "j1")
    foreign = orjson.loads(client.rpop(LIST))  # type: ignore[arg-type]
    foreign["headers"]["task"] = "someone.else"
    later(0.2, lambda: client.lpush(LIST, orjson.dumps(foreign)))
    assert intake(wait_s=5.0).next_job() is None
    assert orjson.loads(client.lindex(LIST, -1))["headers"]["task"] == "someone.else"  # type: ignore[arg-type]


def test_a_closing_worker_takes_nothing(client: redis.Redis, intake: Callable[..., Intake]) -> None:
    submit(client, "j1")
    closing = threading.Event()
    closing.set()
    assert intake(closing=closing).next_job() is None
    assert record(client, "j1")["status"] == "queued" and client.llen(LIST) == 1
