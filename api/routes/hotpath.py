"""Raw-ASGI dispatch of the requests a busy API serves most: `POST /v1/jobs`, `GET /v1/jobs/{id}`
(with or without `?wait=N`) and `GET /v1/jobs/{id}/stream`, ahead of FastAPI's middleware stack
and router.

Why: for these small requests FastAPI's routing, dependency solving and validation cost more CPU
than the work itself.

What it does: a request of exactly the common shape is answered through the same code the
FastAPI routes run (`serve()` in api/edge/pipeline.py around `accept_job`, `read_job` or the
stream route's `open_stream`, inside the same `HttpMetrics`). Anything else (another path, query
or method, a chunked, over-long or non-JSON body, one that does not validate) goes on untouched
to FastAPI, so every parse-dependent error and /openapi.json stay FastAPI's;
tests/api/edge/test_hotpath.py checks both ways answer alike. `check()` refuses to start an app
whose hot routes depend on anything, or whose stack holds middleware, this path does not run.
`GENQ_API_HOT_PATHS=0` turns it off."""

from __future__ import annotations

import itertools
import re
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import pydantic
from fastapi import APIRouter, Response
from fastapi.dependencies.models import Dependant
from starlette.types import ASGIApp, Receive, Scope, Send

from api.edge.asgi import read_body, replay
from api.edge.pipeline import Caller, PipelineRoute, Work, dependants, serve
from api.routes import jobs, stream
from api.routes.jobs import HEADER_MAX, JOB_ID_MAX, accept_job, get_job, read_job, submit_job
from api.routes.stream import EVENT_ID_MAX, open_stream, stream_job
from shared.schemas import JobCreate

if TYPE_CHECKING:
    from fastapi import FastAPI

JSON_TYPES = (b"application/json", b"application/json; charset=utf-8")

#: The one query string the hot path serves: a long-poll's wait in plain decimal seconds.
WAIT_QUERY = re.compile(rb"wait=(\d{1,6}(?:\.\d{1,6})?)")


class HotPaths:
    """The API's ASGI entry point when hot paths are on: these requests here, the rest to
    `fallback` (FastAPI's own middleware stack and router)."""

    def __init__(self, app: FastAPI, fallback: ASGIApp, max_body_bytes: int) -> None:
        self.app = app
        self.fallback = fallback
        self.max_body_bytes = max_body_bytes
        self.submit_route, self.read_route = _route_of(submit_job), _route_of(get_job)
        self.stream_route = _route_of(stream_job, stream.router)
        self.jobs_path = self.submit_route.path
        self.job_prefix = self.read_route.path.split("{", 1)[0]
        self.stream_suffix = self.stream_route.path.split("}", 1)[1]

    def check(self) -> None:
        """Fail at start-up when the hot routes or the app carry something the hot path does
        not do: a dependency or middleware added there would silently miss almost all traffic."""
        for route in (self.submit_route, self.read_route, self.stream_route):
            unknown = dependencies_of(route.dependant) - KNOWN_DEPENDENCIES
            if unknown:
                raise HotPathMismatch(f"{route.path}: the hot path does not run {sorted(unknown)}")
        middleware = {m.cls.__name__ for m in self.app.user_middleware} - KNOWN_MIDDLEWARE  # type: ignore[attr-defined]
        if middleware:
            raise HotPathMismatch(f"the hot path does not run the middleware {sorted(middleware)}")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            path: str = scope["path"]
            method: str = scope["method"]
            query: bytes = scope["query_string"]
            if method == "POST" and path == self.jobs_path and not query:
                await self._submit(scope, receive, send)
                return
            wait = WAIT_QUERY.fullmatch(query) if query else None
            if method == "GET" and path.startswith(self.job_prefix) and (wait or not query):
                job_id = path[len(self.job_prefix) :]
                if not query and job_id.endswith(self.stream_suffix):
                    job_id = job_id[: -len(self.stream_suffix)]
                    if _is_job_id(job_id) and await self._stream(scope, receive, send, job_id):
                        return
                elif _is_job_id(job_id):
                    await self._get(scope, send, job_id, float(wait[1]) if wait else None)
                    return
        await self.fallback(scope, receive, send)

    async def _submit(self, scope: Scope, receive: Receive, send: Send) -> None:
        headers = _headers(scope)
        length = headers.get(b"content-length")
        if length is None or not length.isdigit() or int(length) > self.max_body_bytes:
            await self.fallback(scope, receive, send)  # chunked or too large: BodySizeLimit's
            return
        body = await read_body(receive) or b""
        create = _parse(headers, body)
        idempotency_key = headers.get(b"idempotency-key")
        prefer = headers.get(b"prefer")
        if create is None or _too_long(idempotency_key) or _too_long(prefer):
            await self.fallback(scope, replay(body, receive), send)
            return
        state = self.app.state

        async def work(caller: Caller) -> Response:
            owner = await caller.owner()
            return await accept_job(
                state.queue,
                state.settings,
                state.schema_checker,
                create,
                owner,
                _text(idempotency_key),
                _text(prefer),
            )

        await self._answer(scope, send, headers, self.submit_route, work)

    async def _get(self, scope: Scope, send: Send, job_id: str, wait: float | None) -> None:
        state = self.app.state

        async def work(caller: Caller) -> Response:
            return await read_job(state.queue, state.settings, job_id, await caller.owner(), wait)

        await self._answer(scope, send, _headers(scope), self.read_route, work)

    async def _stream(self, scope: Scope, receive: Receive, send: Send, job_id: str) -> bool:
        """Serve a stream request, or leave it to FastAPI (False) when its Last-Event-ID is one that
        FastAPI refuses itself (an over-long one: 422)."""
        headers = _headers(scope)
        last_event_id = headers.get(b"last-event-id")
        if _too_long(last_event_id, EVENT_ID_MAX):
            return False
        state = self.app.state

        async def work(caller: Caller) -> Response:
            return await open_stream(state.queue, job_id, await caller.owner(), _text(last_event_id))

        response = await self._served(scope, headers, self.stream_route, work)
        await response(scope, receive, send)  # EventStream: it also ends the stream if the client leaves
        return True

    async def _answer(
        self, scope: Scope, send: Send, headers: dict[bytes, bytes], route: PipelineRoute, work: Work
    ) -> None:
        """Serve the request as its route would and send the response; the request's metrics and
        its remaining headers are HttpMetrics', which wraps this path."""
        response = await self._served(scope, headers, route, work)
        start = {
            "type": "http.response.start",
            "status": response.status_code,
            "headers": response.raw_headers,
        }
        await send(start)
        await send({"type": "http.response.body", "body": response.body})

    async def _served(
        self, scope: Scope, headers: dict[bytes, bytes], route: PipelineRoute, work: Work
    ) -> Response:
        """The response the route would give (api/edge/pipeline.py)."""
        scope["route"] = route  # what HttpMetrics labels the request with, as the router sets it
        authorization = _text(headers.get(b"authorization"))
        return await serve(self.app.state, scope, route.kind, authorization, work, route.renderer)


class HotPathMismatch(RuntimeError):
    """The hot routes or the app changed in a way api/edge/hotpath.py does not mirror."""


#: What the hot routes may depend on: serve() asks for the caller (caller_owner), and the hot
#: path reads the rest from app.state (the schema checker too: accept_job compiles a response
#: format's schema once the caller is known, never while the body is parsed).
KNOWN_DEPENDENCIES = frozenset({"caller_owner", "get_queue", "get_settings", "get_schema_checker"})
#: Middleware the hot path mirrors: the body cap (it reads at most max_body_bytes, else falls
#: back to FastAPI). The request metrics (HttpMetrics) wrap both paths, outside this one.
KNOWN_MIDDLEWARE = frozenset({"BodySizeLimit"})


def dependencies_of(dependant: Dependant) -> set[str]:
    """The names of every function a route depends on, however deep."""
    subs = itertools.islice(dependants(dependant), 1, None)  # the endpoint itself aside
    return {getattr(sub.call, "__name__", repr(sub.call)) for sub in subs if sub.call is not None}


def _route_of(endpoint: Callable[..., Any], router: APIRouter = jobs.router) -> PipelineRoute:
    for route in router.routes:
        if isinstance(route, PipelineRoute) and route.endpoint is endpoint:
            return route
    raise LookupError(f"no route serves {endpoint.__name__}")


def _headers(scope: Scope) -> dict[bytes, bytes]:
    # The first value of a repeated header wins, as in Starlette's Headers.get.
    found: dict[bytes, bytes] = {}
    for name, value in scope["headers"]:
        found.setdefault(name, value)
    return found


def _parse(headers: dict[bytes, bytes], body: bytes) -> JobCreate | None:
    """The body as a JobCreate, or None when it is not plain valid JSON of one (FastAPI then
    decides what to answer: 400, 422, and which field the message names)."""
    content_type = headers.get(b"content-type")
    if content_type is not None and content_type.lower() not in JSON_TYPES:
        return None
    try:
        return JobCreate.model_validate_json(body)
    except pydantic.ValidationError:
        return None


def _is_job_id(text: str) -> bool:
    # What the routes' JobId path parameter takes; anything else is FastAPI's to answer.
    return 0 < len(text) <= JOB_ID_MAX and "/" not in text


def _too_long(value: bytes | None, most: int = HEADER_MAX) -> bool:
    return value is not None and len(value) > most


def _text(value: bytes | None) -> str | None:
    # ASGI header values are bytes in latin-1, as Starlette decodes them.
    return None if value is None else value.decode("latin-1")
