"""What a webhook delivery sends: its URL, its body (the event and the job or batch as the API shows
it) and whose secret signs it. Built once and frozen (workers/webhooks/delivery.py): a job's `completed` by
the worker that ends the job (completed_body, called from workers/jobs.py's finish), any other at
its delivery's first attempt. Kept apart from the delivery machinery so the job store's worker side
imports only this (no HTTP client)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import orjson

from shared import keys
from shared.batches import public_batch
from shared.jobqueue.records import public_job, rfc3339
from shared.schemas import JobStatus, WebhookEvent

#: The job record's field that holds its `completed` delivery's message until the job ends.
COMPLETED_MESSAGE_FIELD = keys.webhook_message_field(WebhookEvent.COMPLETED)

EVENT_TYPES = {"start": "job.start", "output": "job.output", "completed": "job.completed"}


@dataclass(frozen=True, slots=True)
class WebhookPayload:
    """What a delivery sends, fixed before its first attempt so every retry sends the same bytes."""

    url: str
    body: bytes
    #: The job's owner: whose secret signs it (shared/key_secrets.py).
    owner: str


def job_event(event: str, record: dict[str, str]) -> WebhookPayload | None:
    """The url, body and owner of a job's `event`, the job as `record` holds it, built now; None
    when there is nothing to send (the record expired, or an `output` notice of a job already
    over: its `completed` delivery carries the final state)."""
    if not record:
        return None
    if event == WebhookEvent.OUTPUT and JobStatus(record["status"]).is_terminal():
        return None
    job = public_job(record)
    return WebhookPayload(
        str(job["input"]["webhook"]), _body(EVENT_TYPES[event], job), record.get("owner", "")
    )


def completed_body(record: dict[str, str], fields: dict[str, str | bytes]) -> WebhookPayload | None:
    """The `completed` delivery of a job ending with `fields`, built by the worker that ends it
    from the record it claimed (the finish script stores it beside the delivery's message), or None
    when the job has no `completed` webhook. The claimed record and `fields` are every field the
    job's public view reads: nothing else writes them while the worker holds the job."""
    if not record.get(COMPLETED_MESSAGE_FIELD):
        return None
    ended = {
        **record,
        **{name: value.decode() if isinstance(value, bytes) else value for name, value in fields.items()},
    }
    return job_event(WebhookEvent.COMPLETED, ended)


def batch_event(event: str, record: dict[str, str]) -> WebhookPayload | None:
    """The url, body and owner of a batch's `event` (its data: the batch as GET /v1/batches/{id})."""
    if not record or not record.get("webhook_url"):
        return None
    return WebhookPayload(record["webhook_url"], _body(event, public_batch(record)), record["owner"])


def _body(event_type: str, data: Any) -> bytes:
    return orjson.dumps({"type": event_type, "timestamp": rfc3339(time.time()), "data": data})
