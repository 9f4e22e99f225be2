"""File records of the batch API (/v1/files): one Redis hash per file, its content in the file
storage (api/batches/filestore.py) under the file's id. Every read is scoped to the owner. Each
owner's file bytes are counted beside the records (the per-key file quota), and files that expire
are indexed by their expiry for the sweep that deletes them (api/batches/files.py)."""

from __future__ import annotations

import enum
import re
import secrets
import time
from dataclasses import dataclass
from typing import Any, cast

import redis.asyncio as aioredis

from shared import keys
from shared.jobqueue import scripts


class FilePurpose(enum.StrEnum):
    #: A batch's input, uploaded by a client.
    BATCH = "batch"
    #: A batch's output or error file, written by genq.
    BATCH_OUTPUT = "batch_output"


#: A file id as new_file_id() makes it; anything else is 404 before Redis is asked.
FILE_ID = re.compile(r"^file-[0-9a-f]{32}$")


def new_file_id() -> str:
    return "file-" + secrets.token_hex(16)


def is_file_id(text: str) -> bool:
    return FILE_ID.fullmatch(text) is not None


@dataclass(frozen=True, slots=True)
class NewFile:
    file_id: str
    owner: str
    size: int
    created_at: int
    filename: str
    purpose: FilePurpose
    #: Unix seconds after which the file is gone (0: kept until deleted).
    expires_at: int = 0

    def fields(self) -> dict[str, str]:
        return {
            "id": self.file_id, "owner": self.owner, "bytes": str(self.size),
            "created_at": str(self.created_at), "filename": self.filename, "purpose": self.purpose.value,
            "expires_at": str(self.expires_at),
        }  # fmt: skip


def public_file(record: dict[str, str]) -> dict[str, Any]:
    """OpenAI's file object."""
    expires = int(record.get("expires_at") or 0)
    return {
        "id": record["id"],
        "object": "file",
        "bytes": int(record["bytes"]),
        "created_at": int(record["created_at"]),
        "expires_at": expires or None,
        "filename": record["filename"],
        "purpose": record["purpose"],
        "status": "processed",
        "status_details": None,
    }


class FileRecords:
    """The API's view of file records (asyncio), with each owner's file bytes (the per-key file
    quota) kept with them in one script per change."""

    def __init__(self, client: aioredis.Redis) -> None:
        self._redis = client
        self._add = client.register_script(scripts.plain("file_add"))
        self._forget = client.register_script(scripts.plain("file_forget"))

    async def add(self, new: NewFile, quota_bytes: int = 0) -> bool:
        """Record a stored file; False (nothing written) when its bytes would take its owner's
        files past `quota_bytes` (0: no quota)."""
        fields = [item for pair in new.fields().items() for item in pair]
        # Microseconds: files made within one second still list in the order they were made.
        added = await self._add(
            keys=_file_keys(new.file_id, new.owner),
            args=[new.size, quota_bytes, time.time_ns() // 1000, new.expires_at, *fields],
        )
        return bool(added)

    async def held_bytes(self, owner: str) -> int:
        """Bytes of file content the owner holds (what its file quota counts)."""
        return int(await self._redis.get(keys.owner_file_bytes(owner)) or 0)

    async def get(self, file_id: str, owner: str) -> dict[str, str] | None:
        if not is_file_id(file_id):
            return None
        record = cast(dict[str, str], await self._redis.hgetall(keys.file(file_id)))
        if not record or record.get("owner") != owner or _expired(record):
            return None
        return record

    async def delete(self, file_id: str, owner: str) -> bool:
        """Forget the record (the caller deletes the content); False when not the owner's."""
        if await self.get(file_id, owner) is None:
            return False
        return bool(await self._forget(keys=_file_keys(file_id, owner), args=[file_id]))

    async def due(self, now: float, limit: int) -> list[str]:
        """Up to `limit` ids of files whose expires_at is past `now`, oldest first."""
        return cast(list[str], await self._redis.zrangebyscore(keys.FILES_EXPIRING, "-inf", now, 0, limit))

    async def forget(self, file_id: str) -> None:
        """Forget an expired file's record, whoever owns it (the sweep deletes the content)."""
        owner = cast(str | None, await self._redis.hget(keys.file(file_id), "owner"))
        if owner is None:
            await self._redis.zrem(keys.FILES_EXPIRING, file_id)
            return
        await self._forget(keys=_file_keys(file_id, owner), args=[file_id])

    async def page(
        self, owner: str, after: str | None, limit: int, purpose: str | None, newest_first: bool
    ) -> tuple[list[dict[str, str]], bool]:
        """A page of the owner's files after the id `after`, and whether more follow."""
        index = keys.owner_files(owner)
        ids = cast(list[str], await self._redis.zrange(index, 0, -1, desc=newest_first))
        if after is not None:
            ids = ids[ids.index(after) + 1 :] if after in ids else []
        found: list[dict[str, str]] = []
        for file_id in ids:
            record = cast(dict[str, str], await self._redis.hgetall(keys.file(file_id)))
            if not record:  # gone without its index entry: drop it
                await self._redis.zrem(index, file_id)
                continue
            if _expired(record):  # the sweep deletes it soon
                continue
            if purpose is None or record["purpose"] == purpose:
                if len(found) == limit:
                    return found, True
                found.append(record)
        return found, False


def _file_keys(file_id: str, owner: str) -> list[str]:
    """The keys file_add and file_forget take."""
    return [keys.file(file_id), keys.owner_files(owner), keys.owner_file_bytes(owner), keys.FILES_EXPIRING]


def _expired(record: dict[str, str]) -> bool:
    expires_at = int(record.get("expires_at") or 0)
    return bool(expires_at) and time.time() >= expires_at
