"""JSON request bodies hold valid Unicode only: a string with a lone surrogate is refused at parse.

JSON may escape a lone UTF-16 surrogate (`"\\ud800"`); Python's parser turns it into a `str` that
no UTF-8 encoder takes, so a body holding one passed validation and failed only when the job was
encoded for Redis (a 500). `StrictJsonRequest` is the request a PipelineRoute's handler reads its
body through (FastAPI's documented custom-Request pattern): it refuses such a string with an
InvalidRequest naming the field, which serve() answers as itself (FastAPI wraps errors raised
while reading a body in a bare 400), so every route answers 422 (OpenAI's routes: 400) and
nothing is written.
"""

from __future__ import annotations

from typing import Any

from fastapi import Request

from shared.errors import InvalidRequest

_MESSAGE = "contains a lone surrogate (a \\ud800-\\udfff escape), which is not valid Unicode"


def lone_surrogate_at(value: Any, path: tuple[int | str, ...] = ()) -> tuple[int | str, ...] | None:
    """Where in a parsed JSON value a string with a lone surrogate is (None: nowhere). A key
    that holds one is reported at its object's path, so the path itself stays encodable."""
    if isinstance(value, str):
        return None if _encodable(value) else path
    if isinstance(value, dict):
        for key, item in value.items():
            if not _encodable(key):
                return path
            found = lone_surrogate_at(item, (*path, key))
            if found is not None:
                return found
    elif isinstance(value, list):
        for index, item in enumerate(value):
            found = lone_surrogate_at(item, (*path, index))
            if found is not None:
                return found
    return None


def _encodable(text: str) -> bool:
    if text.isascii():
        return True
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True


class StrictJsonRequest(Request):
    """A request whose JSON body is refused (InvalidRequest naming the field, as genq names fields:
    "messages.0.content") when a string in it holds a lone surrogate."""

    async def json(self) -> Any:
        body = await super().json()
        found = lone_surrogate_at(body)
        if found is not None:
            field = ".".join(str(part) for part in found) or "body"
            raise InvalidRequest(f"{field}: {_MESSAGE}", param=field)
        return body
