"""What a route declares it needs, read from its declarations with FastAPI's public markers
(`Depends`/`Security`, `Header`) and Python's own `inspect` and `typing`: the functions it runs
before its endpoint, however deep, and the headers each reads.

Why not the model FastAPI solves a route into (its `Dependant`, in a module of its internals): it is an
internal of FastAPI that changes between minor releases. The start-up checks that keep every
caller on one pipeline (api/edge/pipeline.py) and the hot path on the routes it mirrors
(api/routes/hotpath.py) need only what the code declares, which these markers are."""

from __future__ import annotations

import inspect
import sys
import types
import typing
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Annotated, Any

from fastapi import params


@dataclass(frozen=True, slots=True)
class Need:
    """One function a route runs before its endpoint, and the request headers it declares."""

    call: Callable[..., Any]
    headers: frozenset[str]

    @property
    def name(self) -> str:
        return getattr(self.call, "__name__", repr(self.call))


def needs_of(endpoint: Callable[..., Any], dependencies: Sequence[params.Depends] = ()) -> list[Need]:
    """Every function `endpoint` depends on, however deep, with the route's own `dependencies=`;
    the endpoint itself first (what it declares counts too)."""
    found: list[Need] = []
    seen: set[int] = set()

    def visit(call: Callable[..., Any], markers: Sequence[Marker]) -> None:
        if id(call) in seen:
            return
        seen.add(id(call))
        found.append(Need(call, frozenset(header for header, _ in markers if header is not None)))
        for _, dependency in markers:
            if dependency is not None:
                visit(dependency, markers_of(dependency))

    declared: list[Marker] = [(None, d.dependency) for d in dependencies if d.dependency is not None]
    visit(endpoint, [*markers_of(endpoint), *declared])
    return found


#: What one parameter declares: the header it reads, or the function it depends on.
Marker = tuple[str | None, Callable[..., Any] | None]


def markers_of(call: Callable[..., Any]) -> list[Marker]:
    """What each parameter of `call` declares: a header it reads, or a function it depends on."""
    markers: list[Marker] = []
    for name, parameter, annotation in _parameters(call):
        for marker in _markers(parameter, annotation):
            if isinstance(marker, params.Depends):
                markers.append((None, marker.dependency or _base_type(annotation)))
            elif isinstance(marker, params.Header):
                markers.append((_header_name(name, marker), None))
    return markers


def _parameters(call: Callable[..., Any]) -> Iterator[tuple[str, inspect.Parameter, Any]]:
    """Each parameter of `call` with its annotation evaluated (modules with `from __future__
    import annotations` hold them as text), as FastAPI evaluates them: in the function's globals
    (a class's: its module's)."""
    signature = inspect.signature(call)
    texts = {name: p.annotation for name, p in signature.parameters.items() if p.annotation is not p.empty}
    holder = types.SimpleNamespace(__annotations__=texts)
    unwrapped = inspect.unwrap(call)
    module = sys.modules.get(getattr(unwrapped, "__module__", ""))
    namespace = getattr(unwrapped, "__globals__", None) or (vars(module) if module else {})
    hints = typing.get_type_hints(holder, globalns=namespace, include_extras=True) if texts else {}
    for name, parameter in signature.parameters.items():
        yield name, parameter, hints.get(name)


def _markers(parameter: inspect.Parameter, annotation: Any) -> list[Any]:
    metadata = list(annotation.__metadata__) if typing.get_origin(annotation) is Annotated else []
    return [*metadata, parameter.default]


def _base_type(annotation: Any) -> Callable[..., Any] | None:
    """`Depends()` with no function depends on the annotated class itself."""
    base = typing.get_args(annotation)[0] if typing.get_origin(annotation) is Annotated else annotation
    return base if callable(base) else None


def _header_name(name: str, marker: params.Header) -> str:
    if marker.alias:
        return marker.alias.lower()
    return (name.replace("_", "-") if marker.convert_underscores else name).lower()
