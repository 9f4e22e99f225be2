"""The file storage behind /v1/files: the local folder and the S3-compatible backend, each
written from a stream and read back from any offset.

The S3 backend runs against moto's S3 server (`moto[server]`, its ThreadedMotoServer: a real
HTTP server speaking the S3 protocol) that this module starts on a free loopback port; boto3
talks to it over HTTP exactly as it would to MinIO or AWS."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest

from api.batches.filestore import CHUNK_BYTES, FileStorage, LocalStorage, S3Storage
from cli.redis_server import free_port

BUCKET = "genq-test"


@pytest.fixture(scope="module")
def s3_endpoint() -> Iterator[str]:
    from moto.server import ThreadedMotoServer

    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    url = f"http://127.0.0.1:{port}"
    s3_client(url).create_bucket(Bucket=BUCKET)
    yield url
    server.stop()


def s3_client(url: str) -> Any:  # boto3 is untyped
    return boto3.client(
        "s3", endpoint_url=url, region_name="us-east-1", aws_access_key_id="test",
        aws_secret_access_key="test",
    )  # fmt: skip


@pytest.fixture(params=["local", "s3"])
def storage(request: pytest.FixtureRequest, tmp_path: Path) -> FileStorage:
    if request.param == "local":
        return LocalStorage(tmp_path / "files")
    url = request.getfixturevalue("s3_endpoint")
    return S3Storage.connect(url, BUCKET, "t/", "us-east-1", "test", "test")


def test_a_stream_goes_in_and_comes_back_from_any_offset(storage: FileStorage) -> None:
    # Larger than one chunk and than boto3's multipart threshold (8 MiB): several parts.
    content = b"".join(b'{"line": %d}\n' % i for i in range(800_000))
    assert len(content) > 8 * CHUNK_BYTES
    pieces = (content[i : i + 100_000] for i in range(0, len(content), 100_000))
    assert storage.put("file-a", pieces) == len(content)
    assert b"".join(storage.read("file-a")) == content
    offset = content.index(b'{"line": 500000}')
    assert b"".join(storage.read("file-a", offset)) == content[offset:]
    assert b"".join(storage.read("file-a", len(content))) == b""


def test_a_put_replaces_and_a_delete_removes(storage: FileStorage) -> None:
    storage.put("file-b", [b"first"])
    storage.put("file-b", [b"second"])
    assert b"".join(storage.read("file-b")) == b"second"
    storage.delete("file-b")
    storage.delete("file-b")  # absent is fine
    with pytest.raises(FileNotFoundError):
        b"".join(storage.read("file-b"))


def test_a_failed_stream_leaves_nothing_behind(storage: FileStorage) -> None:
    def broken() -> Iterator[bytes]:
        yield b"x" * 1000
        raise ValueError("the upload was refused")

    with pytest.raises(ValueError, match="refused"):
        storage.put("file-c", broken())
    with pytest.raises(FileNotFoundError):
        b"".join(storage.read("file-c"))
