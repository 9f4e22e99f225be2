"""The API's door to files: records in Redis (shared/files.py), content in the file storage
(api/batches/filestore.py). Blocking storage calls run on a thread, off the event loop."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any, BinaryIO

import anyio.to_thread

from api.batches.filestore import FileStorage, file_chunks
from shared.errors import InvalidRequest, NotFound, PayloadTooLarge
from shared.files import FilePurpose, FileRecords, NewFile, new_file_id, public_file

#: Longest file name kept (OpenAI's clients send the local name).
FILENAME_MAX = 255


class Files:
    def __init__(self, records: FileRecords, storage: FileStorage, max_bytes: int) -> None:
        self.records = records
        self.storage = storage
        self._max_bytes = max_bytes

    async def upload(self, owner: str, source: BinaryIO, filename: str, purpose: str) -> dict[str, Any]:
        """Store an uploaded JSONL file (streamed from the request's spooled upload)."""
        if purpose != FilePurpose.BATCH:
            raise InvalidRequest(f"purpose must be 'batch' (got {purpose!r})", param="purpose")
        if not filename.endswith(".jsonl"):
            raise InvalidRequest("a batch input file must be JSONL, named *.jsonl", param="file")
        file_id = new_file_id()
        size = await anyio.to_thread.run_sync(self.storage.put, file_id, self._bounded(source))
        if size == 0:
            await anyio.to_thread.run_sync(self.storage.delete, file_id)
            raise InvalidRequest("the file is empty", param="file")
        record = NewFile(file_id, owner, size, int(time.time()), filename[:FILENAME_MAX], FilePurpose.BATCH)
        await self.records.add(record)
        return public_file(record.fields())

    def _bounded(self, source: BinaryIO) -> Iterator[bytes]:
        total = 0
        for chunk in file_chunks(source):
            total += len(chunk)
            if total > self._max_bytes:
                raise PayloadTooLarge(f"the file exceeds {self._max_bytes} bytes (GENQ_FILE_MAX_BYTES)")
            yield chunk

    async def get(self, file_id: str, owner: str) -> dict[str, str]:
        record = await self.records.get(file_id, owner)
        if record is None:
            raise NotFound(f"no file {file_id!r}", param="file_id")
        return record

    async def content(self, file_id: str, owner: str) -> Iterator[bytes]:
        """The file's content as chunks (iterate on a thread: each read blocks)."""
        await self.get(file_id, owner)
        try:
            return await anyio.to_thread.run_sync(self.storage.read, file_id)
        except FileNotFoundError:
            raise NotFound(f"the content of file {file_id!r} is gone", param="file_id") from None

    async def delete(self, file_id: str, owner: str) -> dict[str, Any]:
        if not await self.records.delete(file_id, owner):
            raise NotFound(f"no file {file_id!r}", param="file_id")
        await anyio.to_thread.run_sync(self.storage.delete, file_id)
        return {"id": file_id, "object": "file", "deleted": True}
