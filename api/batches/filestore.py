"""Where the content of uploaded and generated files lives (the batch API's /v1/files).

One small blocking interface, two backends: a local folder under GENQ_DATA_DIR (the embedded
stack, one host) and an S3-compatible object store (fleets: every API replica sees the same
objects). Content always moves as a stream of chunks, so neither an upload nor a 200 MB output
file is ever held whole in memory. Callers on an event loop run these calls on a thread.
"""

from __future__ import annotations

import io
import os
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, BinaryIO, Protocol

from shared.config import Settings

#: Bytes moved per read or write.
CHUNK_BYTES = 1 << 20


class FileStorage(Protocol):
    """Named blobs: written once from a stream, read back as a stream from any offset."""

    def put(self, name: str, chunks: Iterable[bytes]) -> int:
        """Store the chunks under `name` (replacing what was there); the bytes written."""
        ...

    def read(self, name: str, offset: int = 0) -> Iterator[bytes]:
        """The content of `name` from byte `offset` on, in chunks. FileNotFoundError if absent."""
        ...

    def delete(self, name: str) -> None:
        """Remove `name`; absent is fine."""
        ...


def file_chunks(source: BinaryIO) -> Iterator[bytes]:
    """A readable binary file as chunks (an upload's spooled temporary file)."""
    while chunk := source.read(CHUNK_BYTES):
        yield chunk


class LocalStorage:
    """Files in one folder; a write goes to a temporary file renamed into place (never torn)."""

    def __init__(self, root: Path) -> None:
        self._root = root

    def _path(self, name: str) -> Path:
        return self._root / name

    def put(self, name: str, chunks: Iterable[bytes]) -> int:
        path = self._path(name)
        path.parent.mkdir(parents=True, exist_ok=True)
        written = 0
        fd, temporary = tempfile.mkstemp(dir=path.parent, prefix=".upload-")
        try:
            with os.fdopen(fd, "wb") as out:
                for chunk in chunks:
                    out.write(chunk)
                    written += len(chunk)
            os.replace(temporary, path)
        except BaseException:
            Path(temporary).unlink(missing_ok=True)
            raise
        return written

    def read(self, name: str, offset: int = 0) -> Iterator[bytes]:
        source = self._path(name).open("rb")  # raises FileNotFoundError now, not at first next()
        return _read_from(source, offset)

    def delete(self, name: str) -> None:
        self._path(name).unlink(missing_ok=True)


def _read_from(source: BinaryIO, offset: int) -> Iterator[bytes]:
    with source:
        source.seek(offset)
        yield from file_chunks(source)


class _ChunkReader(io.RawIOBase):
    """A readable file over an iterator of chunks (boto3's upload_fileobj reads files)."""

    def __init__(self, chunks: Iterable[bytes]) -> None:
        self._chunks = iter(chunks)
        self._pending = b""
        self.total = 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        while not self._pending:
            chunk = next(self._chunks, None)
            if chunk is None:
                return 0
            self._pending = chunk
        size = min(len(buffer), len(self._pending))
        buffer[:size] = self._pending[:size]
        self._pending = self._pending[size:]
        self.total += size
        return size


class S3Storage:
    """Objects in one bucket of an S3-compatible store, under a key prefix. Uploads are
    multipart past boto3's threshold, so memory stays at a few parts whatever the size."""

    def __init__(self, client: Any, bucket: str, prefix: str) -> None:
        self._client = client
        self._bucket = bucket
        self._prefix = prefix

    @classmethod
    def connect(
        cls, endpoint_url: str | None, bucket: str, prefix: str, region: str, key_id: str | None,
        secret: str | None,
    ) -> S3Storage:  # fmt: skip
        import boto3  # only S3 deployments pay for importing it

        client = boto3.client(
            "s3", endpoint_url=endpoint_url, region_name=region, aws_access_key_id=key_id,
            aws_secret_access_key=secret,
        )  # fmt: skip
        return cls(client, bucket, prefix)

    def put(self, name: str, chunks: Iterable[bytes]) -> int:
        reader = _ChunkReader(chunks)
        self._client.upload_fileobj(io.BufferedReader(reader, CHUNK_BYTES), self._bucket, self._prefix + name)
        return reader.total

    def read(self, name: str, offset: int = 0) -> Iterator[bytes]:
        from botocore.exceptions import ClientError

        extra = {"Range": f"bytes={offset}-"} if offset else {}
        try:
            reply = self._client.get_object(Bucket=self._bucket, Key=self._prefix + name, **extra)
        except ClientError as exc:
            code = exc.response.get("Error", {}).get("Code")
            if code in ("NoSuchKey", "404"):
                raise FileNotFoundError(name) from exc
            if code == "InvalidRange":  # reading from the very end: nothing left
                return iter(())
            raise
        return iter(reply["Body"].iter_chunks(CHUNK_BYTES))

    def delete(self, name: str) -> None:
        self._client.delete_object(Bucket=self._bucket, Key=self._prefix + name)


def storage_from_settings(settings: Settings) -> FileStorage:
    """The backend GENQ_FILE_STORAGE names."""
    if settings.file_storage == "local":
        return LocalStorage(settings.data_dir / "files")
    key_id, secret = settings.s3_access_key_id, settings.s3_secret_access_key
    return S3Storage.connect(
        settings.s3_endpoint_url, settings.s3_bucket or "", settings.s3_prefix, settings.s3_region,
        key_id.get_secret_value() if key_id else None, secret.get_secret_value() if secret else None,
    )  # fmt: skip
