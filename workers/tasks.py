"""Celery tasks: thin adapters from a broker message to the worker runtime."""

from __future__ import annotations

from celery import shared_task
from celery.exceptions import Reject

from shared import keys
from workers import context
from workers.job_runner import HandBack


@shared_task(name=keys.GENERATE_TASK, acks_late=True, reject_on_worker_lost=True)
def generate(job_id: str) -> None:
    """Run job `job_id`. Its message stays unacknowledged until the job is over, so a worker that
    dies mid-job leaves it for another. A job the store hands back (drain, engine death) gets a
    new message from the store; only when the store cannot be written is this one rejected back
    onto the queue."""
    try:
        context.runtime().run(job_id)
    except HandBack as exc:
        raise Reject(str(exc), requeue=True) from exc
