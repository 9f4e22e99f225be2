"""OpenAI-compatible endpoints: /v1/chat/completions, /v1/completions and /v1/models.

Each completion is an ordinary genq job: it goes through JobQueue.submit (interactive priority,
the caller's key, and whatever the submit path applies), and the response waits for it. Errors
leave these routes in OpenAI's shape (`{"error": {"message", "type", "param", "code"}}`, with
422 answered as 400 like OpenAI does: api/openai/errors.py's OpenAIRoute); the rest of the API
keeps genq's shape.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import anyio
import orjson
import redis.exceptions
from fastapi import APIRouter, Request, Response

from api.edge.concurrency import Slot
from api.edge.pipeline import CallerDep, ReadLimit, SubmitLimit
from api.edge.responses import json_response
from api.jobs.follow import Done, Failure, Output, Ping, follow
from api.jobs.queue import JobQueue
from api.jobs.schema_compile import SchemaChecker
from api.openai.chunks import LiveChunks, buffered_chunks, chunk, usage_chunk
from api.openai.errors import OPENAI_ERRORS, OpenAIRoute, openai_error
from api.openai.kind import Kind
from api.openai.requests import ChatCompletionRequest, CompletionRequest, echoes, job_create, shows_logprobs
from api.openai.responses import completion, failure_of, samples
from api.openai.waiting import round_s, wait_for_job
from api.routes.deps import QueueDep, SchemaCheckerDep, SettingsDep
from api.routes.stream import held_stream
from shared.config import Settings
from shared.errors import GenqError
from shared.schemas import JobCreate, JobStatus, JobView

router = APIRouter(prefix="/v1", tags=["openai"], route_class=OpenAIRoute)


#: A completion answers JSON, or with `stream: true` Server-Sent Events.
_COMPLETION_OK: dict[int | str, dict[str, Any]] = {
    200: {
        "description": "The completion (JSON), or its chunks as Server-Sent Events with `stream: true`.",
        "content": {"application/json": {}, "text/event-stream": {}},
    }
}
COMPLETION_RESPONSES = _COMPLETION_OK | OPENAI_ERRORS

#: `created` of every model in /v1/models: when this API process started.
STARTED_AT = int(time.time())


def _model_object(model: str) -> dict[str, Any]:
    return {"id": model, "object": "model", "created": STARTED_AT, "owned_by": "genq"}


@router.get("/models", responses=OPENAI_ERRORS, dependencies=[ReadLimit])
async def list_models(settings: SettingsDep, _: CallerDep) -> Response:
    """The models this deployment serves."""
    return json_response({"object": "list", "data": [_model_object(m) for m in settings.served_models]})


@router.get("/models/{model}", responses=OPENAI_ERRORS, dependencies=[ReadLimit])
async def get_model(model: str, settings: SettingsDep, _: CallerDep) -> Response:
    """One served model."""
    if model not in settings.served_models:
        return openai_error(404, f"the model {model!r} does not exist", "model", "model_not_found")
    return json_response(_model_object(model))


@router.post("/chat/completions", responses=COMPLETION_RESPONSES, dependencies=[SubmitLimit])
async def chat_completions(
    body: ChatCompletionRequest,
    request: Request,
    queue: QueueDep,
    owner: CallerDep,
    settings: SettingsDep,
    schemas: SchemaCheckerDep,
) -> Response:
    """Create a chat completion (a genq job on `messages`); `stream: true` answers with SSE chunks."""
    return await _complete(Kind.CHAT, body, request, queue, owner, settings, schemas)


@router.post("/completions", responses=COMPLETION_RESPONSES, dependencies=[SubmitLimit])
async def completions(
    body: CompletionRequest,
    request: Request,
    queue: QueueDep,
    owner: CallerDep,
    settings: SettingsDep,
    schemas: SchemaCheckerDep,
) -> Response:
    """Create a text completion (a genq job on `prompt`); `stream: true` answers with SSE chunks."""
    return await _complete(Kind.TEXT, body, request, queue, owner, settings, schemas)


async def _complete(
    kind: Kind,
    body: ChatCompletionRequest | CompletionRequest,
    request: Request,
    queue: JobQueue,
    owner: str,
    settings: Settings,
    schemas: SchemaChecker,
) -> Response:
    # The held slot is taken before the job is submitted: a caller over its limit changes nothing.
    if not body.stream:
        with queue.hold(owner, "long_polls"):
            first = await queue.submit_and_wait(
                await _checked(body, schemas, owner), owner, None, round_s(settings.max_wait_s), charged=True
            )
            job = await wait_for_job(queue, first.job, owner, request, settings.max_wait_s)
        return json_response(completion(kind, job, echoes(body)), headers=_job_header(job))
    slot = queue.hold(owner, "streams")
    try:
        job = (
            await queue.submit(
                await _checked(body, schemas, owner), owner, idempotency_key=None, charged=True
            )
        ).job
    except BaseException:
        slot.release()
        raise
    include_usage = bool(body.stream_options and body.stream_options.include_usage)
    ranked = isinstance(body, CompletionRequest) and (body.best_of or 1) > (body.n or 1)
    shown = Shown(shows_logprobs(body), echoes(body), include_usage, body.n or 1, ranked)
    return held_stream(_stream(kind, job, queue, owner, shown, slot), slot, _job_header(job))


async def _checked(
    body: ChatCompletionRequest | CompletionRequest, schemas: SchemaChecker, owner: str
) -> JobCreate:
    """The job the request asks for, its response format's schema compiled (the caller is known)."""
    create = job_create(body)
    await schemas.check(create.response_format, owner)
    return create


def _job_header(job: JobView) -> dict[str, str]:
    return {"X-Genq-Job-Id": job["id"]}  # the job behind the completion: GET /v1/jobs/{id}


@dataclass(frozen=True, slots=True)
class Shown:
    """What a stream shows besides the text deltas."""

    logprobs: bool
    echo: bool
    include_usage: bool
    #: Completions (OpenAI's n).
    n: int
    #: best_of > n: which samples are returned is known once all have ended.
    ranked: bool

    @property
    def buffered(self) -> bool:
        """Chunks come from the finished job: ranked samples, or an echoed prompt with its logprobs
        (scored at prefill, but stored with the job's result only)."""
        return self.ranked or (self.echo and self.logprobs)


async def _stream(
    kind: Kind, job: JobView, queue: JobQueue, owner: str, shown: Shown, slot: Slot
) -> AsyncIterator[bytes]:
    """The job as OpenAI chunks, live per completion (with logprobs, per token); a client that goes
    away cancels the job (nobody will read it)."""
    ended, include_usage = False, shown.include_usage
    live = LiveChunks(kind, job, shown.logprobs, include_usage)
    try:
        for frame in _opening(kind, job, shown):
            yield frame
        async for event in follow(queue, job["id"], owner):
            match event:
                case Output() if not shown.buffered:
                    for body in live.add(event):
                        yield _data(body)
                case Ping():
                    yield b": ping\n\n"
                case Done(job=final):
                    ended = True
                    for frame in _rest(kind, final, shown, live) + _closing(kind, final, include_usage):
                        yield frame
                case Failure(type=failure, message=message):
                    ended = True
                    yield _data(_error_payload(message, failure))
        yield b"data: [DONE]\n\n"
    finally:
        slot.release()
        if not ended:
            await _cancel_quietly(queue, job["id"], owner)


def _opening(kind: Kind, job: JobView, shown: Shown) -> list[bytes]:
    """Chat's assistant-role chunk per choice; a completion's echoed prompt per choice (at once,
    unless buffered)."""
    roles = range(shown.n) if kind is Kind.CHAT else range(0)
    frames = [_data(chunk(kind, job, None, None, shown.include_usage, index)) for index in roles]
    if shown.echo and not shown.buffered:
        prompt = job["input"]["prompt"]
        frames += [_data(chunk(kind, job, prompt, None, shown.include_usage, i)) for i in range(shown.n)]
    return frames


def _rest(kind: Kind, job: JobView, shown: Shown, live: LiveChunks) -> list[bytes]:
    """A succeeded job's chunks not streamed live: all of them when buffered."""
    if job["status"] is not JobStatus.SUCCEEDED:
        return []
    if shown.buffered:
        chunks = buffered_chunks(kind, job, shown.logprobs, shown.echo, shown.include_usage)
    else:
        chunks = live.rest(job)
    return [_data(body) for body in chunks]


async def _cancel_quietly(queue: JobQueue, job_id: str, owner: str) -> None:
    """Cancel from a stream being closed (shielded: the request's scope is already cancelled)."""
    with anyio.CancelScope(shield=True), contextlib.suppress(GenqError, redis.exceptions.RedisError):
        await queue.cancel(job_id, owner)


def _closing(kind: Kind, job: JobView, include_usage: bool) -> list[bytes]:
    """The chunk with finish_reason (and the usage chunk), or an error for a job that did not
    succeed."""
    if job["status"] is not JobStatus.SUCCEEDED:
        code, message = failure_of(job)
        return [_data(_error_payload(message, code))]
    frames = [
        _data(chunk(kind, job, None, sample["finish_reason"], include_usage, index))
        for index, sample in enumerate(samples(job))
    ]
    if include_usage:
        frames.append(_data(usage_chunk(kind, job)))
    return frames


def _error_payload(message: str, code: str) -> dict[str, Any]:
    return {"error": {"message": message, "type": "server_error", "param": None, "code": code}}


def _data(payload: dict[str, Any]) -> bytes:
    return b"data: " + orjson.dumps(payload) + b"\n\n"
