# kombu's API is untyped (pyproject.toml lists it among such packages): its calls are checked here by running.
# mypy: disable-error-code="no-untyped-call"
"""The contract of shared/jobqueue/kombu_layout.py with the pinned kombu and Celery, on the suite's real
Redis: what genq's scripts write, kombu's public consumer receives and acknowledges, holding it
where genq's scripts look (the unacked hash and its index, by the message's delivery tag); what
Celery publishes, genq's take script claims and the reaper reads; and the names are the ones kombu
uses with genq's transport options. (tests/shared/test_messages.py compares the messages field by
field with what Celery publishes.) A kombu or Celery that lays out anything differently fails here."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import redis
from kombu.connection import Connection
from kombu.entity import Queue
from kombu.message import Message

from cli.redis_server import EmbeddedRedis
from shared import keys
from shared.celery_app import create_celery_app
from shared.config import Settings
from shared.jobqueue import kombu_layout
from shared.jobqueue.reaper import Reaper
from shared.jobqueue.records import job_message
from tests.shared.jobqueue.test_job_scripts import LIST, QUEUE, client, jobs, record, submit
from workers.jobs import WorkerJobs

__all__ = ["client", "jobs"]  # the fixtures, shared with the store scripts' tests


@contextmanager
def consumer_of(url: str, received: list[tuple[Any, Message]]) -> Iterator[Connection]:
    """kombu's public consumer of QUEUE, on the transport options genq's Celery app sets."""
    options = create_celery_app(Settings(_env_file=None, redis_url=url)).conf.broker_transport_options
    with Connection(url, transport_options=options) as connection:
        queue = Queue(QUEUE, routing_key=QUEUE)
        with connection.Consumer(
            queue, accept=["json"], callbacks=[lambda body, m: received.append((body, m))]
        ):
            yield connection


def test_the_names_are_the_ones_kombu_uses_with_genqs_options(redis_server: EmbeddedRedis) -> None:
    with consumer_of(redis_server.url, []) as connection:
        channel: Any = connection.default_channel  # the Redis transport's, with its options
        assert (channel.unacked_key, channel.unacked_index_key) == (
            kombu_layout.UNACKED,
            kombu_layout.UNACKED_INDEX,
        )
        assert channel.sep == kombu_layout.PRIORITY_SEPARATOR
        assert list(channel.priority_steps) == list(kombu_layout.PRIORITY_STEPS)
        assert channel.global_keyprefix == ""  # the keys are bare, as genq's scripts name them


def test_a_message_genqs_scripts_write_is_received_and_acknowledged_by_kombu(
    client: redis.Redis, redis_server: EmbeddedRedis
) -> None:
    submit(client, "j1")  # the submit script pushes its message
    stored = record(client, "j1")["message"]
    received: list[tuple[Any, Message]] = []
    with consumer_of(redis_server.url, received) as connection:
        connection.drain_events(timeout=5)
        ((body, message),) = received
        assert (message.headers["task"], message.headers["id"], body[0]) == (keys.GENERATE_TASK, "j1", ["j1"])
        tag = message.delivery_tag
        assert tag == kombu_layout.delivery_tag_of(stored)  # kombu keys what it holds by genq's tag
        assert client.hexists(kombu_layout.UNACKED, tag) and client.zscore(kombu_layout.UNACKED_INDEX, tag)
        message.ack()
    assert (
        not client.hexists(kombu_layout.UNACKED, tag)
        and client.zscore(kombu_layout.UNACKED_INDEX, tag) is None
    )
    assert client.llen(LIST) == 0


def test_kombu_serves_genqs_priority_lists_lowest_step_first(
    client: redis.Redis, redis_server: EmbeddedRedis
) -> None:
    for job_id, priority in (("batch", 9), ("middle", 3), ("interactive", 0)):
        message, queue_list = job_message(job_id, QUEUE, priority)
        assert queue_list == kombu_layout.queue_key(QUEUE, priority)
        client.lpush(queue_list, message)
    received: list[tuple[Any, Message]] = []
    with consumer_of(redis_server.url, received) as connection:
        for _ in range(3):
            connection.drain_events(timeout=5)
            received[-1][1].ack()
    assert [message.headers["id"] for _, message in received] == ["interactive", "middle", "batch"]


def test_a_job_whose_message_kombu_holds_is_claimed_and_finished_forgetting_kombus_entry(
    client: redis.Redis, jobs: WorkerJobs, redis_server: EmbeddedRedis
) -> None:
    """A worker claims the job of a message kombu delivered: the claim keeps kombu's tag, and the
    finish drops kombu's entry (common.lua forget_delivery's layout), so it is never delivered again."""
    submit(client, "j1")
    received: list[tuple[Any, Message]] = []
    with consumer_of(redis_server.url, received) as connection:
        connection.drain_events(timeout=5)
        tag = received[0][1].delivery_tag
        claim = jobs.claim("j1", "w1")
        assert claim.record["delivery_tag"] == tag
        assert jobs.finish("j1", "w1", {"status": "succeeded", "output": "{}"}, record=claim.record)
        assert (
            not client.hexists(kombu_layout.UNACKED, tag)
            and client.zscore(kombu_layout.UNACKED_INDEX, tag) is None
        )
        received[0][1].ack()  # Celery's late ack of a message already forgotten: harmless


def test_a_message_celery_publishes_is_read_by_genqs_scripts_and_reaper(
    client: redis.Redis, jobs: WorkerJobs, make_settings: Callable[..., Settings]
) -> None:
    submit(client, "j1")
    client.delete(LIST)  # the job's message is Celery's instead of the submit script's
    app = create_celery_app(make_settings())
    try:
        app.send_task(
            keys.GENERATE_TASK, args=["j1"], task_id="j1", queue=QUEUE, priority=0, ignore_result=True
        )
    finally:
        app.close()
    (raw,) = client.lrange(LIST, 0, -1)
    assert kombu_layout.task_of(raw) == (keys.GENERATE_TASK, "j1")
    call = kombu_layout.read_task(raw)
    assert (call.task, call.task_id, call.args, call.kwargs, call.retries) == (
        keys.GENERATE_TASK,
        "j1",
        ["j1"],
        {},
        0,
    )
    tag = kombu_layout.delivery_tag_of(raw)
    assert tag is not None
    client.hset(keys.job("j1"), "message", raw)  # as if it had been the submit script's
    reaper = Reaper(client, 3, 600.0, 1.0)
    assert reaper.run_once(float(record(client, "j1")["deadline"]) - 1) == {}  # found in its list: held
    taken = jobs.take("w1", kombu_layout.queue_lists(QUEUE))
    assert taken is not None and taken[0] == "j1" and taken[1]["delivery_tag"] == tag


@pytest.mark.parametrize("priority", kombu_layout.PRIORITY_STEPS)
def test_a_queue_list_names_its_queue(priority: int) -> None:
    assert kombu_layout.queue_of_list(kombu_layout.queue_key("genq.m", priority)) == "genq.m"
