"""Waiting for the job behind a completion that does not stream."""

from __future__ import annotations

import asyncio
import time

from fastapi import Request

from api.jobs.queue import JobQueue
from shared.schemas import JobView

#: One JobQueue.wait round (it is also capped by Settings.max_wait_s); between rounds the
#: request checks that its client is still there.
WAIT_ROUND_S = 10.0
#: Rounds are paced to at least this long, so a max_wait_s of 0 does not spin.
MIN_ROUND_S = 1.0


def round_s(max_wait_s: float) -> float:
    """How long one JobQueue.wait round of a completion lasts."""
    return min(WAIT_ROUND_S, max_wait_s) if max_wait_s > 0 else WAIT_ROUND_S


async def wait_for_job(
    queue: JobQueue, job: JobView, owner: str, request: Request, max_wait_s: float
) -> JobView:
    """The job once terminal, from `job` as a first round left it (JobQueue.submit_and_wait's, which
    reads no job back that it just queued). Waits in rounds past max_wait_s: a job is bounded by
    job_timeout_s queued and again running, so this ends. A client that left between rounds
    cancels the job."""
    while not job["status"].is_terminal():
        if await request.is_disconnected():
            return await queue.cancel(job["id"], owner)
        started = time.monotonic()
        job = await queue.wait(job["id"], owner, round_s(max_wait_s))
        if not job["status"].is_terminal():
            await asyncio.sleep(max(0.0, MIN_ROUND_S - (time.monotonic() - started)))
    return job
