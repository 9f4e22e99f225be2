"""Job records in Redis as both tiers read them: the codec of what a job's hash holds (its input,
the job's spec, written by the API and read by the worker; its output and metrics, written by the
worker), the views the API returns and webhooks deliver, the errors the claim and reaper scripts
write, and a job's Celery message.

Every move of a job is checked and set inside Redis by one script (shared/jobqueue/lua/): queued ->
running -> terminal, and running -> queued only when a job is handed back (a drain, an engine
death, or a lease that lapsed). A running job carries a lease its worker renews; the reaper
(shared/jobqueue/reaper.py) hands back jobs whose lease lapsed. So a redelivered message never re-runs a
finished job, and a job ends exactly once. The API's side (api/jobs/store.py, asyncio) creates,
reads, cancels and lists; the worker's side (workers/jobs.py, blocking) claims, renews, finishes
and hands back. Both decode records with the functions below.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import orjson

from shared import keys
from shared.jobqueue.kombu_layout import task_message
from shared.jobspec import JobSpec
from shared.schemas import JobCoreView, JobOutput, JobStatus, JobSummaryView, JobView

TIMEOUT_ERROR = orjson.dumps(
    {"type": "timeout", "message": "the job reached its deadline (GENQ_JOB_TIMEOUT_S) before it ran"}
)
#: The error of a job whose worker was lost (its lease lapsed) on each of GENQ_MAX_ATTEMPTS runs.
WORKER_LOST_ERROR = orjson.dumps(
    {
        "type": "worker_lost",
        "message": "the job's worker stopped (crash, kill or hang) on every attempt (GENQ_MAX_ATTEMPTS)",
    }
)


def encode_input(spec: JobSpec) -> bytes:
    """A job's spec as its record's `input` field holds it: JSON of every field, defaults filled in."""
    return spec.model_dump_json().encode()


def decode_input(raw: str | bytes) -> JobSpec:
    """A record's `input` field as the job's spec. An input stored before a field existed reads
    with that field's default; pydantic.ValidationError (naming the field) when it is not one."""
    return JobSpec.model_validate_json(raw)


def succeeded_fields(output: JobOutput, inference_ms: float, batch_size: int) -> dict[str, str | bytes]:
    """The record fields of a succeeded job: its status, output and the worker's metrics."""
    metrics = {"inference_ms": round(inference_ms, 3), "batch_size": batch_size}
    return {
        "status": JobStatus.SUCCEEDED.value,
        "output": orjson.dumps(output),
        "metrics": orjson.dumps(metrics),
    }


def rfc3339(epoch: str | float | None) -> str | None:
    if epoch is None or epoch == "":
        return None
    moment = datetime.fromtimestamp(float(epoch), UTC)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _json_or_none(raw: str | None) -> Any:
    return orjson.loads(raw) if raw else None


def public_job(record: dict[str, str]) -> JobView:
    """The job as the API returns it, from its Redis hash: its core view with input, output and
    metrics."""
    metrics = _json_or_none(record.get("metrics")) or {}
    started = record.get("started_at")
    if started and "queue_ms" not in metrics:
        metrics["queue_ms"] = round((float(started) - float(record["created_at"])) * 1000, 3)
    return {
        **_core(record),
        "input": orjson.loads(record["input"]),
        "output": _json_or_none(record.get("output")),
        "metrics": {
            "queue_ms": metrics.get("queue_ms"),
            "inference_ms": metrics.get("inference_ms"),
            "batch_size": metrics.get("batch_size"),
        },
    }


#: The record fields a job summary is made of (never input or output: they can be MiBs).
SUMMARY_FIELDS = (
    "id", "owner", "status", "model", "model_label", "preview", "error", "created_at", "started_at",
    "completed_at", "cached", "metadata",
)  # fmt: skip


def job_summary(record: dict[str, str]) -> JobSummaryView:
    """A job as lists return it: its core view with the start of its input (no input, output or
    metrics)."""
    return {**_core(record), "preview": record.get("preview") or ""}


def _core(record: dict[str, str]) -> JobCoreView:
    job_id = record["id"]
    url = f"/v1/jobs/{job_id}"
    created_at = rfc3339(record["created_at"])
    assert created_at is not None  # every record is written with one
    return {
        "id": job_id,
        "status": JobStatus(record["status"]),
        "model": record["model"],
        "model_label": record.get("model_label") or None,
        "error": _json_or_none(record.get("error")),
        "created_at": created_at,
        "started_at": rfc3339(record.get("started_at")),
        "completed_at": rfc3339(record.get("completed_at")),
        "cached": record.get("cached") == "1",
        "metadata": orjson.loads(record.get("metadata") or "{}"),
        "urls": {"get": url, "cancel": f"{url}/cancel", "stream": f"{url}/stream"},
    }


def is_terminal(record: dict[str, str]) -> bool:
    return JobStatus(record["status"]).is_terminal()


def as_text(value: bytes | str) -> str:
    """A Redis reply item as text (clients may be built with or without decode_responses)."""
    return value.decode() if isinstance(value, bytes) else value


def flat_record(flat: list[bytes | str]) -> dict[str, str]:
    """A record from a script's flat [field, value, ...] reply."""
    return {as_text(flat[i]): as_text(flat[i + 1]) for i in range(0, len(flat), 2)}


def job_message(job_id: str, queue: str, priority: int) -> tuple[bytes, str]:
    """A fresh Celery message for a job and the list it goes onto (hand-backs and the reaper)."""
    message = task_message(keys.GENERATE_TASK, job_id, [job_id], queue, priority)
    return message, keys.queue_key(queue, priority)


# --- the fleet, as the API reads it (workers write their heartbeats through workers/jobs.py) ----
