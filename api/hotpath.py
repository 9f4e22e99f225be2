"""Raw-ASGI dispatch of the two requests a busy API serves most: `POST /v1/jobs` and
`GET /v1/jobs/{id}`, ahead of FastAPI's middleware stack and router.

Why: FastAPI and Starlette spend more CPU on these requests than the work itself. Measured under
wrk in the real server (bench/README.md, "Where a request's time goes"): uvicorn with a bare ASGI
app costs ~105 us a request; the same server answering our trivial /healthz through FastAPI costs
~360 us; an enqueue through FastAPI's dependency solving and body validation cost ~1,050 us of
which the real work (validation, one pipelined Redis round trip, the reply) is ~350 us. The
gateway targets (issue 2) cannot be met through that machinery on two cores.

What it does: a request of exactly the common shape is answered here through the same code the
FastAPI routes run (`accept_job`, `read_job`, the same auth, rate limiter, error mapping and
metrics), and so is a long-poll (`GET /v1/jobs/{id}?wait=N`, N plain digits: how clients wait for
a job). Anything else goes on, untouched, to FastAPI: another path or method, any
other query string, a chunked or over-long body, a body that is not plain JSON or does not
validate, an over-long header. So every error response that depends on parsing, every other
edge of the HTTP contract, and /openapi.json stay FastAPI's; tests/api/test_hotpath.py checks
that both ways answer alike. The rate-limit kind of each request is the one its route declares,
and `check()` (create_app calls it) refuses to start an app whose hot routes depend on, or whose
stack holds middleware, that this path does not mirror. `GENQ_API_HOT_PATHS=0` turns it off.
"""

from __future__ import annotations

import re
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import pydantic
import redis.exceptions
from fastapi import Response
from fastapi.dependencies.models import Dependant
from fastapi.routing import APIRoute
from starlette.types import ASGIApp, Receive, Scope, Send

from api.asgi import read_body, replay
from api.auth import owner_of
from api.errors import genq_error_response, redis_down_response, redis_error_response
from api.observability import extra_headers, observe, request_id_of
from api.ratelimit import Kind, limit_reads, limit_submissions
from api.routes import jobs
from api.routes.jobs import HEADER_MAX, JOB_ID_MAX, accept_job, get_job, read_job, submit_job
from shared.errors import GenqError
from shared.metrics import REQUESTS_INFLIGHT
from shared.schemas import JobCreate

if TYPE_CHECKING:
    from fastapi import FastAPI

JSON_TYPES = (b"application/json", b"application/json; charset=utf-8")

#: The one query string the hot path serves: a long-poll's wait in plain decimal seconds.
WAIT_QUERY = re.compile(rb"wait=(\d{1,6}(?:\.\d{1,6})?)")

#: What a hot request does once its caller is known: its response.
Work = Callable[[str], Awaitable[Response]]


class HotPaths:
    """The API's ASGI entry point when hot paths are on: these requests here, the rest to
    `fallback` (FastAPI's own middleware stack and router)."""

    def __init__(self, app: FastAPI, fallback: ASGIApp, max_body_bytes: int) -> None:
        self.app = app
        self.fallback = fallback
        self.max_body_bytes = max_body_bytes
        submit_route, read_route = _route_of(submit_job), _route_of(get_job)
        self.jobs_path = submit_route.path
        self.job_template = read_route.path
        self.job_prefix = self.job_template.split("{", 1)[0]
        # The limiter kind each route declares (SubmitLimit / ReadLimit), not a copy of it.
        self.submit_kind, self.read_kind = limit_kind(submit_route), limit_kind(read_route)

    def check(self) -> None:
        """Fail at start-up when the hot routes or the app carry something the hot path does
        not do: a dependency or middleware added there would silently miss almost all traffic."""
        for route in (_route_of(submit_job), _route_of(get_job)):
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
                if 0 < len(job_id) <= JOB_ID_MAX and "/" not in job_id:
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

        async def work(owner: str) -> Response:
            return await accept_job(
                state.queue, state.settings, create, owner, _text(idempotency_key), _text(prefer)
            )

        await self._answer(scope, send, headers, self.jobs_path, self.submit_kind, work)

    async def _get(self, scope: Scope, send: Send, job_id: str, wait: float | None) -> None:
        state = self.app.state

        async def work(owner: str) -> Response:
            return await read_job(state.queue, state.settings, job_id, owner, wait)

        await self._answer(scope, send, _headers(scope), self.job_template, self.read_kind, work)

    async def _answer(
        self, scope: Scope, send: Send, headers: dict[bytes, bytes], template: str, kind: Kind, work: Work
    ) -> None:
        """Authenticate, rate-limit, run `work`, answer; map errors and count the request as the
        FastAPI stack does (api/errors.py, api/observability.py)."""
        started = time.perf_counter()
        status = 500
        REQUESTS_INFLIGHT.inc()
        try:
            rate_headers: dict[str, str] = {}
            try:
                owner = owner_of(_text(headers.get(b"authorization")), self.app.state.settings)
                rate_headers = await self.app.state.rate_limiter.check(owner, kind)
                response = await work(owner)
            except GenqError as exc:
                response = genq_error_response(exc)
            except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError) as exc:
                response = redis_down_response(exc)
            except redis.exceptions.ResponseError as exc:
                response = redis_error_response(exc)
            status = response.status_code
            request_id = request_id_of(headers.get(b"x-request-id"))
            response_headers = [*response.raw_headers, *extra_headers(request_id, rate_headers)]
            await send({"type": "http.response.start", "status": status, "headers": response_headers})
            await send({"type": "http.response.body", "body": response.body})
        finally:
            REQUESTS_INFLIGHT.dec()
            observe(template, scope["method"], status, started)


class HotPathMismatch(RuntimeError):
    """The hot routes or the app changed in a way api/hotpath.py does not mirror."""


#: What the hot routes may depend on: the hot path does each itself (auth: owner_of; the limiter:
#: limit_kind; the rest reads app.state), and answers errors through the same mapping.
KNOWN_DEPENDENCIES = frozenset({"current_owner", "get_queue", "get_settings", "limit_submissions",
                                "limit_reads", "_limiter"})  # fmt: skip
#: Middleware the hot path mirrors: the body cap (it reads at most max_body_bytes, else falls
#: back to FastAPI) and the request metrics (observe()).
KNOWN_MIDDLEWARE = frozenset({"BodySizeLimit", "HttpMetrics"})
_KINDS: dict[Callable[..., Any], Kind] = {limit_submissions: "submit", limit_reads: "read"}


def dependencies_of(dependant: Dependant) -> set[str]:
    """The names of every function a route depends on, however deep."""
    found: set[str] = set()
    for sub in dependant.dependencies:
        if sub.call is not None:
            found.add(getattr(sub.call, "__name__", repr(sub.call)))
        found |= dependencies_of(sub)
    return found


def limit_kind(route: APIRoute) -> Kind:
    """The rate-limit kind a route declares (exactly one of SubmitLimit, ReadLimit)."""
    kinds = {_KINDS[sub.call] for sub in route.dependant.dependencies if sub.call in _KINDS}
    if len(kinds) != 1:
        raise HotPathMismatch(f"{route.path} declares {len(kinds)} rate limits; the hot path needs one")
    return kinds.pop()


def _route_of(endpoint: Callable[..., Any]) -> APIRoute:
    for route in jobs.router.routes:
        if isinstance(route, APIRoute) and route.endpoint is endpoint:
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


def _too_long(value: bytes | None) -> bool:
    return value is not None and len(value) > HEADER_MAX


def _text(value: bytes | None) -> str | None:
    # ASGI header values are bytes in latin-1, as Starlette decodes them.
    return None if value is None else value.decode("latin-1")
