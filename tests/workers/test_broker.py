# kombu's API is untyped (pyproject.toml lists it among such packages): its calls are checked here by running.
# mypy: disable-error-code="no-untyped-call"
"""workers/broker.py, the worker's kombu transport, against a real Redis: a message taken while the
store refuses writes (maxmemory) is recorded once the store takes writes again, instead of the
consumer failing for good, and so is a queue binding, and the acknowledgement or rejection of a
message; any other error still raises. A channel
reuses one client per connection pool."""

from __future__ import annotations

import inspect
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
from kombu.transport import redis as kombu_redis
from kombu.transport import virtual

from cli import redis_server
from cli.redis_server import EmbeddedRedis
from shared import keys
from shared.jobqueue import kombu_layout
from workers.broker import BRPOP_TIMEOUT_S, Channel, RetryingQoS, Transport, while_refused

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


#: What workers/broker.py overrides or calls of kombu's transport, as the pinned kombu (5.7.0)
#: declares it: a kombu that renames or reshapes one of them fails here, before a worker would.
KOMBU_FACES = {
    (kombu_redis.QoS, "append"): "(self, message, delivery_tag)",
    (kombu_redis.QoS, "ack"): "(self, delivery_tag)",
    (kombu_redis.QoS, "reject"): "(self, delivery_tag, requeue=False)",
    (kombu_redis.QoS, "restore_visible"): "(self, start=0, num=10, interval=10)",
    (kombu_redis.QoS, "restore_unacked"): "(self, client=None)",
    (kombu_redis.QoS, "restore_by_tag"): "(self, tag, client=None, leftmost=False)",
    (virtual.QoS, "ack"): "(self, delivery_tag)",
    (kombu_redis.Channel, "_create_client"): "(self, asynchronous=False)",
    (kombu_redis.Channel, "_connparams"): "(self, asynchronous=False)",
    (kombu_redis.Channel, "_queue_bind"): "(self, exchange, routing_key, pattern, queue)",
    (kombu_redis.Channel, "basic_consume"): "(self, queue, *args, **kwargs)",
}


@pytest.mark.parametrize(("owner", "name"), list(KOMBU_FACES), ids=lambda x: getattr(x, "__qualname__", x))
def test_what_the_transport_overrides_is_what_kombu_declares(owner: type, name: str) -> None:
    assert str(inspect.signature(getattr(owner, name))) == KOMBU_FACES[owner, name]
    overrides: dict[type, type] = {kombu_redis.QoS: RetryingQoS, kombu_redis.Channel: Channel}
    ours = overrides.get(owner)
    if ours is not None and name in vars(ours):  # an override takes kombu's parameters, or passes all on
        params = inspect.signature(getattr(ours, name)).parameters
        kinds = {param.kind for param in params.values()}
        passes_on = {inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD} <= kinds
        assert passes_on or list(params) == list(inspect.signature(getattr(owner, name)).parameters)
    assert Transport.Channel is Channel and Channel.QoS is RetryingQoS
    assert (
        kombu_redis.Transport.brpop_timeout == BRPOP_TIMEOUT_S
    )  # kombu's default, which consuming.py waits on


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


def test_messages_a_closing_channel_could_not_put_back_are_put_back_by_the_next(
    full_redis: EmbeddedRedis, caplog: pytest.LogCaptureFixture
) -> None:
    """A channel closing on a full Redis cannot move what it holds back to its list (kombu's
    restore, a transaction, is refused): the messages stay in the unacked hash, the channel closes
    without waiting or failing, and the process's next channel puts them back once it consumes,
    instead of leaving them to the visibility timeout."""
    admin = redis.Redis.from_url(full_redis.url, decode_responses=True)
    queue = Queue(QUEUE, routing_key=QUEUE)
    received: list[Message] = []
    with Connection(full_redis.url, transport=Transport) as connection:
        consumer = connection.Consumer(
            queue, callbacks=[lambda _, message: received.append(message)], no_ack=False
        )
        with consumer:
            connection.Producer().publish({"job": 1}, routing_key=QUEUE, declare=[queue])
            connection.drain_events(timeout=10)
            admin.config_set("maxmemory", "1")
            with caplog.at_level(logging.WARNING, logger="genq.worker"):
                connection.default_channel.close()
    admin.config_set("maxmemory", "0")
    tag = received[0].delivery_tag
    assert "broker_restore_deferred" in [r.getMessage() for r in caplog.records]
    assert (
        admin.hexists(keys.KOMBU_UNACKED, tag) and admin.llen(QUEUE) == 0
    )  # held by no one, nowhere to take
    with (
        Connection(full_redis.url, transport=Transport) as connection,
        connection.Consumer(queue, callbacks=[lambda _, message: received.append(message)], no_ack=False),
    ):
        connection.drain_events(timeout=10)
        assert [m.payload for m in received] == [{"job": 1}, {"job": 1}]
        received[-1].ack()
    assert not admin.hexists(keys.KOMBU_UNACKED, tag) and admin.llen(QUEUE) == 0
    admin.close()
