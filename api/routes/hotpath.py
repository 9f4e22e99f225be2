"""Raw-ASGI dispatch of the requests a busy API serves most: `POST /v1/jobs`, `GET /v1/jobs/{id}`
(with or without `?wait=N`) and `GET /v1/jobs/{id}/stream`, ahead of FastAPI's router.

Why: for these small requests FastAPI's routing, dependency solving and validation cost more CPU
than the work itself.

What it does: `HotPaths` is a pure ASGI middleware, the innermost of the app's (api/app.py adds it
first), so every other middleware (the body cap, the request metrics, the anonymous guard) runs
for these requests as for any other. A request of exactly the common shape is answered through
the code its FastAPI route runs (`serve()` in api/edge/pipeline.py around `accept_job`,
`read_job` or `open_stream`), its body validated by the route's own model. Anything else
(another path, query or method, a non-JSON body, one that does not validate) goes on untouched
to FastAPI, so every parse-dependent error and /openapi.json stay FastAPI's;
tests/api/routes/test_hotpath.py checks both ways answer alike. `HotRoutes.of()` refuses to
start an app whose hot routes depend on anything this path does not run.
`GENQ_API_HOT_PATHS=0` turns it off."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import pydantic
from fastapi import Response
from starlette.datastructures import State
from starlette.routing import BaseRoute
from starlette.types import ASGIApp, Receive, Scope, Send

from api.edge.asgi import read_body, replay
from api.edge.pipeline import Caller, PipelineRoute, ServedRoute, Work, caller_owner, pipeline_route, serve
from api.routes.deps import get_queue, get_schema_checker, get_settings
from api.routes.jobs import HEADER_MAX, JOB_ID_MAX, accept_job, get_job, read_job, submit_job
from api.routes.stream import EVENT_ID_MAX, open_stream, stream_job
from shared.schemas import JobCreate

JSON_TYPES = (b"application/json", b"application/json; charset=utf-8")

#: The one query string the hot path serves: a long-poll's wait in plain decimal seconds.
WAIT_QUERY = re.compile(rb"wait=(\d{1,6}(?:\.\d{1,6})?)")

#: What the hot routes may depend on: serve() asks for the caller (caller_owner), and the hot
#: path reads the rest from app.state (the schema checker too: accept_job compiles a response
#: format's schema once the caller is known, never while the body is parsed).
KNOWN_DEPENDENCIES: frozenset[Callable[..., Any]] = frozenset(
    {caller_owner, get_queue, get_settings, get_schema_checker}
)


class HotPathMismatch(RuntimeError):
    """The hot routes changed in a way this module does not mirror."""


@dataclass(frozen=True)
class HotRoutes:
    """The routes the hot path answers for, as the app serves them (full paths, every dependency)."""

    submit: ServedRoute
    read: ServedRoute
    stream: ServedRoute

    @classmethod
    def of(cls, routes: Iterable[BaseRoute]) -> HotRoutes:
        """The app's hot routes; HotPathMismatch when one depends on anything the hot path does
        not run: a dependency added there would silently miss almost all traffic."""
        routes = list(routes)
        found = cls(*(pipeline_route(routes, endpoint) for endpoint in (submit_job, get_job, stream_job)))
        for served in (found.submit, found.read, found.stream):
            needs = served.needs()[1:]  # the endpoint itself aside
            unknown = sorted(need.name for need in needs if need.call not in KNOWN_DEPENDENCIES)
            if unknown:
                raise HotPathMismatch(f"{served.path}: the hot path does not run {unknown}")
        return found


class HotPaths:
    """These requests answered here, the rest passed on to `app` (FastAPI's router)."""

    def __init__(self, app: ASGIApp, routes: HotRoutes) -> None:
        self.app = app
        self.routes = routes
        self.jobs_path = routes.submit.path
        self.job_prefix = routes.read.path.split("{", 1)[0]
        self.stream_suffix = routes.stream.path.split("}", 1)[1]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and await self._answered(scope, receive, send):
            return
        await self.app(scope, receive, send)

    async def _answered(self, scope: Scope, receive: Receive, send: Send) -> bool:
        """Serve the request if it has a hot shape (False: it is FastAPI's)."""
        path: str = scope["path"]
        method: str = scope["method"]
        query: bytes = scope["query_string"]
        if method == "POST" and path == self.jobs_path and not query:
            await self._submit(scope, receive, send)
            return True
        wait = WAIT_QUERY.fullmatch(query) if query else None
        if method != "GET" or not path.startswith(self.job_prefix) or (query and not wait):
            return False
        job_id = path[len(self.job_prefix) :]
        if not query and job_id.endswith(self.stream_suffix):
            job_id = job_id[: -len(self.stream_suffix)]
            return _is_job_id(job_id) and await self._stream(scope, receive, send, job_id)
        if not _is_job_id(job_id):
            return False
        await self._get(scope, receive, send, job_id, float(wait[1]) if wait else None)
        return True

    async def _submit(self, scope: Scope, receive: Receive, send: Send) -> None:
        """A body within the cap (BodySizeLimit, outside this middleware, saw to that) that
        validates as the route's JobCreate; anything else is FastAPI's, the body replayed."""
        headers = _headers(scope)
        body = await read_body(receive) or b""
        create = _parse(headers, body)
        idempotency_key = headers.get(b"idempotency-key")
        prefer = headers.get(b"prefer")
        if create is None or _too_long(idempotency_key) or _too_long(prefer):
            await self.app(scope, replay(body, receive), send)
            return
        state = _state(scope)

        async def work(caller: Caller) -> Response:
            owner = await caller.owner()
            return await accept_job(
                state.queue, state.settings, state.schema_checker, create, owner,
                _text(idempotency_key), _text(prefer),
            )  # fmt: skip

        await self._answer(scope, receive, send, self.routes.submit, work)

    async def _get(self, scope: Scope, receive: Receive, send: Send, job_id: str, wait: float | None) -> None:
        state = _state(scope)

        async def work(caller: Caller) -> Response:
            return await read_job(state.queue, state.settings, job_id, await caller.owner(), wait)

        await self._answer(scope, receive, send, self.routes.read, work)

    async def _stream(self, scope: Scope, receive: Receive, send: Send, job_id: str) -> bool:
        """Serve a stream request, or leave it to FastAPI (False) when its Last-Event-ID is one that
        FastAPI refuses itself (an over-long one: 422)."""
        last_event_id = _headers(scope).get(b"last-event-id")
        if _too_long(last_event_id, EVENT_ID_MAX):
            return False
        state = _state(scope)

        async def work(caller: Caller) -> Response:
            return await open_stream(state.queue, job_id, await caller.owner(), _text(last_event_id))

        await self._answer(scope, receive, send, self.routes.stream, work)
        return True

    @staticmethod
    async def _answer(scope: Scope, receive: Receive, send: Send, served: ServedRoute, work: Work) -> None:
        """Serve the request as its route would (api/edge/pipeline.py serve()) and send the
        response; the request's metrics and its remaining headers are HttpMetrics'."""
        scope["route"] = served  # what HttpMetrics labels the request with (its path), as the router sets it
        pipeline = served.route
        assert isinstance(pipeline, PipelineRoute)
        authorization = _text(_headers(scope).get(b"authorization"))
        response = await serve(_state(scope), scope, pipeline.kind, authorization, work, pipeline.renderer)
        await response(scope, receive, send)


def _state(scope: Scope) -> State:
    # The app's state, as Starlette's Request.app reads it: the app puts itself in the scope.
    state: State = scope["app"].state
    return state


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
