# kombu's API is untyped (pyproject.toml lists it among such packages): its calls are checked here by running.
# mypy: disable-error-code="no-untyped-call"
"""workers/broker.py, the worker's kombu transport, against a real Redis: a message taken while the
store refuses writes (maxmemory) is recorded once the store takes writes again, instead of the
consumer failing for good, and so is a queue binding, and the acknowledgement or rejection of a
message; any other error still raises. A channel
reuses one client per connection pool."""

from __future__ import annotations

import logging
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import cast

import pytest
import redis
import redis.exceptions
from kombu.connection import Connection
from kombu.entity import Exchange, Queue
from kombu.message import Message

from cli import redis_server
from cli.redis_server import EmbeddedRedis
from shared import keys, kombu_layout
from workers.broker import Channel, Transport, while_refused

QUEUE = "genq.test-broker"


@pytest.fixture
def connection(redis_server: EmbeddedRedis, redis_client: redis.Redis) -> Iterator[Connection]:
    with Connection(redis_server.url, transport=Transport) as conn:
        yield conn


@pytest.fixture
def admin(redis_server: EmbeddedRedis) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis_server.url, decode_responses=True)
    yield client
    client.config_set("maxmemory", "0")
    client.close()


def _refuse_writes_for(admin: redis.Redis, seconds: float) -> threading.Timer:
    admin.config_set("maxmemory", "1")
    lift = threading.Timer(seconds, lambda: admin.config_set("maxmemory", "0"))
    lift.start()
    return lift


def test_a_message_taken_while_writes_are_refused_is_recorded_once_they_are_not(
    connection: Connection, admin: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    queue = Queue(QUEUE, routing_key=QUEUE)
    received: list[Message] = []
    with connection.Consumer(queue, callbacks=[lambda _, message: received.append(message)], no_ack=False):
        connection.Producer().publish({"job": 1}, routing_key=QUEUE, declare=[queue])
        lift = _refuse_writes_for(admin, 1.0)
        with caplog.at_level(logging.WARNING, logger="genq.worker"):
            connection.drain_events(timeout=10)  # stock kombu raised here: the consumer stopped
        lift.join()
        assert [m.payload for m in received] == [{"job": 1}]
        # Recorded as unacknowledged: a worker dying now leaves it for another.
        assert admin.hexists(keys.KOMBU_UNACKED, received[0].delivery_tag)
        assert [r.getMessage() for r in caplog.records].count("broker_record_refused") == 1
        received[0].ack()
    assert not admin.hexists(keys.KOMBU_UNACKED, received[0].delivery_tag)


def test_a_queue_binding_waits_for_writes(connection: Connection, admin: redis.Redis) -> None:
    """A consumer reconnecting while the store is full declares its queues again (as Celery's do:
    a direct exchange of the queue's name)."""
    name = QUEUE + ".bound"
    queue = Queue(name, exchange=Exchange(name, type="direct"), routing_key=name)
    lift = _refuse_writes_for(admin, 1.0)
    queue(connection.default_channel).declare()  # stock kombu raised: the worker exited
    lift.join()
    assert admin.smembers("_kombu.binding." + name) == {name + kombu_layout.PRIORITY_SEPARATOR * 2 + name}


def test_while_refused_raises_other_errors(admin: redis.Redis) -> None:
    admin.set("text", "not a list")
    with pytest.raises(redis.exceptions.ResponseError, match="WRONGTYPE"):
        while_refused(lambda: admin.lpush("text", "x"), "test_event")


def test_a_channel_reuses_its_client(connection: Connection) -> None:
    channel = cast(Channel, connection.default_channel)
    assert channel.client is channel.client
    assert channel._create_client() is channel._create_client()


#: Redis itself: valkey queues a MULTI's commands that need no memory even when full, Redis
#: refuses each, so only Redis refuses kombu's acknowledgement (a MULTI of ZREM and HDEL).
REDIS_SERVER = shutil.which("redis-server")


@pytest.fixture
def full_redis(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[EmbeddedRedis]:
    if REDIS_SERVER is None:
        pytest.skip("needs Redis's redis-server on PATH")
    monkeypatch.setattr(redis_server, "server_binary", lambda: REDIS_SERVER)
    server = EmbeddedRedis(tmp_path / "redis", appendonly=False)
    server.start()
    yield server
    server.stop()


@pytest.mark.parametrize("settle", ["ack", "requeue", "drop"])
def test_a_message_settled_while_writes_are_refused_is_settled_once_they_are_not(
    full_redis: EmbeddedRedis, settle: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Stock kombu raised, and on Celery's event loop that stopped the worker for good."""
    admin = redis.Redis.from_url(full_redis.url, decode_responses=True)
    queue = Queue(QUEUE, routing_key=QUEUE)
    received: list[Message] = []
    with (
        Connection(full_redis.url, transport=Transport) as connection,
        connection.Consumer(queue, callbacks=[lambda _, message: received.append(message)], no_ack=False),
    ):
        connection.Producer().publish({"job": 1}, routing_key=QUEUE, declare=[queue])
        connection.drain_events(timeout=10)
        lift = _refuse_writes_for(admin, 1.0)
        with caplog.at_level(logging.WARNING, logger="genq.worker"):
            if settle == "ack":
                received[0].ack()
            else:
                received[0].reject(requeue=settle == "requeue")
        lift.join()
    assert not admin.hexists(keys.KOMBU_UNACKED, received[0].delivery_tag)
    assert admin.llen(QUEUE) == (1 if settle == "requeue" else 0)
    event = "broker_ack_refused" if settle == "ack" else "broker_reject_refused"
    assert [r.getMessage() for r in caplog.records].count(event) == 1
    admin.close()
