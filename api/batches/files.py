"""The API's door to files: records in Redis (shared/files.py), content in the file storage
(api/batches/filestore.py). Blocking storage calls run on a thread, off the event loop.

An upload's bytes are counted as they go to storage, against the largest file taken
(GENQ_FILE_MAX_BYTES) and the room left in the owner's file quota (GENQ_FILE_QUOTA_BYTES): past
either, the write stops and what was written is removed. Files that expire are deleted, content
and record, by `sweep_expired()`, which the batch feeder runs each period."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any, BinaryIO

import anyio.from_thread
import anyio.lowlevel
import anyio.to_thread

from api.batches.filestore import FileStorage, file_chunks
from api.batches.upload import UploadForm
from shared.errors import InvalidRequest, NotFound, PayloadTooLarge, QuotaExceeded
from shared.files import FilePurpose, FileRecords, NewFile, new_file_id, public_file

#: Longest file name kept (OpenAI's clients send the local name).
FILENAME_MAX = 255
#: Longest `purpose` field read from an upload.
PURPOSE_MAX = 64
#: Most expired files one sweep deletes (the next period takes the rest).
SWEEP_MAX = 100


class Files:
    def __init__(
        self, records: FileRecords, storage: FileStorage, max_bytes: int, quota_bytes: int = 0
    ) -> None:
        self.records = records
        self.storage = storage
        self.max_bytes = max_bytes
        self._quota_bytes = quota_bytes

    async def upload(self, owner: str, source: BinaryIO, filename: str, purpose: str) -> dict[str, Any]:
        """Store a JSONL file already at hand (a readable binary file)."""
        _check_purpose(purpose)
        return await self._record(await self._store(owner, filename, file_chunks(source)))

    async def upload_form(self, owner: str, form: UploadForm) -> dict[str, Any]:
        """Store the file of an upload's multipart body (fields `file` and `purpose=batch`, in
        either order), streamed from the request to storage as it arrives."""
        purpose: str | None = None
        stored: NewFile | None = None
        try:
            while (part := await form.next_part()) is not None:
                if part.name == "purpose":
                    purpose = _check_purpose(await form.text("purpose", PURPOSE_MAX))
                elif part.name == "file":
                    if stored is not None:
                        raise InvalidRequest("an upload holds one file", param="file")
                    chunks = _pulled(form, anyio.lowlevel.current_token())
                    stored = await self._store(owner, part.filename or "", chunks)
            if purpose is None:
                raise InvalidRequest("purpose is required (purpose=batch)", param="purpose")
            if stored is None:
                raise InvalidRequest("file is required: a JSONL file of batch requests", param="file")
        except BaseException:
            if stored is not None:
                await anyio.to_thread.run_sync(self.storage.delete, stored.file_id)
            raise
        return await self._record(stored)

    async def _store(self, owner: str, filename: str, chunks: Iterator[bytes]) -> NewFile:
        """Write `chunks` to storage as a new file of `owner`'s (not yet recorded)."""
        if not filename.endswith(".jsonl"):
            raise InvalidRequest("a batch input file must be JSONL, named *.jsonl", param="file")
        room = await self._room(owner)
        file_id = new_file_id()
        size = await anyio.to_thread.run_sync(self.storage.put, file_id, self._bounded(chunks, room))
        if size == 0:
            await anyio.to_thread.run_sync(self.storage.delete, file_id)
            raise InvalidRequest("the file is empty", param="file")
        return NewFile(file_id, owner, size, int(time.time()), filename[:FILENAME_MAX], FilePurpose.BATCH)

    async def _record(self, new: NewFile) -> dict[str, Any]:
        """Record a stored file; its content goes when the owner's quota has no room for it."""
        if not await self.records.add(new, self._quota_bytes):  # another upload took the room
            await anyio.to_thread.run_sync(self.storage.delete, new.file_id)
            raise _over_quota(self._quota_bytes, await self.records.held_bytes(new.owner))
        return public_file(new.fields())

    async def _room(self, owner: str) -> int | None:
        """Bytes the owner may still store (None: no quota); QuotaExceeded when none."""
        if not self._quota_bytes:
            return None
        held = await self.records.held_bytes(owner)
        if held >= self._quota_bytes:
            raise _over_quota(self._quota_bytes, held)
        return self._quota_bytes - held

    def _bounded(self, chunks: Iterator[bytes], room: int | None) -> Iterator[bytes]:
        total = 0
        for chunk in chunks:
            total += len(chunk)
            if total > self.max_bytes:
                raise PayloadTooLarge(
                    f"the file exceeds {self.max_bytes} bytes (GENQ_FILE_MAX_BYTES)", param="file"
                )
            if room is not None and total > room:
                raise _over_quota(self._quota_bytes, self._quota_bytes - room, total)
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

    async def sweep_expired(self) -> int:
        """Delete up to SWEEP_MAX files whose expires_at has passed: content first, then the
        record (releasing the owner's quota), so a sweep cut short between the two leaves the
        record for the next one. How many were due."""
        due = await self.records.due(time.time(), SWEEP_MAX)
        for file_id in due:
            await anyio.to_thread.run_sync(self.storage.delete, file_id)
            await self.records.forget(file_id)
        return len(due)


def _check_purpose(purpose: str) -> str:
    if purpose != FilePurpose.BATCH:
        raise InvalidRequest(f"purpose must be 'batch' (got {purpose!r})", param="purpose")
    return purpose


def _pulled(form: UploadForm, loop: anyio.lowlevel.EventLoopToken) -> Iterator[bytes]:
    """The current part's data, for a storage write on another thread (ours, or one of boto3's
    transfer threads): each piece is read on the event loop `loop` as the write asks for it."""
    while piece := anyio.from_thread.run(form.read, token=loop):
        yield piece


def _over_quota(quota: int, held: int, wanted: int = 0) -> QuotaExceeded:
    more = f"; this file needs more than {wanted}" if wanted else ""
    return QuotaExceeded(
        f"the key's files hold {held} bytes of its file quota of {quota} (GENQ_FILE_QUOTA_BYTES){more}: "
        "delete files to make room",
        param="file",
    )
