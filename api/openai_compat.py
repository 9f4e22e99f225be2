"""OpenAI's wire format for genq jobs: the request models, request -> JobCreate, job -> completion
objects and stream chunks, and OpenAI-shaped errors for the routes in api/routes/openai.py.

Penalties, logit_bias (and vLLM's repetition_penalty and min_tokens), logprobs, chat's
top_logprobs, completions' echo and best_of, n and response_format (json_object, json_schema)
are honoured. Fields that configure OpenAI's platform (NO_EFFECT: store, service_tier, ...) are
accepted without effect. Those that would change the answer and are not honoured (echo or best_of
on chat, tools, ...), and any field genq does not know, are refused with 400 naming the field.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import time
from collections.abc import Callable, Coroutine
from datetime import datetime
from typing import Any, Literal

import orjson
import pydantic
import redis.exceptions
from fastapi import Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.routing import APIRoute
from pydantic import BaseModel, ConfigDict, Field
from starlette.exceptions import HTTPException

from api.edge.errors import genq_error_response, validation_error_response
from api.edge.responses import json_response
from api.jobs.follow import FINAL_ID, Output
from api.jobs.queue import JobQueue
from shared import errors
from shared.logging import fields
from shared.schemas import ChatMessage, JobCreate, JobStatus, JobView, Priority

log = logging.getLogger("genq.api")

#: One JobQueue.wait round (it is also capped by Settings.max_wait_s); between rounds the
#: request checks that its client is still there.
WAIT_ROUND_S = 10.0
#: Rounds are paced to at least this long, so a max_wait_s of 0 does not spin.
MIN_ROUND_S = 1.0

#: OpenAI fields genq cannot honour, with the values that ask for nothing (so are accepted).
NEUTRAL_VALUES: dict[str, tuple[Any, ...]] = {
    "best_of": (None, 1),  # chat only: /v1/completions honours it
    "echo": (None, False),  # chat only: /v1/completions honours it
    "top_logprobs": (None, 0),  # completions only: chat honours it
    "suffix": (None, ""),
    "tools": (None, []),
    "functions": (None, []),
    "tool_choice": (None, "none", "auto"),
    "function_call": (None, "none", "auto"),
    "modalities": (None, ["text"]),
    "audio": (None,),
    "prediction": (None,),
}


class Kind(enum.Enum):
    """The two completion flavours: OpenAI's object names and id prefixes."""

    CHAT = ("chat.completion", "chat.completion.chunk", "chatcmpl-", "openai.chat.completions")
    TEXT = ("text_completion", "text_completion", "cmpl-", "openai.completions")

    def __init__(self, obj: str, chunk_obj: str, id_prefix: str, source: str) -> None:
        self.obj = obj
        self.chunk_obj = chunk_obj
        self.id_prefix = id_prefix
        self.source = source


# --- requests ------------------------------------------------------------------------------------


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="allow")

    include_usage: bool | None = False


class TextPart(BaseModel):
    """A content part of a chat message; genq's models read text only."""

    model_config = ConfigDict(extra="allow")

    type: Literal["text"]
    text: str


class OpenAIMessage(BaseModel):
    model_config = ConfigDict(extra="allow")

    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[TextPart] | None = None

    def as_chat_message(self) -> ChatMessage:
        content = (
            self.content if isinstance(self.content, str) else "".join(p.text for p in self.content or [])
        )
        return ChatMessage(role="system" if self.role == "developer" else self.role, content=content)


class OpenAIRequest(BaseModel):
    """The fields both completion endpoints share. Other fields are kept to be checked."""

    model_config = ConfigDict(extra="allow")

    model: str | None = Field(None, min_length=1, max_length=200)
    #: 0 only with completions' echo (scoring the prompt, as lm-evaluation-harness does).
    max_tokens: int | None = Field(None, ge=0)
    max_completion_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    seed: int | None = None
    stop: str | list[str] | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logit_bias: dict[str, float] | None = None
    #: vLLM's extra sampling parameters, honoured the same way.
    repetition_penalty: float | None = None
    min_tokens: int | None = Field(None, ge=0, le=1_000_000)
    n: int | None = Field(None, ge=1, le=16)
    #: Checked (and its schema compiled) by JobCreate: a bad one is a 400 naming response_format.
    response_format: dict[str, Any] | None = None
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    user: str | None = None


class ChatCompletionRequest(OpenAIRequest):
    messages: list[OpenAIMessage] = Field(min_length=1)
    logprobs: bool | None = None
    top_logprobs: int | None = Field(None, ge=0, le=20)


class CompletionRequest(OpenAIRequest):
    prompt: str | list[str]
    logprobs: int | None = Field(None, ge=0, le=5)
    echo: bool | None = None
    best_of: int | None = Field(None, ge=1, le=16)


def shows_logprobs(body: ChatCompletionRequest | CompletionRequest) -> bool:
    """Whether the response carries log-probabilities (chat: `logprobs: true`; text: any number)."""
    return bool(body.logprobs) if isinstance(body, ChatCompletionRequest) else body.logprobs is not None


def echoes(body: ChatCompletionRequest | CompletionRequest) -> bool:
    return isinstance(body, CompletionRequest) and bool(body.echo)


def _logprob_fields(body: ChatCompletionRequest | CompletionRequest) -> dict[str, Any]:
    """The job's logprobs / prompt_logprobs for OpenAI's logprobs, top_logprobs and echo."""
    if isinstance(body, ChatCompletionRequest):
        if body.top_logprobs and not body.logprobs:
            raise errors.InvalidRequest("top_logprobs needs logprobs: true", param="top_logprobs")
        return {"logprobs": body.top_logprobs or 0} if body.logprobs else {}
    fields: dict[str, Any] = {} if body.logprobs is None else {"logprobs": body.logprobs}
    if body.echo:  # the prompt's tokens are scored too (a max_tokens 0 job needs them)
        fields["prompt_logprobs"] = body.logprobs or 0
    elif body.max_tokens == 0:
        raise errors.InvalidRequest(
            "max_tokens 0 generates nothing; it is allowed with echo", param="max_tokens"
        )
    return fields


#: OpenAI fields that configure its platform, not the generation: accepted, without effect.
NO_EFFECT = frozenset({"store", "service_tier", "metadata", "parallel_tool_calls", "safety_identifier",
                       "prompt_cache_key"})  # fmt: skip


def _refuse_unsupported(body: OpenAIRequest) -> None:
    """A field genq cannot honour is a 400 naming it, never silently dropped: an OpenAI field asking
    for something (NEUTRAL_VALUES), or any field genq does not know (as OpenAI's own API does)."""
    for name, value in (body.model_extra or {}).items():
        if name in NEUTRAL_VALUES and value not in NEUTRAL_VALUES[name]:
            raise errors.InvalidRequest(f"{name} is not supported by this server", param=name)
        if name not in NEUTRAL_VALUES and name not in NO_EFFECT:
            raise errors.InvalidRequest(f"{name} is not a field this server knows", param=name)


def _prompt_text(prompt: str | list[str]) -> str:
    if isinstance(prompt, str):
        return prompt
    if len(prompt) != 1:
        raise errors.InvalidRequest(
            "prompt: give one string (batched prompts are not supported)", param="prompt"
        )
    return prompt[0]


#: Logit adjustments passed to the job as given (JobCreate checks their bounds).
_ADJUSTMENTS = ("presence_penalty", "frequency_penalty", "logit_bias", "repetition_penalty", "min_tokens")


def job_create(body: ChatCompletionRequest | CompletionRequest) -> JobCreate:
    """The genq job an OpenAI request asks for (OpenAI's defaults: temperature 1, top_p 1)."""
    _refuse_unsupported(body)
    fields: dict[str, Any] = {
        "model": body.model,
        "max_tokens": body.max_tokens if body.max_completion_tokens is None else body.max_completion_tokens,
        "temperature": 1.0 if body.temperature is None else body.temperature,
        "top_p": 1.0 if body.top_p is None else body.top_p,
        "seed": body.seed,
        "stop": [body.stop] if isinstance(body.stop, str) else body.stop or [],
        "priority": Priority.INTERACTIVE,
        "metadata": {"source": (Kind.CHAT if isinstance(body, ChatCompletionRequest) else Kind.TEXT).source}
        | ({"user": body.user[:512]} if body.user else {}),
    }
    fields |= {name: getattr(body, name) for name in _ADJUSTMENTS if getattr(body, name) is not None}
    fields |= _logprob_fields(body)
    if body.n is not None:
        fields["n"] = body.n
    if body.response_format is not None:
        fields["response_format"] = body.response_format
    if isinstance(body, CompletionRequest) and body.best_of is not None:
        fields["best_of"] = body.best_of
    if isinstance(body, ChatCompletionRequest):
        fields["messages"] = [m.as_chat_message() for m in body.messages]
    else:  # a completion continues its prompt verbatim, as OpenAI's and vLLM's do
        fields["prompt"] = _prompt_text(body.prompt)
        fields["template"] = "none"
    try:
        return JobCreate(**fields)
    except pydantic.ValidationError as exc:
        first = exc.errors()[0]
        param = ".".join(str(p) for p in first.get("loc", ())) or None
        raise errors.InvalidRequest(f"{param}: {first.get('msg', 'invalid value')}", param=param) from exc


# --- waiting -------------------------------------------------------------------------------------


async def wait_for_job(
    queue: JobQueue, job_id: str, owner: str, request: Request, max_wait_s: float
) -> JobView:
    """The job once terminal. Waits in rounds past max_wait_s: a job is bounded by job_timeout_s
    queued and again running, so this ends. A client that left between rounds cancels the job."""
    round_s = min(WAIT_ROUND_S, max_wait_s) if max_wait_s > 0 else WAIT_ROUND_S
    while True:
        started = time.monotonic()
        job = await queue.wait(job_id, owner, round_s)
        if job["status"].is_terminal():
            return job
        if await request.is_disconnected():
            return await queue.cancel(job_id, owner)
        await asyncio.sleep(max(0.0, MIN_ROUND_S - (time.monotonic() - started)))


# --- responses -----------------------------------------------------------------------------------


class JobNotCompleted(errors.GenqError):
    """The job failed (other than the engine refusing the request: a 400) or was canceled:
    answered 500 `server_error`, `code` the job's error type."""

    def __init__(self, job: JobView) -> None:
        self.type, message = failure_of(job)
        super().__init__(message)


def failure_of(job: JobView) -> tuple[str, str]:
    """(type, message) of a job that did not succeed: its error's, else its status."""
    error = job["error"]
    type_ = (error and error["type"]) or job["status"].value
    return type_, (error and error["message"]) or f"the job ended {job['status']}"


def output_of(job: JobView) -> dict[str, Any]:
    """A succeeded job's output (every succeeded job has one)."""
    output = job["output"]
    assert output is not None, f"succeeded job {job['id']} has no output"
    return output


def _created(job: JobView) -> int:
    return int(datetime.fromisoformat(job["created_at"].replace("Z", "+00:00")).timestamp())


def _usage(job: JobView) -> dict[str, int]:
    usage = output_of(job)["usage"]
    prompt, completion_ = int(usage["prompt_tokens"]), int(usage["completion_tokens"])
    return {"prompt_tokens": prompt, "completion_tokens": completion_, "total_tokens": prompt + completion_}


def _envelope(kind: Kind, job: JobView, obj: str) -> dict[str, Any]:
    return {
        "id": kind.id_prefix + job["id"],
        "object": obj,
        "created": _created(job),
        "model": job["model"],
        "system_fingerprint": None,
    }


def completion(kind: Kind, job: JobView, echo: bool = False) -> dict[str, Any]:
    """A finished job as a `chat.completion` or `text_completion` object: one choice per completion
    (n), with logprobs when the job has them; `echo` puts the prompt (and its tokens) first."""
    if job["status"] is not JobStatus.SUCCEEDED:
        refused = job["error"]
        if refused and refused["type"] == "invalid_request":  # the engine refused the request: a 400
            raise errors.InvalidRequest(refused["message"] or "the model refused the request")
        raise JobNotCompleted(job)
    choices = [_choice(kind, job, index, sample, echo) for index, sample in enumerate(samples(job))]
    return _envelope(kind, job, kind.obj) | {"choices": choices, "usage": _usage(job)}


def samples(job: JobView) -> list[dict[str, Any]]:
    """A succeeded job's completions: its choices (n or best_of), else its one output."""
    output = output_of(job)
    return list(output.get("choices") or [output])


def _choice(kind: Kind, job: JobView, index: int, sample: dict[str, Any], echo: bool) -> dict[str, Any]:
    tokens = _scored_tokens(job, sample, echo)
    choice: dict[str, Any] = {"index": index, "logprobs": None, "finish_reason": sample["finish_reason"]}
    if kind is Kind.CHAT:
        choice["message"] = {"role": "assistant", "content": sample["text"], "refusal": None}
        if tokens is not None:
            choice["logprobs"] = {"content": [_chat_logprob(token) for token in tokens], "refusal": None}
    else:
        choice["text"] = (job["input"]["prompt"] if echo else "") + sample["text"]
        if tokens is not None:
            choice["logprobs"] = _text_logprobs(tokens, 0)
    return choice


def _scored_tokens(job: JobView, sample: dict[str, Any], echo: bool) -> list[dict[str, Any]] | None:
    """A completion's token entries to show: its own, after the prompt's when echoing."""
    if sample.get("logprobs") is None:
        return None
    prompt = output_of(job).get("prompt_logprobs") or [] if echo else []
    return [*prompt, *sample["logprobs"]]


def _chat_logprob(token: dict[str, Any]) -> dict[str, Any]:
    """OpenAI's ChatCompletionTokenLogprob."""
    top = [{"token": t["token"], "logprob": t["logprob"], "bytes": list(t["token"].encode())}
           for t in token["top_logprobs"]]  # fmt: skip
    return {"token": token["token"], "logprob": token["logprob"], "bytes": list(token["token"].encode()),
            "top_logprobs": top}  # fmt: skip


def _text_logprobs(tokens: list[dict[str, Any]], offset: int) -> dict[str, Any]:
    """OpenAI's completions Logprobs: parallel lists; text_offset counts from `offset` in the text.
    Each top_logprobs dict also holds the chosen token (so up to logprobs + 1 entries, as OpenAI)."""
    offsets = []
    for token in tokens:
        offsets.append(offset)
        offset += len(token["text"])
    return {
        "tokens": [token["token"] for token in tokens],
        "token_logprobs": [token["logprob"] for token in tokens],
        "top_logprobs": [
            None
            if token["logprob"] is None
            else {t["token"]: t["logprob"] for t in token["top_logprobs"]}
            | {token["token"]: token["logprob"]}
            for token in tokens
        ],
        "text_offset": offsets,
    }


class LiveChunks:
    """A live stream's chunks, per completion (`index`, OpenAI's n): its text deltas as the job
    publishes them, or with logprobs one chunk per token with its entry; once the job ended, what
    the stream has not carried yet, from the finished job (whose entries repeat the streamed ones
    exactly: workers/engine/logprobs.describe_streamed)."""

    def __init__(self, kind: Kind, job: JobView, logprobs: bool, include_usage: bool) -> None:
        self._kind, self._job, self._logprobs, self._include_usage = kind, job, logprobs, include_usage
        self._texts: dict[int, str] = {}
        self._tokens: dict[int, int] = {}

    def add(self, output: Output) -> list[dict[str, Any]]:
        """The chunks of one stream entry (none for the text a stream lacked: rest() sends it)."""
        if output.id == FINAL_ID:
            return []
        if self._logprobs:
            return [self._token(output.index, entry) for entry in output.logprobs or []]
        return [self._text(output.index, output.delta)] if output.delta else []

    def rest(self, job: JobView) -> list[dict[str, Any]]:
        """A succeeded job's chunks the stream has not sent yet."""
        chunks: list[dict[str, Any]] = []
        for index, sample in enumerate(samples(job)):
            if self._logprobs:
                entries = (sample.get("logprobs") or [])[self._tokens.get(index, 0) :]
                chunks.extend(self._token(index, entry) for entry in entries)
                continue
            sent, text = self._texts.get(index, ""), sample["text"]
            if text.startswith(sent) and len(text) > len(sent):  # else the job's text is the authority
                chunks.append(self._text(index, text[len(sent) :]))
        return chunks

    def _token(self, index: int, entry: dict[str, Any]) -> dict[str, Any]:
        sent = self._texts.get(index, "")
        self._texts[index] = sent + entry["text"]
        self._tokens[index] = self._tokens.get(index, 0) + 1
        text, usage = entry["text"], self._include_usage
        return _token_chunk(self._kind, self._job, index, text, [entry], len(sent), usage)

    def _text(self, index: int, delta: str) -> dict[str, Any]:
        self._texts[index] = self._texts.get(index, "") + delta
        return chunk(self._kind, self._job, delta, None, self._include_usage, index)


def buffered_chunks(
    kind: Kind, job: JobView, logprobs: bool, echo: bool, include_usage: bool
) -> list[dict[str, Any]]:
    """A succeeded job's stream chunks, sent once it ended (best_of's ranked samples, echo with
    logprobs): per completion (n), its echoed prompt, then one chunk per token with its logprobs,
    or its whole text in one chunk without them."""
    chunks = []
    prompt = job["input"]["prompt"] or ""
    for index, sample in enumerate(samples(job)):
        offset = 0
        if echo:
            scored = output_of(job).get("prompt_logprobs") or [] if logprobs else None
            chunks.append(_token_chunk(kind, job, index, prompt, scored, 0, include_usage))
            offset = len(prompt)
        if not logprobs:
            chunks.append(_token_chunk(kind, job, index, sample["text"], None, offset, include_usage))
            continue
        for token in sample["logprobs"]:
            chunks.append(_token_chunk(kind, job, index, token["text"], [token], offset, include_usage))
            offset += len(token["text"])
    return chunks


def _token_chunk(
    kind: Kind,
    job: JobView,
    index: int,
    text: str,
    tokens: list[dict[str, Any]] | None,
    offset: int,
    include_usage: bool,
) -> dict[str, Any]:
    body = chunk(kind, job, text, None, include_usage, index)
    if tokens is not None:
        body["choices"][0]["logprobs"] = (
            {"content": [_chat_logprob(token) for token in tokens], "refusal": None}
            if kind is Kind.CHAT
            else _text_logprobs(tokens, offset)
        )
    return body


def chunk(
    kind: Kind,
    job: JobView,
    delta: str | None,
    finish_reason: str | None,
    include_usage: bool,
    index: int = 0,
) -> dict[str, Any]:
    """One stream chunk of choice `index`: the assistant role (chat, delta None), a text delta, or
    the finish."""
    choice: dict[str, Any] = {"index": index, "logprobs": None, "finish_reason": finish_reason}
    if kind is Kind.CHAT:
        choice["delta"] = {"role": "assistant", "content": ""} if delta is None else {"content": delta}
        if finish_reason is not None:
            choice["delta"] = {}
    else:
        choice["text"] = delta or ""
    body = _envelope(kind, job, kind.chunk_obj) | {"choices": [choice]}
    return body | {"usage": None} if include_usage else body


def usage_chunk(kind: Kind, job: JobView) -> dict[str, Any]:
    """The last chunk when stream_options.include_usage: no choices, the usage."""
    return _envelope(kind, job, kind.chunk_obj) | {"choices": [], "usage": _usage(job)}


# --- errors --------------------------------------------------------------------------------------

_TYPE_OF_STATUS = {401: "invalid_request_error", 429: "rate_limit_error"}
_CODE_OF_STATUS = {401: "invalid_api_key", 429: "rate_limit_exceeded"}


def openai_error(
    status: int, message: str, param: str | None, code: str | None, headers: dict[str, str] | None = None
) -> Response:
    kind = _TYPE_OF_STATUS.get(status, "server_error" if status >= 500 else "invalid_request_error")
    body = {"error": {"message": message, "type": kind, "param": param, "code": code}}
    return json_response(body, status, headers)


def _from_genq(response: Response) -> Response:
    """genq's error response for the same failure, in OpenAI's shape and statuses."""
    detail = orjson.loads(bytes(response.body))["error"]
    status, param = response.status_code, detail.get("param")
    code = _CODE_OF_STATUS.get(status, detail["type"])
    if status == 422 and param == "model":
        status, code = 404, "model_not_found"
    headers = {k: v for k, v in response.headers.items() if k not in ("content-length", "content-type")}
    return openai_error(400 if status == 422 else status, detail["message"], param, code, headers)


def translate(exc: Exception) -> Response | None:
    """The OpenAI-shaped response for an exception raised in an OpenAI route; None: not ours."""
    if isinstance(exc, errors.GenqError):
        return _from_genq(genq_error_response(exc))
    if isinstance(exc, RequestValidationError):
        return _from_genq(validation_error_response(exc))
    if isinstance(exc, redis.exceptions.ConnectionError | redis.exceptions.TimeoutError):
        log.warning("redis_unavailable", extra=fields(error=type(exc).__name__))
        return _from_genq(
            genq_error_response(errors.Unavailable("the job store is unreachable; retry shortly"))
        )
    if isinstance(exc, HTTPException):
        status = 400 if exc.status_code == 422 else exc.status_code
        return openai_error(status, str(exc.detail), None, None, dict(exc.headers or {}))
    return None


class OpenAIRoute(APIRoute):
    """An APIRoute whose errors leave in OpenAI's shape (this router's routes only)."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def translated(request: Request) -> Response:
            try:
                return await handler(request)
            except Exception as exc:
                response = translate(exc)
                if response is None:
                    raise
                return response

        return translated
