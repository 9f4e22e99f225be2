"""Publishes a running job's new text to its Redis Stream without slowing the engine loop.

The engine calls `offer()` from its loop thread (already throttled to a few calls per second
per job); that only records the latest text. A background thread turns it into a delta and
XADDs it. Before a job's final state is written, `flush()` publishes what is pending, so a
stream reader that sees the job terminal can drain the stream and miss nothing.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

import redis
import redis.exceptions

from shared import keys
from shared.logging import fields

log = logging.getLogger("genq.worker")

#: Called after each published delta with the job id (e.g. the `output` webhook).
OutputListener = Callable[[str], None]


class OutputPublisher:
    def __init__(self, client: redis.Redis, ttl_s: int, listener: OutputListener | None = None) -> None:
        self._redis = client
        self._ttl_s = ttl_s
        self._listener = listener
        self._latest: dict[str, tuple[str, int]] = {}
        self._published: dict[str, int] = {}
        self._wake = threading.Condition()
        self._stopped = False
        self._thread = threading.Thread(target=self._loop, name="genq-output", daemon=True)
        self._thread.start()

    def offer(self, job_id: str, text: str, tokens: int) -> None:
        """From the engine thread: the job's whole text so far. Never blocks on Redis."""
        with self._wake:
            self._latest[job_id] = (text, tokens)
            self._wake.notify()

    def flush(self, job_id: str) -> None:
        """Publish what is pending for a job now (from its task thread, before it ends)."""
        with self._wake:
            pending = self._latest.pop(job_id, None)
        if pending is not None:
            self._publish(job_id, *pending)

    def forget(self, job_id: str) -> None:
        with self._wake:
            self._latest.pop(job_id, None)
            self._published.pop(job_id, None)

    def stop(self) -> None:
        with self._wake:
            self._stopped = True
            self._wake.notify()

    def _loop(self) -> None:
        while True:
            with self._wake:
                while not self._latest and not self._stopped:
                    self._wake.wait()
                if self._stopped:
                    return
                batch, self._latest = self._latest, {}
            for job_id, (text, tokens) in batch.items():
                self._publish(job_id, text, tokens)

    def _publish(self, job_id: str, text: str, tokens: int) -> None:
        start = self._published.get(job_id, 0)
        if len(text) <= start:
            return
        self._published[job_id] = len(text)
        stream = keys.job_stream(job_id)
        try:
            pipe = self._redis.pipeline(transaction=False)
            pipe.xadd(stream, {"delta": text[start:], "tokens": tokens}, maxlen=keys.JOB_STREAM_MAXLEN)
            pipe.expire(stream, self._ttl_s)
            pipe.execute()
        except redis.exceptions.RedisError as exc:  # streaming is best effort; the job is not
            log.warning("output_publish_failed", extra=fields(job_id=job_id, error=str(exc)))
            return
        if self._listener is not None:
            self._listener(job_id)
