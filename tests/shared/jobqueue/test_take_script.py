"""shared/jobqueue/lua/take.lua as a state machine: a task thread takes the next queued job straight from
the broker's lists, popping its message and claiming the job in one step. Each case sets the
lists and records in a real Redis through the real submit and claim scripts, runs one take, and
checks the state after."""

from __future__ import annotations

import json
import threading
import time
from typing import cast

import orjson
import pytest
import redis

from shared import keys
from shared.celery_app import queue_lists
from tests.shared.jobqueue.test_job_scripts import (
    LEASE_S,
    LIST,
    QUEUE,
    client,
    deliver,
    indexed,
    jobs,
    record,
    submit,
)
from workers.jobs import TAKE_LOOKS, WorkerJobs

LISTS = queue_lists(QUEUE)
BATCH_LIST = keys.queue_key(QUEUE, 9)
__all__ = ["client", "jobs"]  # the fixtures, shared with the store scripts' tests


def take(jobs: WorkerJobs, worker: str = "w1") -> str | None:
    taken = jobs.take(worker, LISTS)
    return None if taken is None else taken[0]


def listed(client: redis.Redis, queue_list: str = LIST) -> list[str]:
    """The job ids of the list's messages, in the order BRPOP hands them out."""
    return [orjson.loads(raw)["headers"]["id"] for raw in reversed(client.lrange(queue_list, 0, -1))]


def test_nothing_queued_takes_nothing(client: redis.Redis, jobs: WorkerJobs) -> None:
    assert jobs.take("w1", LISTS) is None
    assert client.dbsize() == 0


def test_the_taken_job_is_claimed_as_a_delivered_one_would_be(client: redis.Redis, jobs: WorkerJobs) -> None:
    submit(client, "j1")
    taken = jobs.take("w1", LISTS)
    assert taken is not None
    job_id, claimed = taken
    rec = record(client, "j1")
    assert (job_id, claimed) == ("j1", rec)  # the worker runs the job from it, without reading it again
    assert (rec["status"], rec["worker"], rec["attempts"]) == ("running", "w1", "1")
    assert float(rec["lease"]) > time.time() + LEASE_S - 5 and "message" not in rec
    assert indexed(client, "j1") == {"leases", "live"}
    assert client.llen(LIST) == 0 and client.hlen(keys.KOMBU_UNACKED) == 0  # nowhere but claimed


def test_jobs_are_taken_oldest_first_and_interactive_before_batch(
    client: redis.Redis, jobs: WorkerJobs
) -> None:
    for job_id in ("b1", "j1", "j2"):
        submit(client, job_id)
        if job_id == "b1":  # a batch job's message sits on the priority-9 list
            client.lpush(BATCH_LIST, client.lpop(LIST))  # type: ignore[arg-type]
    assert [take(jobs) for _ in range(4)] == ["j1", "j2", "b1", None]


def test_messages_of_jobs_that_cannot_run_are_dropped_on_the_way(
    client: redis.Redis, jobs: WorkerJobs
) -> None:
    """A second copy of a running job's message (kombu restored it), one of a job past its
    deadline: dropped as a worker receiving them would (the expired job fails); the next is taken."""
    submit(client, "running")
    first_copy = client.lindex(LIST, 0)
    assert take(jobs) == "running"
    client.rpush(LIST, first_copy)  # type: ignore[arg-type]
    submit(client, "late", deadline_in=-1)
    submit(client, "j1")
    assert listed(client) == ["running", "late", "j1"]
    assert take(jobs, "w2") == "j1"
    assert listed(client) == []
    assert record(client, "running")["worker"] == "w1"
    late = record(client, "late")
    assert late["status"] == "failed" and orjson.loads(late["error"])["type"] == "timeout"


@pytest.mark.parametrize(
    ("job_id", "spaced"), [("j1", False), ("j1", True), ("j.1 x", False)], ids=["genq", "kombu", "not-a-word"]
)
def test_a_message_is_read_in_either_json_spacing_and_with_any_id(
    client: redis.Redis, jobs: WorkerJobs, job_id: str, spaced: bool
) -> None:
    """The take finds the task and id by patterns in genq's compact JSON and in kombu's (json.dumps'
    spacing), and decodes the whole message for an id that is not a plain word."""
    submit(client, job_id)
    envelope = orjson.loads(cast(str, client.rpop(LIST)))
    client.rpush(LIST, json.dumps(envelope) if spaced else orjson.dumps(envelope))
    assert take(jobs) == job_id
    assert record(client, job_id)["status"] == "running"


def test_a_message_of_another_task_goes_back_and_ends_the_take(client: redis.Redis, jobs: WorkerJobs) -> None:
    submit(client, "j1")
    foreign = orjson.loads(client.lindex(LIST, 0))  # type: ignore[arg-type]
    foreign["headers"].update(task="someone.else", id="other")
    client.rpush(LIST, orjson.dumps(foreign), b"not a task message")
    assert take(jobs) is None
    assert client.lrange(LIST, -1, -1) == ["not a task message"]  # where it was, at BRPOP's end
    client.rpop(LIST)
    assert take(jobs) is None
    assert listed(client) == ["other", "j1"]  # BRPOP's order: the other task's message comes first
    assert record(client, "j1")["status"] == "queued"


def test_one_take_looks_at_a_bounded_number_of_messages(client: redis.Redis, jobs: WorkerJobs) -> None:
    for index in range(TAKE_LOOKS + 1):
        submit(client, f"gone{index}")
        client.hset(keys.job(f"gone{index}"), "status", "canceled")
    submit(client, "j1")
    assert take(jobs) is None  # TAKE_LOOKS dropped, the rest left for the next take
    assert listed(client) == [f"gone{TAKE_LOOKS}", "j1"]
    assert take(jobs) == "j1"


def test_a_delivered_message_is_not_taken(client: redis.Redis, jobs: WorkerJobs) -> None:
    """A message a Celery worker holds (kombu's unacked hash) is that worker's to run."""
    submit(client, "j1")
    deliver(client, "j1")
    assert take(jobs) is None
    assert record(client, "j1")["status"] == "queued"


def _script_calls(client: redis.Redis) -> int:
    return int(client.info("commandstats").get("cmdstat_evalsha", {}).get("calls", 0))


def test_a_take_declares_the_keys_the_workers_latest_take_named(
    client: redis.Redis, jobs: WorkerJobs
) -> None:
    """Task threads share what the worker's latest take named: one whose own last take is older
    than other threads' takes still finds its job's keys declared, and takes it in one call."""
    for index in range(8):
        submit(client, f"j{index}")
    assert take(jobs) == "j0"
    other = threading.Thread(target=lambda: [take(jobs) for _ in range(4)])  # j1 .. j4
    other.start()
    other.join()
    client.config_resetstat()
    assert take(jobs) == "j5"
    assert _script_calls(client) == 1


def test_threads_taking_at_once_find_their_jobs_keys_declared(client: redis.Redis) -> None:
    """Threads whose jobs end in one engine step take at once, each with the keys the worker's
    latest take named: it names as many messages as the worker runs jobs at once."""
    jobs = WorkerJobs(client, LEASE_S, 3, 600, hints=12)
    for index in range(16):
        submit(client, f"j{index}")
    assert take(jobs) == "j0"
    client.config_resetstat()
    labels = list(jobs.hints)  # what 12 threads start their takes with, before any reply
    assert [jobs.take("w1", LISTS, labels)[0] for _ in range(12)] == [f"j{i}" for i in range(1, 13)]  # type: ignore[index]
    assert _script_calls(client) == 12
