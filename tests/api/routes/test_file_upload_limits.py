"""POST /v1/files over real HTTP (a raw socket, so the test sees how much of a body the server
took): the caller is authenticated and rate-limited before the body is read, a chunked body is
counted as it arrives and refused with 413 once past the cap, and nothing is left in storage.
(Where a form used to be spooled cannot be watched: on Linux a TemporaryFile has no name.)"""

from __future__ import annotations

import io
import json
import select
import socket
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import anyio
import httpx
import openai
import pytest
import redis

from shared import keys
from shared.config import Settings
from tests.api.live_server import live_server
from tests.api.routes.test_openai import client_for

#: The cap on an uploaded file in these tests (GENQ_FILE_MAX_BYTES).
FILE_MAX = 1 << 20
#: How much a hostile client tries to upload.
HOSTILE = 128 << 20
#: Most body bytes a refused client may get out before it sees its answer: the loopback's socket
#: buffers, and what the client (sharing this process, so the GIL, with the server) sends meanwhile;
#: far below HOSTILE, all of which the server read before the fix.
SMALL_BOUND = 48 << 20
CHUNK = 1 << 16
#: Most a client gets out beyond what the server read: the loopback's socket buffers, both ends.
LOOPBACK_BUFFERS = 16 << 20
HEAD = (
    b'--b\r\nContent-Disposition: form-data; name="purpose"\r\n\r\nbatch\r\n'
    b'--b\r\nContent-Disposition: form-data; name="file"; filename="big.jsonl"\r\n\r\n'
)
LINE = b'{"custom_id": "a", "method": "POST", "url": "/v1/chat/completions", "body": {}}\n'


@dataclass
class Answer:
    status: int
    body: dict[str, object]
    #: File bytes the client got out before the server answered or stopped taking them.
    sent: int
    #: Whether the answer closes the connection (a body left unread is not drained).
    closes: bool


def chunked_upload(url: str, api_key: str | None, size: int) -> Answer:
    """Upload a `size`-byte file as a chunked multipart body, stopping as soon as the server
    answers (or stops reading, or closes), then read its answer."""
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port))) as sock:
        sock.settimeout(10)  # a server that stops reading without answering ends the sending
        auth = f"Authorization: Bearer {api_key}\r\n" if api_key else ""
        sock.sendall(
            b"POST /v1/files HTTP/1.1\r\nHost: genq\r\nTransfer-Encoding: chunked\r\n"
            b"Content-Type: multipart/form-data; boundary=b\r\n" + auth.encode() + b"\r\n"
        )
        sent = _send_file(sock, size)
        status, body, head = _read_answer(sock)
        return Answer(status, body, sent, b"\r\nconnection: close" in head.lower())


def _send_file(sock: socket.socket, size: int) -> int:
    def chunk(data: bytes) -> None:
        sock.sendall(b"%x\r\n%s\r\n" % (len(data), data))

    sent = 0
    try:
        chunk(HEAD)
        while sent < size:
            if select.select([sock], [], [], 0)[0]:  # answered (or closed): stop sending
                return sent
            chunk(b"x" * CHUNK)
            sent += CHUNK
        chunk(b"\r\n--b--\r\n")
        sock.sendall(b"0\r\n\r\n")
    except OSError:  # the server closed the connection, or stopped reading
        pass
    return sent


def _read_answer(sock: socket.socket) -> tuple[int, dict[str, object], bytes]:
    data = b""
    while True:
        head, _, rest = data.partition(b"\r\n\r\n")
        if _:
            length = next(
                int(line.split(b":")[1])
                for line in head.split(b"\r\n")
                if line.lower().startswith(b"content-length")
            )
            if len(rest) >= length:
                return int(head.split(b" ")[1]), json.loads(rest[:length]), head
        got = sock.recv(CHUNK)
        assert got, f"the connection closed before a whole answer: {data[:200]!r}"
        data += got


def files_in(folder: Path) -> list[Path]:
    return [p for p in folder.rglob("*") if p.is_file()] if folder.exists() else []


@pytest.fixture
def upload_url(make_settings: Callable[..., Settings], redis_client: redis.Redis) -> Iterator[str]:
    with live_server(make_settings(api_keys=["alice-key"], file_max_bytes=FILE_MAX)) as url:
        yield url


def test_an_upload_without_a_key_is_refused_before_its_body_is_read(upload_url: str) -> None:
    answer = chunked_upload(upload_url, None, HOSTILE)
    assert answer.status == 401
    assert answer.body["error"]["code"] == "invalid_api_key"  # type: ignore[index]
    assert answer.sent < SMALL_BOUND and answer.closes


def test_a_chunked_upload_over_the_cap_is_refused_as_it_passes_it(
    upload_url: str, tmp_path: Path, redis_client: redis.Redis
) -> None:
    answer = chunked_upload(upload_url, "alice-key", HOSTILE)
    assert answer.status == 413
    error = answer.body["error"]
    assert error["param"] == "file" and str(FILE_MAX) in error["message"]  # type: ignore[index]
    assert answer.sent < SMALL_BOUND and answer.closes
    assert files_in(tmp_path / "genq" / "files") == []
    assert [
        k for k in cast(list[str], redis_client.keys("genq:*")) if not k.startswith("genq:ratelimit:")
    ] == []


def test_an_upload_over_the_rate_limit_is_refused_before_its_body_is_read(
    make_settings: Callable[..., Settings], redis_client: redis.Redis
) -> None:
    settings = make_settings(api_keys=["alice-key"], file_max_bytes=FILE_MAX, rate_limit_submit="1/0.001")
    with live_server(settings) as url:
        assert chunked_upload(url, "alice-key", 100).status == 200  # the bucket's one token
        answer = chunked_upload(url, "alice-key", HOSTILE)
    assert answer.status == 429
    assert answer.body["error"]["code"] == "rate_limit_exceeded"  # type: ignore[index]
    assert answer.sent < SMALL_BOUND and answer.closes


def test_a_chunked_upload_within_the_cap_is_stored(upload_url: str, tmp_path: Path) -> None:
    answer = chunked_upload(upload_url, "alice-key", FILE_MAX)
    assert answer.status == 200 and answer.body["bytes"] == FILE_MAX
    assert not answer.closes  # read to its end: the connection stays open
    stored = tmp_path / "genq" / "files" / str(answer.body["id"])
    assert stored.stat().st_size == FILE_MAX


def test_the_sdk_uploads_and_the_fields_may_come_in_either_order(upload_url: str) -> None:
    alice = client_for(upload_url, "alice-key")
    created = alice.files.create(file=("in.jsonl", io.BytesIO(LINE)), purpose="batch")
    assert alice.files.content(created.id).content == LINE
    file_first = (
        b'--b\r\nContent-Disposition: form-data; name="file"; filename="in.jsonl"\r\n'
        b"Content-Type: application/jsonl\r\n\r\n" + LINE + b"\r\n"
        b'--b\r\nContent-Disposition: form-data; name="purpose"\r\n\r\nbatch\r\n--b--\r\n'
    )
    headers = {"Authorization": "Bearer alice-key", "Content-Type": "multipart/form-data; boundary=b"}
    answer = httpx.post(f"{upload_url}/v1/files", headers=headers, content=file_first)
    assert answer.status_code == 200 and answer.json()["bytes"] == len(LINE)
    wrong = file_first.replace(b"\r\nbatch\r\n", b"\r\nfine-tune\r\n")
    refused = httpx.post(f"{upload_url}/v1/files", headers=headers, content=wrong)
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "purpose"
    assert len(alice.files.list().data) == 2  # the refused file was not kept


def test_an_upload_past_the_keys_file_quota_is_refused_until_a_file_is_deleted(
    make_settings: Callable[..., Settings], redis_client: redis.Redis, tmp_path: Path
) -> None:
    settings = make_settings(api_keys=["alice-key"], file_quota_bytes=2 * len(LINE))
    with live_server(settings) as url:
        alice = client_for(url, "alice-key")
        first, _ = (
            alice.files.create(file=(f"{i}.jsonl", io.BytesIO(LINE)), purpose="batch") for i in range(2)
        )
        with pytest.raises(openai.RateLimitError) as refused:
            alice.files.create(file=("3.jsonl", io.BytesIO(LINE)), purpose="batch")
        error = cast(dict[str, Any], refused.value.body)
        assert error["param"] == "file" and "file quota" in error["message"]
        assert len(files_in(tmp_path / "genq" / "files")) == 2
        alice.files.delete(first.id)
        alice.files.create(file=("3.jsonl", io.BytesIO(LINE)), purpose="batch")


def test_the_feeder_deletes_a_file_whose_expiry_passed_content_and_all(
    make_settings: Callable[..., Settings], redis_client: redis.Redis, tmp_path: Path
) -> None:
    with live_server(make_settings(api_keys=["alice-key"], batch_feeder_interval_s=0.05)) as url:
        alice = client_for(url, "alice-key")
        created = alice.files.create(file=("in.jsonl", io.BytesIO(LINE)), purpose="batch")
        # Made as an output file whose output_expires_after has just passed.
        redis_client.hset(keys.file(created.id), "expires_at", int(time.time()) - 1)
        redis_client.zadd(keys.FILES_EXPIRING, {created.id: time.time() - 1})
        content = tmp_path / "genq" / "files" / created.id
        deadline = time.monotonic() + 30
        # The sweep deletes the content first, then the record.
        while redis_client.exists(keys.file(created.id)) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not redis_client.exists(keys.file(created.id))
        assert not content.exists()
        assert redis_client.keys(keys.OWNER_FILE_BYTES.format(owner="*")) == []  # no bytes held
        assert list(alice.files.list()) == []


def test_the_openapi_document_describes_the_multipart_body(upload_url: str) -> None:
    upload = httpx.get(f"{upload_url}/openapi.json").json()["paths"]["/v1/files"]["post"]
    schema = upload["requestBody"]["content"]["multipart/form-data"]["schema"]
    assert schema["required"] == ["file", "purpose"]
    assert schema["properties"]["file"]["format"] == "binary"
    assert "413" in upload["responses"] and "429" in upload["responses"]


def test_a_malformed_upload_is_400_once_its_caller_is_known(upload_url: str) -> None:
    cut_short = HEAD + LINE  # no closing boundary
    for key, status in [(None, 401), ("alice-key", 400)]:
        headers = {"Content-Type": "multipart/form-data; boundary=b"} | (
            {"Authorization": f"Bearer {key}"} if key else {}
        )
        answer = httpx.post(f"{upload_url}/v1/files", headers=headers, content=cut_short)
        assert answer.status_code == status, answer.text
    assert "closing boundary" in answer.json()["error"]["message"]
    wrong_type = httpx.post(
        f"{upload_url}/v1/files", headers={"Authorization": "Bearer alice-key"}, json={"file": "x"}
    )
    assert wrong_type.status_code == 415 and "multipart/form-data" in wrong_type.json()["error"]["message"]


def test_a_client_gone_mid_upload_leaves_nothing_in_storage(upload_url: str, tmp_path: Path) -> None:
    folder = tmp_path / "genq" / "files"
    host, port = upload_url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port))) as sock:
        sock.sendall(
            b"POST /v1/files HTTP/1.1\r\nHost: genq\r\nContent-Length: 900000\r\n"
            b"Authorization: Bearer alice-key\r\n"
            b"Content-Type: multipart/form-data; boundary=b\r\n\r\n" + HEAD + b"x" * 300_000
        )
        deadline = time.monotonic() + 30
        while not files_in(folder) and time.monotonic() < deadline:  # the write has begun
            time.sleep(0.02)
        assert files_in(folder)
    while files_in(folder) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert files_in(folder) == []


#: What a real client uploads in the tests below: under the API's linger bound (64 MiB), over
#: anything the loopback's socket buffers hold, so the refused client is still sending when its
#: answer is written.
REAL_UPLOAD = 32 << 20


def multipart_chunks(size: int) -> Iterator[bytes]:
    yield HEAD
    for _ in range(size // CHUNK):
        yield b"x" * CHUNK
    yield b"\r\n--b--\r\n"


async def multipart_chunks_async(size: int) -> AsyncIterator[bytes]:
    for chunk in multipart_chunks(size):
        yield chunk


def upload_with(client: str, url: str, api_key: str) -> tuple[int, dict[str, Any]]:
    """Uploads REAL_UPLOAD bytes as `client` does: httpx streaming a chunked body (sync or async),
    or the OpenAI SDK's files.create (a body with Content-Length); the refusal's status and body."""
    headers = {"Authorization": f"Bearer {api_key}", "Content-Type": "multipart/form-data; boundary=b"}
    if client == "httpx":
        answer = httpx.post(f"{url}/v1/files", content=multipart_chunks(REAL_UPLOAD), headers=headers)
        return answer.status_code, answer.json()
    if client == "httpx-async":

        async def post() -> httpx.Response:
            async with httpx.AsyncClient() as async_client:
                body = multipart_chunks_async(REAL_UPLOAD)
                return await async_client.post(f"{url}/v1/files", content=body, headers=headers)

        answer = anyio.run(post)
        return answer.status_code, answer.json()
    file = ("big.jsonl", io.BytesIO(b"x" * REAL_UPLOAD))
    try:
        if client == "openai":
            client_for(url, api_key).files.create(file=file, purpose="batch")
        else:
            sdk = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key=api_key, max_retries=0)
            anyio.run(lambda: sdk.files.create(file=file, purpose="batch"))
    except openai.APIStatusError as refused:
        return refused.status_code, refused.response.json()
    raise AssertionError("the upload was not refused")


REAL_CLIENTS = ["httpx", "httpx-async", "openai", "openai-async"]


@pytest.mark.parametrize("client", REAL_CLIENTS)
def test_a_real_client_without_a_key_gets_its_401_not_a_reset(upload_url: str, client: str) -> None:
    """It reads its answer only once it has sent its body: the server reads and drops the rest
    before closing (api/edge/asgi.py closing_unread), so no reset destroys the answer."""
    status, body = upload_with(client, upload_url, "forgotten-key")
    assert status == 401
    assert body["error"]["code"] == "invalid_api_key" and body["error"]["type"] == "invalid_request_error"


@pytest.mark.parametrize("client", REAL_CLIENTS)
def test_a_real_client_over_the_cap_gets_its_413_not_a_reset(upload_url: str, client: str) -> None:
    status, body = upload_with(client, upload_url, "alice-key")
    assert status == 413
    error = body["error"]
    assert error["code"] == "payload_too_large" and error["param"] == "file"


@pytest.mark.parametrize("client", REAL_CLIENTS)
def test_a_real_client_over_the_rate_limit_gets_its_429_not_a_reset(
    make_settings: Callable[..., Settings], redis_client: redis.Redis, client: str
) -> None:
    settings = make_settings(api_keys=["alice-key"], file_max_bytes=FILE_MAX, rate_limit_submit="1/0.001")
    with live_server(settings) as url:
        # Spend the bucket (however many tokens an upload takes), with small uploads.
        assert any(chunked_upload(url, "alice-key", 100).status == 429 for _ in range(20))
        status, body = upload_with(client, url, "alice-key")
    assert status == 429 and body["error"]["code"] == "rate_limit_exceeded"


def test_a_client_sending_on_regardless_is_cut_off_past_the_linger_bound(
    make_settings: Callable[..., Settings], redis_client: redis.Redis
) -> None:
    """A refused client that never reads: the server reads and drops at most the linger bound
    (GENQ_API_LINGER_MAX_BYTES) of its body, then closes, the rest of HOSTILE unsent."""
    linger = 8 << 20
    settings = make_settings(api_keys=["alice-key"], file_max_bytes=FILE_MAX, api_linger_max_bytes=linger)
    with live_server(settings) as url:
        host, port = url.removeprefix("http://").split(":")
        with socket.create_connection((host, int(port))) as sock:
            sock.settimeout(10)  # a server that stops reading without closing fails the test
            sock.sendall(
                b"POST /v1/files HTTP/1.1\r\nHost: genq\r\nContent-Length: %d\r\n"
                b"Content-Type: multipart/form-data; boundary=b\r\n\r\n%s" % (HOSTILE, HEAD)
            )
            sent = 0
            with pytest.raises(ConnectionError):  # reset once the server stops reading
                while sent < HOSTILE:
                    sock.sendall(b"x" * CHUNK)
                    sent += CHUNK
    assert sent < linger + LOOPBACK_BUFFERS
