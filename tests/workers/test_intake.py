"""workers/intake.py: a task thread's next job without a delivery, against a real Redis and the
real scripts. Jobs are accepted through the real submit script (tests/shared/jobqueue/test_job_scripts.py)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import orjson
import pytest
import redis

from shared.celery_app import queue_lists
from tests.conftest import commands_while
from tests.shared.jobqueue.test_job_scripts import LIST, QUEUE, client, jobs, record, submit
from workers.intake import Intake
from workers.jobs import NextTake, WorkerJobs

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


def _finished_with_next_take(client: redis.Redis, jobs: WorkerJobs, intake: Intake, *queued: str) -> NextTake:
    """Take j1 and finish it with the take of the thread's next job, as workers/runtime.py does;
    `queued` are submitted behind j1 before it is taken (so its take names their keys for the next)."""
    submit(client, "j1")
    for job_id in queued:
        submit(client, job_id)
    job_id, claimed = intake.next_job() or ("", {})
    assert job_id == "j1"
    then = intake.next_take()
    assert jobs.finish("j1", "w1", {"status": "succeeded", "output": "{}"}, record=claimed, then=then)
    return then


def test_the_job_a_finish_took_comes_with_no_command_sent(
    client: redis.Redis, jobs: WorkerJobs, intake: Callable[..., Intake]
) -> None:
    """The finish of the thread's last job took and claimed the next (WorkerJobs.finish `then`):
    it is run without another round trip, even by a worker closing meanwhile (it holds the job)."""
    closing = threading.Event()
    make = intake(wait_s=5.0, closing=closing)
    then = _finished_with_next_take(client, jobs, make, "j2")
    closing.set()
    got: list[object] = []
    assert commands_while(client, lambda: got.append(make.next_job(then))) == []
    assert got[0] == ("j2", record(client, "j2")) and record(client, "j2")["worker"] == "w1"


def test_a_job_queued_after_the_thread_took_its_last_costs_one_more_take(
    client: redis.Redis, jobs: WorkerJobs, intake: Callable[..., Intake]
) -> None:
    """The take sent with a finish declares the keys of the jobs that were next in line when the
    thread took its last job (shared/jobqueue/lua/take.lua). A job queued after that asks for its keys
    there, and the thread's next take, with them, claims it."""
    make = intake(wait_s=5.0)
    submit(client, "j1")
    job_id, claimed = make.next_job() or ("", {})
    submit(client, "j2")
    then = make.next_take()
    assert jobs.finish(job_id, "w1", {"status": "succeeded", "output": "{}"}, record=claimed, then=then)
    assert not then.done and then.labels and record(client, "j2")["status"] == "queued"
    got: list[object] = []
    commands = commands_while(client, lambda: got.append(make.next_job(then)))
    sent = [command.split()[0].upper() for command in commands]
    assert sent.count("EVALSHA") == 1 and "BRPOP" not in sent  # one take, its inner commands aside
    assert got[0] == ("j2", record(client, "j2")) and record(client, "j2")["worker"] == "w1"


def test_when_the_finish_took_nothing_the_thread_goes_straight_to_its_wait(
    client: redis.Redis, jobs: WorkerJobs, intake: Callable[..., Intake]
) -> None:
    make = intake(wait_s=5.0)
    then = _finished_with_next_take(client, jobs, make)
    assert then.done and then.taken is None
    later(0.3, lambda: submit(client, "j2"))
    got: list[object] = []
    commands = commands_while(client, lambda: got.append(make.next_job(then)))
    assert commands[0].upper().startswith("BRPOP") and got[0] == ("j2", record(client, "j2"))
    assert intake(wait_s=0.0).next_job(_finished_with_next_take(client, jobs, make)) is None


def test_a_take_the_finish_could_not_make_is_made_by_the_thread(
    client: redis.Redis, jobs: WorkerJobs, intake: Callable[..., Intake]
) -> None:
    make = intake(wait_s=5.0)
    submit(client, "j2")
    then = make.next_take()  # never sent (its finish failed, or Redis had forgotten the script)
    taken = make.next_job(then)
    assert taken is not None and taken[0] == "j2" and record(client, "j2")["status"] == "running"
