"""Wakes long-pollers: one pub/sub subscription per API process, fanned out to local waiters.

Workers publish a job id on JOB_EVENTS_CHANNEL when the job ends; each waiting request holds an
asyncio.Event here. Waiters also re-read the record at least every `recheck_s`, so a message
lost while the subscription was reconnecting delays an answer by at most that, never forever.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterator

import redis.asyncio as aioredis
import redis.exceptions

from shared import keys
from shared.logging import fields

log = logging.getLogger("genq.api")


class JobEvents:
    def __init__(self, client: aioredis.Redis) -> None:
        self._redis = client
        self._waiters: dict[str, set[asyncio.Event]] = {}
        self._task: asyncio.Task[None] | None = None
        #: Set by stop(): the task ends at its next turn even if redis-py lost the cancel.
        self._stopping = False

    def start(self) -> None:
        self._task = asyncio.create_task(self._listen_forever(), name="genq-job-events")

    async def stop(self) -> None:
        self._stopping = True
        if self._task is not None:
            self._task.cancel()
            # Bounded: a cancel that lands mid-subscribe can leave redis-py's pubsub close waiting
            # on a reply that never comes; the client's pool is closed right after anyway.
            await asyncio.wait({self._task}, timeout=1.0)

    @contextlib.contextmanager
    def watch(self, job_id: str, event: asyncio.Event | None = None) -> Iterator[asyncio.Event]:
        """Within the block, `event` (a new one when not given) is set when the job may have ended."""
        event = event or asyncio.Event()
        self._waiters.setdefault(job_id, set()).add(event)
        try:
            yield event
        finally:
            waiting = self._waiters.get(job_id)
            if waiting is not None:
                waiting.discard(event)
                if not waiting:
                    del self._waiters[job_id]

    def _wake(self, job_id: str) -> None:
        for event in self._waiters.get(job_id, ()):
            event.set()

    def _wake_all(self) -> None:
        for job_id in list(self._waiters):
            self._wake(job_id)

    async def _listen_forever(self) -> None:
        # Not `while True`: see StreamHub._listen_forever (api/jobs/stream_hub.py).
        while not self._stopping:
            try:
                await self._listen()
            except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError, OSError) as exc:
                if self._stopping:
                    return
                log.warning("job_events_reconnect", extra=fields(error=type(exc).__name__))
                self._wake_all()  # anything may have finished while we were away
                await asyncio.sleep(0.5)
            except Exception:  # anything else (a message it cannot read) must not end the listener
                log.exception("job_events_failed")
                self._wake_all()
                await asyncio.sleep(0.5)

    async def _listen(self) -> None:
        pubsub = self._redis.pubsub(ignore_subscribe_messages=True)
        try:
            await pubsub.subscribe(keys.JOB_EVENTS_CHANNEL)
            self._wake_all()
            while not self._stopping:
                message = await pubsub.get_message(timeout=5.0)
                if message is not None:
                    data = message["data"]
                    self._wake(data.decode() if isinstance(data, bytes) else str(data))
        finally:
            await asyncio.shield(pubsub.aclose())  # type: ignore[no-untyped-call]


async def set_within(event: asyncio.Event, timeout_s: float) -> None:
    """Return once `event` is set or `timeout_s` passed, whichever comes first. Through
    asyncio.timeout rather than wait_for: Python 3.11's wait_for runs the wait as a task of its
    own, made and cancelled each time, and every held stream and long-poll waits like this
    (py-spy of an API holding 10,000 idle streams: the largest item)."""
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(max(timeout_s, 0.0)):
            await event.wait()
