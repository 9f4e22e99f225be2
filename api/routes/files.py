"""/v1/files: OpenAI's Files API for batch input and output files, scoped to the caller's key.

An upload's multipart body is read by the route itself, after its caller is authenticated and
rate-limited (the CallerDep is solved before the endpoint runs, and the endpoint declares no form
parameters for FastAPI to read first), and streamed from the request to the file storage as it
arrives, its bytes counted on the way (api/batches/upload.py): no byte is read for a caller who
is refused, no temporary file is written, and a chunked body is capped like a declared one.
Errors leave in OpenAI's shape, like the completion routes.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Query, Request, Response
from fastapi.responses import StreamingResponse
from starlette.requests import ClientDisconnect

from api.batches.files import Files
from api.batches.service import Batches
from api.batches.upload import UploadForm
from api.edge.limits import MULTIPART_OVERHEAD
from api.edge.pipeline import CallerDep, ReadLimit, SubmitLimit
from api.edge.responses import json_response
from api.openai.errors import OPENAI_ERRORS, OpenAIRoute
from shared.errors import MalformedRequest
from shared.files import public_file

router = APIRouter(prefix="/v1/files", tags=["files"], route_class=OpenAIRoute)

#: An upload may also be too large (413) or, on an API without keys, lack Authorization (415).
FILE_ERRORS = OPENAI_ERRORS | {413: OPENAI_ERRORS[400], 415: OPENAI_ERRORS[400]}
#: A file a batch still reads cannot be deleted.
DELETE_ERRORS = OPENAI_ERRORS | {409: OPENAI_ERRORS[400]}


def _files(request: Request) -> Files:
    files: Files = request.app.state.files
    return files


#: The upload's body as the OpenAPI document describes it (the route reads it itself).
UPLOAD_BODY: dict[str, Any] = {
    "requestBody": {
        "required": True,
        "content": {
            "multipart/form-data": {
                "schema": {
                    "type": "object",
                    "required": ["file", "purpose"],
                    "properties": {
                        "file": {"type": "string", "format": "binary",
                                 "description": "The JSONL file of batch requests (named *.jsonl)."},
                        "purpose": {"type": "string", "enum": ["batch"]},
                    },
                }
            }
        },
    }
}  # fmt: skip


@router.post("", responses=FILE_ERRORS, dependencies=[SubmitLimit], openapi_extra=UPLOAD_BODY)
async def upload_file(request: Request, owner: CallerDep) -> Response:
    """Upload a JSONL file of batch requests (`purpose=batch`)."""
    await request.app.state.rate_limiter.charge(owner, "upload")  # before a byte of the body
    files = _files(request)
    body_max = files.max_bytes + MULTIPART_OVERHEAD
    form = UploadForm(request.headers.get("content-type"), _body(request), body_max)
    return json_response(await files.upload_form(owner, form))


async def _body(request: Request) -> AsyncIterator[bytes]:
    """The request's body as it arrives; a client gone mid-upload is a refusal (what it sent
    is removed), not a bug."""
    try:
        async for chunk in request.stream():
            yield chunk
    except ClientDisconnect:
        raise MalformedRequest("the client went away before the upload's body ended", param="file") from None


@router.get("", responses=OPENAI_ERRORS, dependencies=[ReadLimit])
async def list_files(
    request: Request,
    owner: CallerDep,
    purpose: str | None = None,
    after: Annotated[str | None, Query(max_length=64)] = None,
    limit: Annotated[int, Query(ge=1, le=10_000)] = 10_000,
    order: Literal["asc", "desc"] = "desc",
) -> Response:
    """The caller's files, newest first unless `order=asc`."""
    found, more = await _files(request).records.page(owner, after, limit, purpose, order == "desc")
    data = [public_file(record) for record in found]
    first, last = (data[0]["id"], data[-1]["id"]) if data else (None, None)
    return json_response({"object": "list", "data": data, "first_id": first, "last_id": last,
                          "has_more": more})  # fmt: skip


@router.get("/{file_id}", responses=OPENAI_ERRORS, dependencies=[ReadLimit])
async def get_file(request: Request, file_id: str, owner: CallerDep) -> Response:
    """One file's record."""
    return json_response(public_file(await _files(request).get(file_id, owner)))


@router.get("/{file_id}/content", responses=OPENAI_ERRORS, dependencies=[ReadLimit])
async def file_content(request: Request, file_id: str, owner: CallerDep) -> Response:
    """The file's bytes, streamed from storage."""
    chunks = await _files(request).content(file_id, owner)
    return StreamingResponse(chunks, media_type="application/octet-stream")


@router.delete("/{file_id}", responses=DELETE_ERRORS, dependencies=[ReadLimit])
async def delete_file(request: Request, file_id: str, owner: CallerDep) -> Response:
    """Delete the file's record and content (409 while a batch not yet ended reads it)."""
    files = _files(request)
    await files.get(file_id, owner)  # 404 before anything else
    batches: Batches = request.app.state.batches
    await batches.check_unused(file_id)
    return json_response(await files.delete(file_id, owner))
