"""workers/webhooks/bodies.py: what a delivery sends, built from records shaped as the API writes
them (api/jobs/store.py NewJob.record). A `completed` body built by the worker that ends a job is
the ended job exactly as GET /v1/jobs/{id} shows it; nothing is built for a job without that
webhook, for an expired record, for an `output` notice of a job already over, or for a batch
without a webhook. (Stored by the finish script: tests/shared/jobqueue/test_job_scripts.py; received over
HTTP: tests/workers/webhooks/test_tasks.py.)"""

from __future__ import annotations

import time

import orjson

from api.jobs.store import NewJob
from shared.jobqueue.records import public_job
from workers.webhooks.bodies import batch_event, completed_body, job_event

HOOK = "http://127.0.0.1:9/hook"


def _record(*events: str) -> dict[str, str]:
    """A job as submitted with a webhook whose filter holds `events`, then claimed."""
    now = time.time()
    job_input = {"prompt": "hi", "webhook": HOOK, "webhook_events_filter": list(events)}
    job = NewJob(job_id="j1", owner="key-a", model="placeholder-echo", queue="q",
                 input_json=orjson.dumps(job_input), metadata_json=b"{}", created_at=now, deadline=now + 60,
                 webhook_messages=tuple((event, b"message") for event in events))  # fmt: skip
    return {**job.record, "status": "running", "started_at": repr(now)}


def test_a_completed_body_is_the_ended_job_as_the_api_shows_it() -> None:
    claimed = _record("completed")
    fields: dict[str, str | bytes] = {
        "status": "succeeded",
        "output": b'{"text":"x"}',
        "completed_at": "12.5",
    }
    payload = completed_body(claimed, fields)
    assert payload is not None and (payload.url, payload.owner) == (HOOK, "key-a")
    body = orjson.loads(payload.body)
    ended = {**claimed, "status": "succeeded", "output": '{"text":"x"}', "completed_at": "12.5"}
    assert body["type"] == "job.completed" and body["timestamp"].endswith("Z")
    assert body["data"] == orjson.loads(orjson.dumps(public_job(ended)))


def test_nothing_is_built_for_a_job_without_a_completed_webhook() -> None:
    assert completed_body(_record("start"), {"status": "succeeded"}) is None


def test_nothing_is_built_for_an_expired_record_or_an_output_notice_of_an_ended_job() -> None:
    assert job_event("start", {}) is None
    assert job_event("output", {**_record("output"), "status": "succeeded"}) is None
    live = job_event("output", _record("output"))
    assert live is not None and orjson.loads(live.body)["type"] == "job.output"


def test_a_batch_event_needs_the_batchs_webhook() -> None:
    record = {"id": "b1", "endpoint": "/v1/chat/completions", "input_file_id": "f1", "owner": "key-a",
              "completion_window": "24h", "status": "completed", "created_at": "1"}  # fmt: skip
    assert batch_event("batch.completed", record) is None
    payload = batch_event("batch.completed", {**record, "webhook_url": HOOK})
    assert payload is not None and orjson.loads(payload.body)["data"]["id"] == "b1"
