"""/v1/jobs/{id}/webhooks: the delivery log of a job's webhook (every attempt, oldest first);
/v1/webhook-secret: the caller's own signing secret (shared/key_secrets.py)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Response
from pydantic import BaseModel

from api.edge.pipeline import CallerDep, PipelineRoute, ReadLimit, SubmitLimit
from api.edge.responses import json_response
from api.routes.deps import QueueDep, RedisDep
from api.routes.jobs import JobId
from shared import key_secrets, keys
from shared.schemas import ErrorBody

router = APIRouter(prefix="/v1/jobs", tags=["webhooks"], route_class=PipelineRoute)

ERRORS: dict[int | str, dict[str, Any]] = {code: {"model": ErrorBody} for code in (401, 404, 429, 503)}


@router.get("/{job_id}/webhooks", responses=ERRORS, dependencies=[ReadLimit])
async def webhook_deliveries(job_id: JobId, queue: QueueDep, owner: CallerDep) -> Response:
    """Every webhook delivery attempt of a job: event, attempt, time, status code or error,
    duration and outcome (delivered, retrying, failed, gone, refused)."""
    return json_response({"data": await queue.webhook_log(job_id, owner)})


secret_router = APIRouter(prefix="/v1", tags=["webhooks"], route_class=PipelineRoute)


class WebhookSecret(BaseModel):
    #: `whsec_<base64>`: shown in this answer only. Verify deliveries with it (Standard Webhooks).
    secret: str
    #: Seconds the replaced secret keeps signing alongside this one (null: nothing was replaced).
    previous_valid_for_s: int | None


@secret_router.post(
    "/webhook-secret",
    status_code=201,
    response_model=WebhookSecret,
    responses=ERRORS,
    dependencies=[SubmitLimit],
)
async def rotate_webhook_secret(client: RedisDep, owner: CallerDep) -> Response:
    """Create this key's own webhook signing secret, or rotate it: from now on its jobs' deliveries
    are signed with it (and, for a day, also with the one it replaced). It is shown only here."""
    secret, replaced = await key_secrets.rotate(client, owner)
    grace = keys.WEBHOOK_SECRET_GRACE_S if replaced else None
    return json_response({"secret": secret, "previous_valid_for_s": grace}, 201)
