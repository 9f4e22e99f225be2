"""Stopping this process's Celery consumer from any thread, through Celery's remote control.

A worker whose engine died hands its jobs back to the queue; were its consumer still taking
messages, with a task thread free it took the very job it had just handed back, and that job then
waited in the dead worker's unacknowledged messages until the reaper freed it. The consumer runs
on Celery's event loop, which no other thread may touch: a `cancel_consumer` broadcast to this
worker alone is the public way to reach it, and its answer says the event loop has the cancel.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from celery import Celery

from shared.logging import fields
from workers.broker import BRPOP_TIMEOUT_S

log = logging.getLogger("genq.worker")

#: Seconds to wait for the consumer's answer to a cancel.
CANCEL_REPLY_S = 2.0
#: Added to BRPOP_TIMEOUT_S: the read of a BRPOP's answer on the event loop.
READ_MARGIN_S = 0.25


def consumer_stopper(app: Celery, nodename: str, queues: list[str]) -> Callable[[], None]:
    """A call that makes the worker `nodename` of `app` stop consuming `queues` and returns once
    it took its last message from them."""

    def stop() -> None:
        for queue in queues:
            answers = app.control.cancel_consumer(
                queue, destination=[nodename], reply=True, timeout=CANCEL_REPLY_S
            )
            if not answers:
                log.warning("consumer_cancel_unanswered", extra=fields(queue=queue))
        # A BRPOP the consumer sent before the cancel may still pop a message, for up to its
        # timeout; kombu puts one that comes for a canceled queue back on it. Wait that out, so a
        # message pushed after this returns is left to the other workers.
        time.sleep(BRPOP_TIMEOUT_S + READ_MARGIN_S)
        log.info("consumer_stopped", extra=fields(queues=queues))

    return stop
