"""File records of the batch API (/v1/files): one Redis hash per file, its content in the file
storage (api/batches/filestore.py) under the file's id. Every read is scoped to the owner."""

from __future__ import annotations

import enum
import re
import secrets
import time
from dataclasses import dataclass
from typing import Any, cast

import redis.asyncio as aioredis

from shared import keys


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
    """The API's view of file records (asyncio)."""

    def __init__(self, client: aioredis.Redis) -> None:
        self._redis = client

    async def add(self, new: NewFile) -> None:
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.hset(keys.file(new.file_id), mapping=cast(Any, new.fields()))
            if new.expires_at:
                pipe.expireat(keys.file(new.file_id), new.expires_at)
            # Microseconds: files made within one second still list in the order they were made.
            pipe.zadd(keys.owner_files(new.owner), {new.file_id: time.time_ns() // 1000})
            await pipe.execute()

    async def get(self, file_id: str, owner: str) -> dict[str, str] | None:
        if not is_file_id(file_id):
            return None
        record = cast(dict[str, str], await self._redis.hgetall(keys.file(file_id)))
        if not record or record.get("owner") != owner:
            return None
        return record

    async def delete(self, file_id: str, owner: str) -> bool:
        """Forget the record (the caller deletes the content); False when not the owner's."""
        if await self.get(file_id, owner) is None:
            return False
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.delete(keys.file(file_id))
            pipe.zrem(keys.owner_files(owner), file_id)
            await pipe.execute()
        return True

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
            if not record:  # expired: drop it from the index
                await self._redis.zrem(index, file_id)
                continue
            if purpose is None or record["purpose"] == purpose:
                if len(found) == limit:
                    return found, True
                found.append(record)
        return found, False
