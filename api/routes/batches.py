"""/v1/batches: OpenAI's Batch API over genq's queue (docs/batches.md). Errors leave in OpenAI's
shape, like the completion routes. One route is genq's own: GET /v1/batches/{id}/events, the
batch's progress as Server-Sent Events."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Annotated, Any

import orjson
from fastapi import APIRouter, Query, Request, Response
from fastapi.responses import StreamingResponse

from api.batches.service import BatchCreate, Batches
from api.edge.concurrency import Slot
from api.edge.pipeline import CallerDep, ReadLimit, SubmitLimit
from api.edge.responses import json_response
from api.openai.errors import OPENAI_ERRORS, OpenAIRoute
from api.routes.deps import QueueDep
from api.routes.stream import held_stream

router = APIRouter(prefix="/v1/batches", tags=["batches"], route_class=OpenAIRoute)


def _batches(request: Request) -> Batches:
    batches: Batches = request.app.state.batches
    return batches


@router.post("", responses=OPENAI_ERRORS, dependencies=[SubmitLimit])
async def create_batch(request: Request, body: BatchCreate, owner: CallerDep) -> Response:
    """Create a batch from an uploaded input file; it starts `validating`."""
    await request.app.state.rate_limiter.charge(owner, "batch")  # its validation reads the whole file
    return json_response(await _batches(request).create(body, owner))


@router.get("", responses=OPENAI_ERRORS, dependencies=[ReadLimit])
async def list_batches(
    request: Request,
    owner: CallerDep,
    after: Annotated[str | None, Query(max_length=64)] = None,
    limit: Annotated[int, Query(ge=1, le=100)] = 20,
) -> Response:
    """The caller's batches, newest first."""
    return json_response(await _batches(request).page(owner, after, limit))


@router.get("/{batch_id}", responses=OPENAI_ERRORS, dependencies=[ReadLimit])
async def get_batch(request: Request, batch_id: str, owner: CallerDep) -> Response:
    """One batch, with its request_counts and files."""
    return json_response(await _batches(request).get(batch_id, owner))


@router.post("/{batch_id}/cancel", responses=OPENAI_ERRORS, dependencies=[SubmitLimit])
async def cancel_batch(request: Request, batch_id: str, owner: CallerDep) -> Response:
    """Cancel: `cancelling` now, `cancelled` once its lines in flight stopped (their results kept)."""
    return json_response(await _batches(request).cancel(batch_id, owner))


_SSE_DOC: dict[int | str, dict[str, object]] = {
    200: {"content": {"text/event-stream": {}}, "description": "`batch` events until the batch ends."}
}


async def _progress_frames(updates: AsyncIterator[dict[str, Any] | None], slot: Slot) -> AsyncIterator[bytes]:
    with slot:
        async for batch in updates:
            yield b": ping\n\n" if batch is None else b"event: batch\ndata: " + orjson.dumps(batch) + b"\n\n"


@router.get(
    "/{batch_id}/events",
    response_class=StreamingResponse,
    responses=OPENAI_ERRORS | _SSE_DOC,
    dependencies=[ReadLimit],
)
async def batch_events(
    request: Request, batch_id: str, owner: CallerDep, queue: QueueDep
) -> StreamingResponse:
    """The batch's progress as Server-Sent Events: a `batch` event (the batch, as GET returns it)
    now and at each change of its status, counts or files; the stream ends after the event that
    shows it ended. (genq's own: OpenAI's clients poll GET /v1/batches/{id}.)"""
    batches = _batches(request)
    await batches.get(batch_id, owner)  # unknown or someone else's: a 404 before the stream starts
    slot = queue.hold(owner, "streams")
    return held_stream(_progress_frames(batches.progress(batch_id, owner), slot), slot, {})
