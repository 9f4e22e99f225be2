"""kombu's Redis transport, retrying while the store refuses writes or restarts: the one module that
overrides kombu's transport (Celery's `broker_transport`, set in workers/worker.py).

When a worker takes a message, kombu moves it from the queue list into its unacknowledged hash in
two steps: a pop, then a MULTI that records it. With Redis at maxmemory (`noeviction`), or
read-only during a failover, the pop succeeds and the record is refused; stock kombu raises, and
Celery takes that as an unrecoverable error: the worker stops consuming for good. Here the
record is retried until the store takes it, holding the message in memory meanwhile (the worker
can do nothing useful while the store refuses writes anyway); so are the acknowledgement and the
rejection of a message (each a MULTI, which a full Redis refuses whole) and the queue bindings
that a reconnecting consumer writes. Were the worker killed while it holds a message so, the
message is in no list and no hash: the reaper's orphan check pushes it again
(shared/jobqueue/lua/reap_orphan.lua).

Why overrides and no public option: kombu's retry options (`retry_on_timeout`, Celery's
`broker_connection_retry`, the transport's `health_check_interval`, `socket_keepalive`, all set in
shared/celery_app.py) retry a lost connection, never a command Redis answered with an error; an
OOM or READONLY reply is a ResponseError, which kombu passes up and Celery's consumer treats as
fatal, and no Celery signal runs before that. So the QoS's append, ack, reject, restore_visible and
restore_unacked, and the Channel's _queue_bind and _connparams, are wrapped here (each calls
kombu's own and only adds the retry or the error's class), and _create_client keeps one client per
pool (kombu builds one per acknowledgement). tests/workers/test_broker.py pins their names and
signatures against the pinned kombu: a kombu that renames or reshapes one fails there.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

import redis.exceptions
from kombu.transport import redis as kombu_redis
from kombu.transport import virtual

from shared import metrics
from shared.errors import storage_refusal
from shared.logging import fields

log = logging.getLogger("genq.worker")

T = TypeVar("T")

#: Seconds between two tries to record a taken message while the store refuses writes.
RETRY_S = 0.5
#: Longest a consumer's BRPOP waits (kombu's default): a consumer that stops consuming may still
#: take a message this long after (workers/consuming.py).
BRPOP_TIMEOUT_S = 1


#: Delivery tags of messages a closing channel could not put back on their queue (Redis was gone:
#: a restart). The next channel of this process puts them back once it consumes, instead of
#: leaving them in the unacked hash until the visibility timeout (30 min by default).
_left_behind: set[str] = set()
_left_behind_lock = threading.Lock()


def while_refused(call: Callable[[], T], event: str) -> T:
    """call(), retried every RETRY_S while the store refuses writes (logged once as `event`)."""
    warned = False
    while True:
        try:
            return call()
        except redis.exceptions.ResponseError as exc:
            refusal = storage_refusal(exc)
            if refusal is None:
                raise
            if not warned:  # once per call: the store's refusal is logged elsewhere too
                log.warning(event, extra=fields(error=refusal.message))
                warned = True
            metrics.STORAGE_REFUSED.labels("broker").inc()
            time.sleep(RETRY_S)


class RetryingQoS(kombu_redis.QoS):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[no-untyped-call]
        #: Delivery tags of the messages this channel holds (recorded, not yet settled): what a
        #: closing channel that cannot put them back leaves to the next (kept here, not read
        #: from kombu's own bookkeeping).
        self.held: set[str] = set()

    def append(self, message: Any, delivery_tag: str) -> None:
        append = super().append
        while_refused(lambda: append(message, delivery_tag), "broker_record_refused")  # type: ignore[no-untyped-call]
        self.held.add(delivery_tag)

    def ack(self, delivery_tag: str) -> None:
        # kombu acknowledges with a MULTI (ZREM and HDEL), and Redis refuses every command queued
        # in a MULTI at maxmemory: on Celery's event loop that was an "Unrecoverable error" and the
        # worker exited, its job done. Removing a message twice is harmless: wait for the store.
        ack = super().ack
        while_refused(lambda: ack(delivery_tag), "broker_ack_refused")  # type: ignore[no-untyped-call]
        self.held.discard(delivery_tag)

    def reject(self, delivery_tag: str, requeue: bool = False) -> None:
        # A requeue moves the message from the unacked hash to its list in one transaction, a
        # drop removes it: both refused at maxmemory, as the ack is, and as safe to retry.
        reject = super().reject
        while_refused(lambda: reject(delivery_tag, requeue=requeue), "broker_reject_refused")  # type: ignore[no-untyped-call]
        self.held.discard(delivery_tag)

    def restore_visible(self, *args: Any, **kwargs: Any) -> None:
        # kombu's periodic sweep of messages past the visibility timeout takes a Redis lock first
        # (a write): at maxmemory that raised, and Celery took it as unrecoverable (seen in the
        # chaos soak). The sweep is periodic: skip this one, the next will do it.
        try:
            super().restore_visible(*args, **kwargs)  # type: ignore[no-untyped-call]
        except redis.exceptions.ResponseError as exc:
            if storage_refusal(exc) is None:
                raise
            metrics.STORAGE_REFUSED.labels("broker").inc()

    def restore_unacked(self, client: Any = None) -> None:
        tags = list(self.held)
        try:
            super().restore_unacked(client)  # type: ignore[no-untyped-call]
            self.held.clear()
        except redis.exceptions.ConnectionError:
            self._leave_behind(tags)
            raise
        except redis.exceptions.ResponseError as exc:
            # A closing channel puts back what it holds; a full store refuses that, and waiting
            # here would hold the worker's exit for as long as the store stays full. The messages
            # stay in the unacked hash: the next channel of this process puts them back, or, once
            # it exited, kombu's sweep past the visibility timeout does.
            if storage_refusal(exc) is None:
                raise
            self._leave_behind(tags)

    def _leave_behind(self, tags: list[str]) -> None:
        with _left_behind_lock:
            _left_behind.update(tags)
        for tag in tags:
            # kombu's base QoS.ack settles its own bookkeeping only (the Redis one's also deletes
            # the unacked entry, which the next channel restores): kombu then counts none of
            # these as held, and its restore at shutdown, which runs once, finds none left.
            virtual.QoS.ack(self, tag)  # type: ignore[no-untyped-call]
        self.held.clear()
        log.warning("broker_restore_deferred", extra=fields(messages=len(tags)))


class Channel(kombu_redis.Channel):
    QoS = RetryingQoS

    def _create_client(self, asynchronous: bool = False) -> Any:
        """One client per pool, reused: kombu builds a new redis.Redis for every acknowledgement
        and every record of a taken message (each build copies ~200 response callbacks), which
        was about a tenth of a worker's CPU per job (py-spy under bench/machinery.py). The
        client only wraps the pool; a new pool (after a reconnect) gets a new client."""
        pool = self.async_pool if asynchronous else self.pool
        cached = self._reused_clients.get(asynchronous)
        if cached is not None and cached.connection_pool is pool:
            return cached
        client = super()._create_client(asynchronous)  # type: ignore[no-untyped-call]
        self._reused_clients[asynchronous] = client
        return client

    @property
    def _reused_clients(self) -> dict[bool, Any]:
        return self.__dict__.setdefault("_genq_clients", {})  # type: ignore[no-any-return]

    def _connparams(self, asynchronous: bool = False) -> dict[str, Any]:
        # After Redis drops the connection, Celery closes the channel, and closing restores the
        # unacknowledged messages through a connection whose `client` kombu already cleared: an
        # AttributeError there is "unrecoverable" and stopped the worker for good (seen in the
        # chaos soak on a Redis restart). As a connection error it is what it is: Celery ignores
        # it while closing and reconnects; the messages stay unacked until the visibility timeout.
        if self.connection is None or self.connection.client is None:
            raise redis.exceptions.ConnectionError("the broker connection is closed")
        params: dict[str, Any] = super()._connparams(asynchronous=asynchronous)  # type: ignore[no-untyped-call]
        return params

    def _queue_bind(self, exchange: str, routing_key: str, pattern: str, queue: str) -> None:
        # A consumer that reconnects (after a Redis restart, say) declares its queues again, which
        # writes kombu's binding set: at maxmemory stock kombu raised, and Celery took it as
        # unrecoverable, so the worker exited (seen twice in the chaos soak). The write is
        # idempotent: wait until the store takes it.
        bind = super()._queue_bind
        while_refused(lambda: bind(exchange, routing_key, pattern, queue), "broker_bind_refused")  # type: ignore[no-untyped-call]

    def basic_consume(self, *args: Any, **kwargs: Any) -> Any:
        consumer_tag = super().basic_consume(*args, **kwargs)  # type: ignore[no-untyped-call]
        self._restore_left_behind()
        return consumer_tag

    def _restore_left_behind(self) -> None:
        """Put back on their queues the messages a previous channel of this process held when
        Redis went away (restore_by_tag moves each from the unacked hash to its list, once)."""
        with _left_behind_lock:
            tags = list(_left_behind)
            _left_behind.clear()
        for index, tag in enumerate(tags):
            try:
                self.qos.restore_by_tag(tag)
            except redis.exceptions.RedisError:
                with _left_behind_lock:
                    _left_behind.update(tags[index:])
                return
        if tags:
            log.info("broker_restored_after_reconnect", extra=fields(messages=len(tags)))


class Transport(kombu_redis.Transport):
    """Set as the worker app's `broker_transport` (workers/worker.py)."""

    Channel = Channel
    brpop_timeout = BRPOP_TIMEOUT_S
