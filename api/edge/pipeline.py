"""One request pipeline for the job routes, however a request arrives: `serve()`.

A job request reaches genq one of two ways: through FastAPI's router (a `PipelineRoute`), or
through the raw-ASGI hot path (api/edge/hotpath.py), which skips FastAPI's dependency solving. Both call
`serve()`, which owns what the request needs besides its own work: who the caller is
(api/edge/auth.py), the rate limit of the kind the route declares (api/edge/ratelimit.py), and the one
mapping of errors to responses (api/edge/errors.py). The request's id, metrics and the rate-limit
headers serve() leaves in the scope's state are added by `HttpMetrics` (api/edge/observability.py),
which wraps both ways. So a change to any of these lands in both by construction.

The caller is asked once, when the work first needs it (`Caller.owner()`), not before: FastAPI
parses a JSON body before it solves a route's dependencies, so a malformed body is a 400 whoever
sends it and costs no rate-limit token, and the route's owner dependency (`CallerDep`) is where
FastAPI's order asks.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Coroutine, Sequence
from typing import Annotated, Any

import redis.exceptions
from fastapi import Depends, Header, Request, Response
from fastapi.params import Depends as DependsParam
from fastapi.routing import APIRoute
from starlette.datastructures import State
from starlette.types import Scope

from api.edge.auth import owner_of
from api.edge.errors import genq_error_response, redis_down_response, redis_error_response
from api.edge.ratelimit import Kind, limit_reads, limit_submissions
from shared.errors import GenqError

#: A request's own work, given its caller: its response.
Work = Callable[["Caller"], Awaitable[Response]]

_KINDS: dict[Callable[..., Any], Kind] = {limit_submissions: "submit", limit_reads: "read"}


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


async def serve(state: State, scope: Scope, kind: Kind, authorization: str | None, work: Work) -> Response:
    """Run `work` for a request whose route declares rate-limit `kind`: its response, or the
    response its error maps to. Errors it does not map propagate (FastAPI's handlers, or the
    server, answer them)."""
    try:
        return await work(Caller(state, scope, kind, authorization))
    except GenqError as exc:
        return genq_error_response(exc)
    except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError) as exc:
        return redis_down_response(exc)
    except redis.exceptions.ResponseError as exc:
        return redis_error_response(exc)


async def caller_owner(request: Request, authorization: Annotated[str | None, Header()] = None) -> str:
    """The owner of a request served by a PipelineRoute. `authorization` is declared for the
    OpenAPI document; serve() reads the same header."""
    caller: Caller = request.state.caller
    return await caller.owner()


CallerDep = Annotated[str, Depends(caller_owner)]


class RouteDeclarationError(RuntimeError):
    """A PipelineRoute declared no rate limit, several, or does not ask for its caller."""


class PipelineRoute(APIRoute):
    """A FastAPI route whose requests go through serve(). It declares its rate limit as other
    routes do (`dependencies=[SubmitLimit]` or `[ReadLimit]`); serve() applies it, so FastAPI
    does not run that dependency. The endpoint takes its caller as a `CallerDep`."""

    def __init__(self, path: str, endpoint: Callable[..., Any], **kwargs: Any) -> None:
        declared: Sequence[DependsParam] = kwargs.pop("dependencies", None) or []
        kinds = [_KINDS[d.dependency] for d in declared if d.dependency in _KINDS]
        if len(kinds) != 1:
            raise RouteDeclarationError(f"{path} declares {len(kinds)} rate limits; serve() needs one")
        self.kind: Kind = kinds[0]
        others = [d for d in declared if d.dependency not in _KINDS]
        super().__init__(path, endpoint, dependencies=others, **kwargs)
        if not any(d.call is caller_owner for d in self.dependant.dependencies):
            raise RouteDeclarationError(f"{path}: the endpoint must take its owner as a CallerDep")

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()
        kind = self.kind

        async def serve_route(request: Request) -> Response:
            def work(caller: Caller) -> Awaitable[Response]:
                request.state.caller = caller  # what the endpoint's CallerDep asks
                return handler(request)

            return await serve(
                request.app.state, request.scope, kind, request.headers.get("authorization"), work
            )

        return serve_route
