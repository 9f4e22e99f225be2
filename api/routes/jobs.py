"""/v1/jobs: submit, read (and long-poll), cancel and list jobs."""

from __future__ import annotations

import re
from typing import Annotated, Any

from fastapi import APIRouter, Header, Path, Query, Response

from api.edge.pipeline import CallerDep, PipelineRoute, ReadLimit, SubmitLimit
from api.edge.responses import job_response, json_response
from api.jobs.queue import JobQueue
from api.jobs.schema_compile import SchemaChecker
from api.routes.deps import QueueDep, SchemaCheckerDep, SettingsDep
from shared.config import Settings
from shared.errors import InvalidRequest
from shared.schemas import ErrorBody, JobCreate, JobList, JobPublic, JobStatus

#: Every job route goes through api/edge/pipeline.py's serve(), as the hot path's requests do.
router = APIRouter(prefix="/v1/jobs", tags=["jobs"], route_class=PipelineRoute)

#: Longest job id in a path, and longest Idempotency-Key or Prefer header (longer ones get 422).
JOB_ID_MAX = 64
HEADER_MAX = 255
JobId = Annotated[str, Path(max_length=JOB_ID_MAX)]
#: A list cursor: the decimal score this API returned (ASCII digits only: `str.isdigit()` takes
#: "³", which int() then refuses).
CURSOR_PATTERN = r"^[0-9]{1,20}$"
_PREFER_WAIT = re.compile(r"(?:^|[;,\s])wait=(\d+(?:\.\d+)?)")
ACCEPTED: dict[int | str, dict[str, Any]] = {
    200: {
        "model": JobPublic,
        "description": "An idempotent replay, or a job that ended within `Prefer: wait`.",
    }
}
ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorBody} for code in (400, 401, 403, 404, 409, 413, 415, 422, 429, 503)
}


def _prefer_wait(prefer: str | None) -> float | None:
    match = _PREFER_WAIT.search(prefer or "")
    if match is None:
        return None
    return float(match.group(1))


@router.post(
    "", status_code=202, response_model=JobPublic, responses=ACCEPTED | ERRORS, dependencies=[SubmitLimit]
)
async def submit_job(
    body: JobCreate,
    queue: QueueDep,
    owner: CallerDep,
    settings: SettingsDep,
    schemas: SchemaCheckerDep,
    idempotency_key: Annotated[str | None, Header(max_length=HEADER_MAX)] = None,
    prefer: Annotated[str | None, Header(max_length=HEADER_MAX)] = None,
) -> Response:
    """Accept a generation job. 202 with the queued job; 200 for an idempotent replay or when
    `Prefer: wait=N` saw it finish."""
    return await accept_job(queue, settings, schemas, body, owner, idempotency_key, prefer)


async def accept_job(
    queue: JobQueue,
    settings: Settings,
    schemas: SchemaChecker,
    body: JobCreate,
    owner: str,
    idempotency_key: str | None,
    prefer: str | None,
) -> Response:
    """What `POST /v1/jobs` does once its inputs are parsed and its caller is known: the route
    above and the raw-ASGI hot path (api/routes/hotpath.py) both end here. Its response format's
    schema is compiled only now, for an authenticated caller (api/jobs/schema_compile.py)."""
    await schemas.check(body.response_format, owner)
    wait_s = _prefer_wait(prefer)
    if wait_s is not None and wait_s > settings.max_wait_s:
        raise InvalidRequest(f"Prefer: wait is at most {settings.max_wait_s:g} s", param="Prefer")
    if not wait_s:
        accepted = await queue.submit(body, owner, idempotency_key, charged=True)
    else:
        with queue.hold(owner, "long_polls"):  # refused before anything is submitted
            accepted = await queue.submit_and_wait(body, owner, idempotency_key, wait_s, charged=True)
    job = accepted.job
    finished = job["status"].is_terminal()
    status = 202 if accepted.created and not finished else 200
    return job_response(job, status, {"Location": job["urls"]["get"]})


@router.get("", response_model=JobList, responses=ERRORS, dependencies=[ReadLimit])
async def list_jobs(
    queue: QueueDep,
    owner: CallerDep,
    status: JobStatus | None = None,
    limit: Annotated[int, Query(ge=1, le=100)] = 20,
    cursor: Annotated[str | None, Query(pattern=CURSOR_PATTERN)] = None,
) -> Response:
    """The caller's jobs, newest first."""
    jobs, next_cursor = await queue.list(owner, status, limit, None if cursor is None else int(cursor))
    return json_response({"data": jobs, "next_cursor": next_cursor})


@router.get("/{job_id}", response_model=JobPublic, responses=ERRORS, dependencies=[ReadLimit])
async def get_job(
    job_id: JobId,
    queue: QueueDep,
    owner: CallerDep,
    settings: SettingsDep,
    wait: Annotated[float | None, Query(ge=0)] = None,
) -> Response:
    """A job; with `?wait=N` the answer waits until the job is terminal or N seconds pass."""
    return await read_job(queue, settings, job_id, owner, wait)


async def read_job(
    queue: JobQueue, settings: Settings, job_id: str, owner: str, wait: float | None
) -> Response:
    """What `GET /v1/jobs/{id}` does once its inputs are parsed: the route above and the raw-ASGI
    hot path (api/routes/hotpath.py) both end here."""
    if wait is not None and wait > settings.max_wait_s:
        raise InvalidRequest(f"wait is at most {settings.max_wait_s:g} s", param="wait")
    if not wait:
        return job_response(await queue.get(job_id, owner))
    with queue.hold(owner, "long_polls"):
        return job_response(await queue.wait(job_id, owner, wait))


@router.post("/{job_id}/cancel", response_model=JobPublic, responses=ERRORS, dependencies=[SubmitLimit])
async def cancel_job(job_id: JobId, queue: QueueDep, owner: CallerDep) -> Response:
    """Cancel a job. A queued job never starts; a running one stops at the next step; a finished
    one is returned unchanged."""
    return job_response(await queue.cancel(job_id, owner))
