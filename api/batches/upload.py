"""An upload's multipart/form-data body, parsed as it arrives with python-multipart's streaming
parser: the upload route reads it only once its caller is authenticated and rate-limited, counts
its bytes as they come (a chunked body is bounded like one with Content-Length), and hands the
file part's bytes on chunk by chunk. Nothing is spooled to a temporary file."""

from __future__ import annotations

from collections import deque
from collections.abc import AsyncIterator
from dataclasses import dataclass
from email.message import Message

from python_multipart import MultipartParser
from python_multipart.exceptions import MultipartParseError

from shared.errors import InvalidRequest, MalformedRequest, PayloadTooLarge, UnsupportedMediaType


@dataclass(frozen=True, slots=True)
class Part:
    """One part's headers: its form field name, and its file name when it is a file."""

    name: str
    filename: str | None


#: What the parser reports, in order: a part's headers, a piece of its data, its end.
_PART_END = object()
Event = Part | bytes | object


class UploadForm:
    """The parts of a multipart body, pulled from `body` only as far as the reader asks:
    `next_part()` to a part's headers, then `read()` its data piece by piece. Past `max_bytes` of
    body in all, PayloadTooLarge."""

    def __init__(self, content_type: str | None, body: AsyncIterator[bytes], max_bytes: int) -> None:
        self._body = body
        self._max_bytes = max_bytes
        self._received = 0
        self._events: deque[Event] = deque()
        self._finished = False
        self._in_part = False
        self._header: list[bytes] = [b"", b""]
        self._headers: dict[str, str] = {}
        callbacks = {
            "on_part_begin": self._headers.clear,
            "on_header_field": lambda data, start, end: self._take(0, data[start:end]),
            "on_header_value": lambda data, start, end: self._take(1, data[start:end]),
            "on_header_end": self._header_end,
            "on_headers_finished": lambda: self._events.append(_part(self._headers)),
            "on_part_data": lambda data, start, end: self._events.append(bytes(data[start:end])),
            "on_part_end": lambda: self._events.append(_PART_END),
            "on_end": self._end,
        }
        self._parser = MultipartParser(_boundary(content_type), callbacks)  # type: ignore[arg-type]

    async def next_part(self) -> Part | None:
        """The next part's headers (the rest of the current part's data is read past), or None
        at the end of the body."""
        while (event := await self._next_event()) is not None:
            if isinstance(event, Part):
                self._in_part = True
                return event
        return None

    async def read(self) -> bytes:
        """The next piece of the current part's data; b"" at its end."""
        if not self._in_part:
            return b""
        event = await self._next_event()
        if isinstance(event, bytes):
            return event
        self._in_part = False
        return b""

    async def text(self, name: str, max_bytes: int) -> str:
        """The current part's whole data as text (a small field: `name` over `max_bytes` is refused)."""
        value = b""
        while piece := await self.read():
            value += piece
            if len(value) > max_bytes:
                raise InvalidRequest(f"{name} is longer than {max_bytes} bytes", param=name)
        return value.decode("utf-8", "replace")

    async def _next_event(self) -> Event | None:
        while not self._events:
            if self._finished:
                return None
            await self._pull()
        return self._events.popleft()

    async def _pull(self) -> None:
        chunk = await anext(self._body, None)
        if chunk is None:
            raise MalformedRequest("the multipart body ended before its closing boundary")
        self._received += len(chunk)
        if self._received > self._max_bytes:
            raise PayloadTooLarge(f"the request body exceeds {self._max_bytes} bytes", param="file")
        try:
            self._parser.write(chunk)
        except MultipartParseError as exc:
            raise MalformedRequest(f"the multipart body is malformed: {exc}") from None

    def _take(self, which: int, data: bytes) -> None:
        self._header[which] += data

    def _header_end(self) -> None:
        field, value = self._header
        self._headers[field.decode("latin-1").lower()] = value.decode("utf-8", "replace")
        self._header = [b"", b""]

    def _end(self) -> None:
        self._finished = True


def _boundary(content_type: str | None) -> str:
    message = Message()
    message["content-type"] = content_type or ""
    boundary = message.get_param("boundary")
    if message.get_content_type() != "multipart/form-data":
        raise UnsupportedMediaType("an upload is multipart/form-data (fields `file` and `purpose`)")
    if not isinstance(boundary, str) or not boundary:
        raise MalformedRequest("the multipart/form-data Content-Type names no boundary")
    return boundary


def _part(headers: dict[str, str]) -> Part:
    message = Message()
    message["content-disposition"] = headers.get("content-disposition", "")
    name = message.get_param("name", header="content-disposition")
    filename = message.get_filename()
    return Part(name if isinstance(name, str) else "", filename)
