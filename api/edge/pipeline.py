"""One request pipeline for every route that serves a caller: `serve()`.

A caller's request reaches genq one of two ways: through FastAPI's router (a `PipelineRoute`), or
through the raw-ASGI hot path (api/routes/hotpath.py), which skips FastAPI's dependency solving. Both
call `serve()`, which owns what the request needs besides its own work: who the caller is
(api/edge/auth.py), the rate limit of the kind the route declares (api/edge/ratelimit.py), and the
one mapping of errors to responses (api/edge/errors.py), rendered in the shape of the route's class
(genq's; OpenAI's for the OpenAI-compatible routes, api/openai/errors.py). The request's id,
metrics and the rate-limit headers serve() leaves in the scope's state are added by `HttpMetrics`
(api/edge/observability.py), which wraps both ways. So a change to any of these lands in every
route by construction, and `check_routes()` (create_app calls it) refuses to start an app with a
route that serves a caller some other way.

The caller is asked once, when the work first needs it (`Caller.owner()`), not before. What
comes first depends on how the route takes its body. A route with a JSON body model: FastAPI
parses the body (within the body cap) before it solves the route's dependencies, so a malformed
JSON body is a 400 whoever sends it and costs no rate-limit token; the route's owner dependency
(`CallerDep`) is where FastAPI's order asks, and work that costs more than parsing (compiling a
response_format's schema) waits for it. A route that reads its body itself (the multipart upload,
api/routes/files.py): the caller is authenticated and rate-limited before a byte of the body is
read, so an unknown caller or one over its bucket is refused first, and a malformed body is a 400
only to a caller known and charged a token. A route with no body: the caller comes first. A
streamed response's errors before its first byte are serve()'s; once the body streams, the stream
reports its own (as an SSE event).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Coroutine, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Annotated, Any, ClassVar

from fastapi import Depends, Header, Request, Response
from fastapi.params import Depends as DependsParam
from fastapi.routing import APIRoute, iter_route_contexts
from starlette.datastructures import State
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import BaseRoute
from starlette.types import Scope

from api.edge.auth import owner_of
from api.edge.declarations import Need, needs_of
from api.edge.errors import GENQ_ERRORS, ErrorRenderer, error_of
from api.edge.json_body import StrictJsonRequest
from api.edge.ratelimit import Kind
from shared.errors import GenqError

#: A request's own work, given its caller: its response.
Work = Callable[["Caller"], Awaitable[Response]]


class Caller:
    """Who sent a request, authenticated and rate-limited once, when its work first asks."""

    __slots__ = ("_authorization", "_kind", "_owner", "_scope", "_state")

    def __init__(self, state: State, scope: Scope, kind: Kind, authorization: str | None) -> None:
        self._state, self._scope, self._kind, self._authorization = state, scope, kind, authorization
        self._owner: str | None = None

    async def owner(self) -> str:
        """The caller's owner id; raises Unauthorized, or RateLimited when over its bucket."""
        if self._owner is None:
            owner = owner_of(self._authorization, self._state.settings)
            headers = await self._state.rate_limiter.check(owner, self._kind)
            # HttpMetrics adds them to whatever response this request gets, errors included.
            self._scope.setdefault("state", {})["response_headers"] = headers
            self._owner = owner
        return self._owner


async def serve(
    state: State,
    scope: Scope,
    kind: Kind,
    authorization: str | None,
    work: Work,
    renderer: ErrorRenderer = GENQ_ERRORS,
) -> Response:
    """Run `work` for a request whose route declares rate-limit `kind`: its response, or the
    response its error maps to, in `renderer`'s shape. An error that maps to nothing (a bug)
    propagates: the app's last handler answers it."""
    try:
        return await work(Caller(state, scope, kind, authorization))
    except StarletteHTTPException as exc:  # Starlette's own refusals: an unreadable form
        if isinstance(exc.__cause__, GenqError):  # FastAPI's wrapping of a refused body's error
            return renderer.genq(exc.__cause__)
        return renderer.http(exc)
    except Exception as exc:
        error = error_of(exc)
        if error is None:
            raise
        return renderer.genq(error)


async def caller_owner(request: Request, authorization: Annotated[str | None, Header()] = None) -> str:
    """The owner of a request served by a PipelineRoute. `authorization` is declared for the
    OpenAPI document; serve() reads the same header."""
    caller: Caller = request.state.caller
    return await caller.owner()


CallerDep = Annotated[str, Depends(caller_owner)]


async def limit_submissions() -> None:
    """Declares a PipelineRoute's requests submissions (`dependencies=[SubmitLimit]`): serve()
    takes a token of the caller's submit bucket. Never run by FastAPI: PipelineRoute takes the
    declaration off, and check_routes() refuses it on any other route."""
    raise RouteDeclarationError("a rate limit is applied by PipelineRoute only")


async def limit_reads() -> None:
    """Declares a PipelineRoute's requests reads (`dependencies=[ReadLimit]`); as above."""
    raise RouteDeclarationError("a rate limit is applied by PipelineRoute only")


SubmitLimit = Depends(limit_submissions)
ReadLimit = Depends(limit_reads)
_KINDS: dict[Callable[..., Any], Kind] = {limit_submissions: "submit", limit_reads: "read"}


class RouteDeclarationError(RuntimeError):
    """A route serves a caller without serve(), or a PipelineRoute declared no rate limit,
    several, or does not ask for its caller."""


class PipelineRoute(APIRoute):
    """A FastAPI route whose requests go through serve(). It declares its rate limit
    (`dependencies=[SubmitLimit]` or `[ReadLimit]`), which serve() applies; the endpoint takes its
    caller as a `CallerDep`. Its errors read in `renderer`'s shape (a subclass may bring another)."""

    renderer: ClassVar[ErrorRenderer] = GENQ_ERRORS

    def __init__(self, path: str, endpoint: Callable[..., Any], **kwargs: Any) -> None:
        declared: Sequence[DependsParam] = kwargs.pop("dependencies", None) or []
        kinds = [_KINDS[d.dependency] for d in declared if d.dependency in _KINDS]
        if len(kinds) != 1:
            raise RouteDeclarationError(f"{path} declares {len(kinds)} rate limits; serve() needs one")
        self.kind: Kind = kinds[0]
        others = [d for d in declared if d.dependency not in _KINDS]
        super().__init__(path, endpoint, dependencies=others, **kwargs)
        if not any(need.call is caller_owner for need in needs_of(endpoint, others)):
            raise RouteDeclarationError(f"{path}: the endpoint must take its owner as a CallerDep")

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()
        kind, renderer = self.kind, self.renderer

        async def serve_route(request: Request) -> Response:
            request = StrictJsonRequest(request.scope, request.receive)  # refuses lone surrogates

            def work(caller: Caller) -> Awaitable[Response]:
                request.state.caller = caller  # what the endpoint's CallerDep asks
                return handler(request)

            authorization = request.headers.get("authorization")
            return await serve(request.app.state, request.scope, kind, authorization, work, renderer)

        return serve_route


def check_routes(routes: Iterable[BaseRoute]) -> None:
    """Fail at start-up when a route serves a caller but is not a PipelineRoute: one that asks for
    its caller, declares a rate limit, or reads the Authorization header (a hand-made owner
    dependency), anywhere in what it declares (include_router's dependencies too). FastAPI would
    run it without the caller's rate limit or its routes' error shape."""
    for served in api_routes(routes):
        if not isinstance(served.route, PipelineRoute):
            for need in served.needs():
                asks = _caller_need(need)
                if asks is not None:
                    raise RouteDeclarationError(f"{served.path} asks for {asks} but is not a PipelineRoute")


@dataclass(frozen=True, slots=True)
class ServedRoute:
    """A FastAPI route as the app serves it: its full path and every dependency it is given."""

    path: str
    route: APIRoute
    dependencies: Sequence[DependsParam]

    def needs(self) -> list[Need]:
        """What it runs before its endpoint, the endpoint itself first (api/edge/declarations.py)."""
        return needs_of(self.route.endpoint, self.dependencies)


def api_routes(routes: Iterable[BaseRoute]) -> Iterator[ServedRoute]:
    """Every FastAPI route among `routes`, however deeply included (FastAPI's public walk of an
    app's routes, iter_route_contexts)."""
    for context in iter_route_contexts(list(routes)):
        route = context.original_route
        if isinstance(route, APIRoute):
            yield ServedRoute(context.path or route.path, route, list(context.dependencies))


def pipeline_route(routes: Iterable[BaseRoute], endpoint: Callable[..., Any]) -> ServedRoute:
    """The PipelineRoute serving `endpoint`, as served."""
    for served in api_routes(routes):
        if isinstance(served.route, PipelineRoute) and served.route.endpoint is endpoint:
            return served
    raise LookupError(f"no PipelineRoute serves {getattr(endpoint, '__name__', endpoint)}")


def _caller_need(need: Need) -> str | None:
    """What of a caller's `need` asks for, if anything."""
    if need.call is caller_owner:
        return "its caller (CallerDep)"
    if need.call in _KINDS:
        return "a rate limit"
    if "authorization" in need.headers:
        return f"the Authorization header (in {need.name})"
    return None
