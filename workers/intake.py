"""The next job of a task thread whose job ended, without a broker delivery of its own.

A queued message is taken at once when one waits: WorkerJobs.take pops it and claims its job in
one script, so no message is ever out of the list without its job claimed. Otherwise the thread
waits on the lists itself (BRPOP, up to worker_take_wait_s) and claims the job of the message it
gets: a job that arrives while the thread is free then costs no delivery either, which is what a
worker whose clients keep no backlog needs. That wait is the one step in two: a worker that died
between the BRPOP and the claim leaves the job queued with its message nowhere, and the reaper
pushes it again (ORPHAN_CHECK_S, then ORPHAN_RECHECK_S), as it does when kombu's own BRPOP and
unacked record are split by a death.
"""

from __future__ import annotations

import logging
import threading

import redis

from shared import keys
from shared.jobqueue.kombu_layout import task_of
from shared.logging import fields
from workers.jobs import ClaimedJob, ClaimOutcome, NextTake, WorkerJobs

log = logging.getLogger("genq.worker")


class Intake:
    def __init__(
        self,
        jobs: WorkerJobs,
        client: redis.Redis,
        worker_id: str,
        queue_lists: list[str],
        wait_s: float,
        closing: threading.Event,
    ) -> None:
        self._jobs = jobs
        self._redis = client
        self._worker_id = worker_id
        #: In the order the worker's BRPOP names them (priority 0 first).
        self._lists = queue_lists
        self._wait_s = wait_s
        self._closing = closing

    def next_take(self) -> NextTake:
        """A take to send with the finish of the thread's job (WorkerJobs.finish `then`), for
        next_job() to use."""
        return NextTake(self._worker_id, self._lists)

    def next_job(self, sent: NextTake | None = None) -> ClaimedJob | None:
        """The next queued job, claimed for this worker: one waiting now, else the first to come
        within wait_s; None when none came, the worker is closing, or a message is not a job's
        (it stays where it was, for Celery's delivery). `sent`: the take that went with the
        thread's last finish; the job it claimed comes back even when closing (the worker holds
        it), and when it found none, the thread goes straight to its wait."""
        if sent is not None and sent.done and (sent.taken is not None or self._wait_s <= 0):
            return sent.taken
        while not self._closing.is_set():
            if sent is None or not sent.done:  # else it looked already, in the finish's round trip
                taken = self._jobs.take(self._worker_id, self._lists, sent.labels if sent else None)
                if taken is not None or self._wait_s <= 0:
                    return taken
            sent = None
            popped = self._redis.brpop(self._lists, timeout=self._wait_s)
            if popped is None:
                return None
            claimed, go_on = self._claim(*popped)
            if claimed is not None or not go_on:
                return claimed
        return None

    def _claim(self, queue_list: str, message: str) -> tuple[ClaimedJob | None, bool]:
        """Claim the job of a message this thread popped: (the job, whether to go on). A message
        this thread must not run goes back to the end BRPOP pops, next in line again."""
        job_id = _generation_job(message)
        if job_id is None or self._closing.is_set():
            self._redis.rpush(queue_list, message)
            return None, False
        claim = self._jobs.claim(job_id, self._worker_id)
        if claim.outcome is ClaimOutcome.CLAIMED:
            return (job_id, claim.record), True
        log.info("job_skipped", extra=fields(job_id=job_id, outcome=claim.outcome.value, status=claim.status))
        return None, True


def _generation_job(message: str) -> str | None:
    """The job id of a generation task's message; None for anything else."""
    task = task_of(message)
    return task[1] if task is not None and task[0] == keys.GENERATE_TASK else None
