"""The cancel listener: a daemon thread subscribed to the API's cancel channel, which stops a job
this worker runs as soon as its id is published (the lease check of the next heartbeat would
find it too, later). A Redis outage only pauses it: it subscribes again."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

import redis
import redis.exceptions

from shared import keys

log = logging.getLogger("genq.worker")

#: Seconds between two subscribe attempts while Redis is unreachable.
RESUBSCRIBE_S = 0.5


class CancelListener:
    def __init__(self, client: redis.Redis, stopped: threading.Event, cancel: Callable[[str], None]) -> None:
        self._redis = client
        self._stopped = stopped
        #: Called with each published job id (the runtime stops it when it runs it).
        self._cancel = cancel

    def start(self) -> None:
        threading.Thread(target=self._loop, name="genq-cancels", daemon=True).start()

    def _loop(self) -> None:
        while not self._stopped.is_set():
            try:
                self._listen()
            except redis.exceptions.RedisError:
                time.sleep(RESUBSCRIBE_S)
            except Exception:
                # redis-py's hiredis parser raised a TypeError on a connection Redis had dropped
                # (a killed client): the thread must subscribe again, not end in silence.
                log.warning("cancel_listener_failed", exc_info=True)
                time.sleep(RESUBSCRIBE_S)

    def _listen(self) -> None:
        pubsub = self._redis.pubsub(ignore_subscribe_messages=True)  # type: ignore[no-untyped-call]
        pubsub.subscribe(keys.CANCEL_CHANNEL)
        try:
            while not self._stopped.is_set():
                message = pubsub.get_message(timeout=1.0)
                if message is not None:
                    self._cancel(message["data"])
        finally:
            pubsub.close()
