"""/v1/jobs/{id}/webhooks: the delivery log of a job's webhook (every attempt, oldest first)."""

from __future__ import annotations

from typing import Annotated, Any

import orjson
from fastapi import APIRouter, Path, Response

from api.deps import OwnerDep, QueueDep, RedisDep
from api.responses import json_response
from shared import keys
from shared.schemas import ErrorBody

router = APIRouter(prefix="/v1/jobs", tags=["webhooks"])

#: The newest attempts shown (a long job with `output` events can log many).
MAX_ENTRIES = 1000
ERRORS: dict[int | str, dict[str, Any]] = {code: {"model": ErrorBody} for code in (401, 404, 503)}


@router.get("/{job_id}/webhooks", responses=ERRORS)
async def webhook_deliveries(
    job_id: Annotated[str, Path(max_length=64)], queue: QueueDep, owner: OwnerDep, client: RedisDep
) -> Response:
    """Every webhook delivery attempt of a job: event, attempt, time, status code or error,
    duration and outcome (delivered, retrying, failed, gone, refused)."""
    await queue.get(job_id, owner)  # 404 unless the job exists and is the caller's
    rows = await client.lrange(keys.webhook_log(job_id), -MAX_ENTRIES, -1)
    return json_response({"data": [orjson.loads(row) for row in rows]})
