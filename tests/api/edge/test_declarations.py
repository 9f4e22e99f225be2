"""api/edge/declarations.py: a route's needs, read from its declarations alone, find every function
it runs before its endpoint however it is declared (Annotated alias, default value, nested,
`dependencies=`, a class), and the headers each reads under the name FastAPI reads them, so the
start-up checks built on it see what FastAPI runs."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Header, Security

from api.edge.declarations import needs_of
from api.edge.pipeline import CallerDep, ReadLimit, caller_owner, limit_reads
from api.routes.deps import QueueDep, get_queue, get_settings


async def inner(x_trace: Annotated[str | None, Header()] = None) -> str:
    return x_trace or ""


async def outer(
    trace: Annotated[str, Depends(inner)], token: str | None = Header(None, alias="X-Token")
) -> str:
    return trace + (token or "")


class Service:
    """A dependency that is a class (`Depends()` with no function)."""

    def __init__(self, raw_header: Annotated[str | None, Header(convert_underscores=False)] = None) -> None:
        self.raw_header = raw_header


async def endpoint(
    queue: QueueDep,
    owner: CallerDep,
    both: Annotated[str, Depends(outer)],
    again: Annotated[str, Security(outer)],
    service: Annotated[Service, Depends()],
    plain: int = 3,
) -> None:
    """An endpoint declaring its needs every way FastAPI takes them."""


def test_every_need_is_found_once_with_the_headers_it_declares() -> None:
    needs = {
        need.name: sorted(need.headers) for need in needs_of(endpoint, [ReadLimit, Depends(get_settings)])
    }
    assert needs == {
        "endpoint": [],
        "get_queue": [],
        "caller_owner": ["authorization"],
        "outer": ["x-token"],
        "inner": ["x-trace"],
        "Service": ["raw_header"],
        "limit_reads": [],
        "get_settings": [],
    }


def test_the_endpoint_comes_first_and_calls_are_the_declared_functions() -> None:
    needs = needs_of(endpoint)
    assert needs[0].call is endpoint
    calls = {need.call for need in needs}
    assert {get_queue, caller_owner, outer, inner, Service} <= calls
    assert limit_reads not in calls  # declared on the route only, not here


def test_an_endpoint_without_needs_is_itself_only() -> None:
    async def bare(plain: int = 1) -> None:
        return None

    assert [need.name for need in needs_of(bare)] == ["bare"]
