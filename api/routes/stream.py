"""GET /v1/jobs/{id}/stream: one job's output as Server-Sent Events.

`output` events (`id`: the stream entry id, `data`: `{"delta", "tokens"}`) carry new text;
exactly one `done` event (`data`: the job, as GET returns it) or one `error` event
(`data`: `{"error": {"type", "message", "param"}}`) ends the stream. `: ping` comments keep
idle connections open. Reconnect with `Last-Event-ID` to resume after the last event seen.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Annotated

import orjson
from fastapi import APIRouter, Header
from fastapi.responses import StreamingResponse
from starlette.background import BackgroundTask

from api.edge.concurrency import Slot
from api.edge.pipeline import CallerDep, PipelineRoute, ReadLimit
from api.jobs.follow import FINAL_ID, Done, Failure, Output, Ping, StreamEvent, Watched, follow, watched
from api.jobs.queue import JobQueue
from api.jobs.streams import START_ID, is_entry_id
from api.routes.deps import QueueDep
from api.routes.jobs import ERRORS, JobId
from shared.errors import InvalidRequest
from shared.schemas import error_body

router = APIRouter(prefix="/v1/jobs", tags=["jobs"], route_class=PipelineRoute)

#: The longest Last-Event-ID accepted (FastAPI answers a longer one 422).
EVENT_ID_MAX = 64

#: Headers that keep proxies (nginx) and caches from buffering or storing the stream.
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}

_SSE_DOC: dict[int | str, dict[str, object]] = {
    200: {"content": {"text/event-stream": {}}, "description": "`output` events, then `done` or `error`."}
}


def _resume_after(last_event_id: str | None) -> str:
    if not last_event_id:
        return START_ID
    if last_event_id != FINAL_ID and not is_entry_id(last_event_id):
        raise InvalidRequest("Last-Event-ID is not an event id this stream sent", param="Last-Event-ID")
    return last_event_id


def sse_frame(event: StreamEvent) -> bytes:
    """One event in the text/event-stream format."""
    match event:
        case Output(id=entry_id, delta=delta, tokens=tokens):
            data = orjson.dumps({"delta": delta, "tokens": tokens})
            return b"id: " + entry_id.encode() + b"\nevent: output\ndata: " + data + b"\n\n"
        case Done(job=job):
            return b"event: done\ndata: " + orjson.dumps(job) + b"\n\n"
        case Failure(type=kind, message=message):
            return b"event: error\ndata: " + orjson.dumps(error_body(kind, message)) + b"\n\n"
        case Ping():
            return b": ping\n\n"


async def _frames(events: AsyncIterator[StreamEvent], slot: Slot) -> AsyncIterator[bytes]:
    with slot:
        async for event in events:
            # This endpoint shows one text, the job's output.text: its first completion's. (Entries
            # of the others, and ones carrying only log-probabilities, are for the OpenAI routes.)
            if isinstance(event, Output) and (event.index or not event.delta):
                continue
            yield sse_frame(event)


def held_stream(
    frames: AsyncIterator[bytes], slot: Slot, headers: dict[str, str], watching: Watched | None = None
) -> StreamingResponse:
    """An SSE response that gives its stream slot back, and unregisters the follower's wake-ups
    it was opened with, however it ends (the body's own `finally` does not run when a client
    leaves before the first byte: the background task then does)."""
    return StreamingResponse(
        frames,
        media_type="text/event-stream",
        headers=SSE_HEADERS | headers,
        # An async callable: Starlette runs a plain function on its thread pool, a thread hop per stream.
        background=BackgroundTask(_release, slot, watching),
    )


async def _release(slot: Slot, watching: Watched | None) -> None:
    slot.release()
    if watching is not None:
        watching.close()


@router.get(
    "/{job_id}/stream",
    response_class=StreamingResponse,
    responses=ERRORS | _SSE_DOC,
    dependencies=[ReadLimit],
)
async def stream_job(
    job_id: JobId,
    queue: QueueDep,
    owner: CallerDep,
    last_event_id: Annotated[str | None, Header(max_length=EVENT_ID_MAX)] = None,
) -> StreamingResponse:
    """The job's output as Server-Sent Events: what was generated so far, then live deltas, then
    `done` with the final job. `Last-Event-ID` resumes after that event."""
    return await open_stream(queue, job_id, owner, last_event_id)


async def open_stream(
    queue: JobQueue, job_id: str, owner: str, last_event_id: str | None
) -> StreamingResponse:
    """The stream's response (the route's work, and the hot path's: api/routes/hotpath.py)."""
    after_id = _resume_after(last_event_id)
    # Unknown or someone else's: a 404 before the stream starts. The stream starts from this read
    # (one read of the record and the stream, not one here and more in follow()).
    watching = await watched(queue, job_id, owner, after_id)
    try:
        slot = queue.hold(owner, "streams")
    except BaseException:
        watching.close()
        raise
    events = follow(queue, job_id, owner, after_id, watching)
    return held_stream(_frames(events, slot), slot, {}, watching)
