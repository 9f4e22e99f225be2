"""Job-store calls from task threads, retried while Redis is unreachable or refuses writes.

A Redis restart, a failover or a full server must neither lose a job or a delivery nor stop a
worker: the call is retried in place (the task keeps its message, unacknowledged) until Redis
takes it, or for STORE_RETRY_S, after which StoreUnavailable tells the task to put its message
back on the queue.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TypeVar

import kombu.exceptions
import redis.exceptions

from shared import metrics
from shared.errors import storage_refusal
from shared.logging import fields

log = logging.getLogger("genq.worker")
T = TypeVar("T")

#: How long a store call is retried before the task hands its message back.
STORE_RETRY_S = 120.0
#: Pause between two tries.
RETRY_PAUSE_S = 0.5


class StoreUnavailable(Exception):
    """Redis did not take the call for STORE_RETRY_S: the message must go back to the queue."""


def retry_store_call(call: Callable[[], T], retry_s: float = STORE_RETRY_S) -> T:
    """`call`'s result, retried while Redis is unreachable or refuses writes; StoreUnavailable
    past `retry_s`. Any other Redis error is raised at once."""
    give_up = time.monotonic() + retry_s
    while True:
        try:
            return call()
        except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError,
                kombu.exceptions.OperationalError) as exc:  # fmt: skip
            reason = f"Redis unreachable: {type(exc).__name__}"
        except redis.exceptions.ResponseError as exc:
            refusal = storage_refusal(exc)
            if refusal is None:
                raise
            metrics.STORAGE_REFUSED.labels("worker").inc()
            reason = refusal.message
        log.warning("store_call_retried", extra=fields(error=reason))
        if time.monotonic() > give_up:
            raise StoreUnavailable(reason)
        time.sleep(RETRY_PAUSE_S)
