"""api/batches/upload.py: a multipart body read as it arrives, however it is cut into chunks, as
far as the reader asks and no further; a body past its cap, cut short, malformed or not
multipart is refused with the error that says so."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from api.batches.upload import Part, UploadForm
from shared.errors import GenqError, InvalidRequest, MalformedRequest, PayloadTooLarge, UnsupportedMediaType

pytestmark = pytest.mark.anyio

CONTENT_TYPE = "multipart/form-data; boundary=xyz"
FILE = b'{"custom_id": "a"}\n' * 50
BODY = (
    b'--xyz\r\nContent-Disposition: form-data; name="purpose"\r\n\r\nbatch\r\n'
    b'--xyz\r\nContent-Disposition: form-data; name="file"; filename="in put.jsonl"\r\n'
    b"Content-Type: application/octet-stream\r\n\r\n" + FILE + b"\r\n--xyz--\r\n"
)


class Body:
    """A request body in chunks of `size`, counting what was taken."""

    def __init__(self, data: bytes, size: int) -> None:
        self.chunks = [data[i : i + size] for i in range(0, len(data), size)]
        self.taken = 0

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for chunk in self.chunks:
            self.taken += 1
            yield chunk


def form_of(body: Body, max_bytes: int = 1 << 20, content_type: str = CONTENT_TYPE) -> UploadForm:
    return UploadForm(content_type, aiter(body), max_bytes)


async def read_all(form: UploadForm) -> bytes:
    data = b""
    while piece := await form.read():
        data += piece
    return data


@pytest.mark.parametrize("size", [1, 7, 64, 1 << 20])
async def test_the_parts_come_out_whatever_the_chunking(size: int) -> None:
    form = form_of(Body(BODY, size))
    assert await form.next_part() == Part("purpose", None)
    assert await form.text("purpose", 64) == "batch"
    assert await form.next_part() == Part("file", "in put.jsonl")
    assert await read_all(form) == FILE
    assert await form.next_part() is None


async def test_the_body_is_read_only_as_far_as_the_reader_asks() -> None:
    body = Body(BODY, 16)
    form = form_of(body)
    assert await form.next_part() == Part("purpose", None)
    assert body.taken < 10  # the file part's bytes are still unread
    # A part not read is stepped over.
    assert await form.next_part() == Part("file", "in put.jsonl")


@pytest.mark.parametrize(
    ("body", "content_type", "max_bytes", "refusal"),
    [
        (BODY, CONTENT_TYPE, len(BODY) - 1, PayloadTooLarge),
        (BODY[:-30], CONTENT_TYPE, 1 << 20, MalformedRequest),  # cut short
        (b"--nope\r\ngarbage", CONTENT_TYPE, 1 << 20, MalformedRequest),
        (BODY, "application/json", 1 << 20, UnsupportedMediaType),
        (BODY, "multipart/form-data", 1 << 20, MalformedRequest),  # no boundary
    ],
)
async def test_a_bad_body_is_refused_with_what_is_wrong(
    body: bytes, content_type: str, max_bytes: int, refusal: type[GenqError]
) -> None:
    with pytest.raises(refusal):
        form = form_of(Body(body, 64), max_bytes, content_type)
        while await form.next_part() is not None:
            await read_all(form)


async def test_a_long_text_field_is_refused_naming_it() -> None:
    form = form_of(Body(BODY.replace(b"\r\nbatch\r\n", b"\r\n" + b"b" * 100 + b"\r\n"), 64))
    await form.next_part()
    with pytest.raises(InvalidRequest) as refused:
        await form.text("purpose", 64)
    assert refused.value.param == "purpose"
