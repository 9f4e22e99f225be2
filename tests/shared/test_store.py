"""Job records as both tiers read them (shared/store.py): the views the API returns."""

from __future__ import annotations

from shared.schemas import JobStatus
from shared.store import job_summary, public_job

RECORD = {
    "id": "j1", "owner": "key-a", "status": "succeeded", "model": "placeholder-echo",
    "input": '{"prompt":"hi"}', "output": '{"text":"hi"}', "metadata": '{"team":"a"}',
    "created_at": "1700000000.0", "started_at": "1700000000.25", "completed_at": "1700000001.0",
    "cached": "0", "preview": "hi",
}  # fmt: skip


def test_a_job_view_carries_times_as_rfc3339_and_its_queue_time() -> None:
    job = public_job(RECORD)
    assert job["status"] is JobStatus.SUCCEEDED
    assert (job["created_at"], job["started_at"]) == ("2023-11-14T22:13:20.000Z", "2023-11-14T22:13:20.250Z")
    assert job["metrics"]["queue_ms"] == 250.0
    assert job["output"] == {"text": "hi"} and job["metadata"] == {"team": "a"}
    assert job["urls"]["cancel"] == "/v1/jobs/j1/cancel"


def test_a_summary_has_the_preview_and_never_the_input_or_output() -> None:
    summary = job_summary(RECORD)
    assert summary["preview"] == "hi"
    assert "input" not in summary and "output" not in summary
