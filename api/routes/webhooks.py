"""/v1/jobs/{id}/webhooks: the delivery log of a job's webhook (every attempt, oldest first)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Response

from api.deps import OwnerDep, QueueDep
from api.ratelimit import ReadLimit
from api.responses import json_response
from api.routes.jobs import JobId
from shared.schemas import ErrorBody

router = APIRouter(prefix="/v1/jobs", tags=["webhooks"])

ERRORS: dict[int | str, dict[str, Any]] = {code: {"model": ErrorBody} for code in (401, 404, 429, 503)}


@router.get("/{job_id}/webhooks", responses=ERRORS, dependencies=[ReadLimit])
async def webhook_deliveries(job_id: JobId, queue: QueueDep, owner: OwnerDep) -> Response:
    """Every webhook delivery attempt of a job: event, attempt, time, status code or error,
    duration and outcome (delivered, retrying, failed, gone, refused)."""
    return json_response({"data": await queue.webhook_log(job_id, owner)})
