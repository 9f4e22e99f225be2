"""Wakes long-pollers: one pub/sub subscription per API process, fanned out to local waiters.

Workers publish a job id on JOB_EVENTS_CHANNEL when the job ends; each waiting request holds an
asyncio.Event here. Waiters also re-read the record at least every `recheck_s`, so a message
lost while the subscription was reconnecting delays an answer by at most that, never forever.
What it shares with the stream hub is in api/jobs/notifications.py.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator

from api.jobs.notifications import JobNotifications
from shared import keys


class JobEvents(JobNotifications):
    name = "job_events"
    channel = keys.JOB_EVENTS_CHANNEL

    @contextlib.contextmanager
    def watch(self, job_id: str, event: asyncio.Event | None = None) -> Iterator[asyncio.Event]:
        """Within the block, `event` (a new one when not given) is set when the job may have ended."""
        event = event or asyncio.Event()
        with self._registered(job_id, event):
            yield event


async def set_within(event: asyncio.Event, timeout_s: float) -> None:
    """Return once `event` is set or `timeout_s` passed, whichever comes first. Through
    asyncio.timeout rather than wait_for: Python 3.11's wait_for runs the wait as a task of its
    own, made and cancelled each time, and every held stream and long-poll waits like this
    (py-spy of an API holding 10,000 idle streams: the largest item)."""
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(max(timeout_s, 0.0)):
            await event.wait()
