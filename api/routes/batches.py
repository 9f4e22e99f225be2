"""/v1/batches: OpenAI's Batch API over genq's queue (docs/batches.md). Errors leave in OpenAI's
shape, like the completion routes."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Request, Response

from api.batches import BatchCreate, Batches
from api.deps import OwnerDep
from api.openai_compat import OpenAIRoute
from api.ratelimit import ReadLimit, SubmitLimit
from api.responses import json_response
from api.routes.openai import OPENAI_ERRORS

router = APIRouter(prefix="/v1/batches", tags=["batches"], route_class=OpenAIRoute)


def _batches(request: Request) -> Batches:
    batches: Batches = request.app.state.batches
    return batches


@router.post("", responses=OPENAI_ERRORS, dependencies=[SubmitLimit])
async def create_batch(request: Request, body: BatchCreate, owner: OwnerDep) -> Response:
    """Create a batch from an uploaded input file; it starts `validating`."""
    return json_response(await _batches(request).create(body, owner))


@router.get("", responses=OPENAI_ERRORS, dependencies=[ReadLimit])
async def list_batches(
    request: Request,
    owner: OwnerDep,
    after: Annotated[str | None, Query(max_length=64)] = None,
    limit: Annotated[int, Query(ge=1, le=100)] = 20,
) -> Response:
    """The caller's batches, newest first."""
    return json_response(await _batches(request).page(owner, after, limit))


@router.get("/{batch_id}", responses=OPENAI_ERRORS, dependencies=[ReadLimit])
async def get_batch(request: Request, batch_id: str, owner: OwnerDep) -> Response:
    """One batch, with its request_counts and files."""
    return json_response(await _batches(request).get(batch_id, owner))


@router.post("/{batch_id}/cancel", responses=OPENAI_ERRORS, dependencies=[SubmitLimit])
async def cancel_batch(request: Request, batch_id: str, owner: OwnerDep) -> Response:
    """Cancel: `cancelling` now, `cancelled` once its lines in flight stopped (their results kept)."""
    return json_response(await _batches(request).cancel(batch_id, owner))
