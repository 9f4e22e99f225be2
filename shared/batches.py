"""Batch records (OpenAI's Batch API) in Redis: one hash per batch, moved between statuses by
the Lua scripts shared/jobqueue/lua/batch_*.lua, so every move is checked and made in one step.

A batch's hash holds its OpenAI fields and the feeder's durable progress: the byte offset and
line number it has read its input file to, whether it reached the end, the number of the next
result part, and (`ending`) whether the batch is being wound up early (expired). Its lines in
flight are a bounded hash (the window), and what they cost in rows (`window_rows`: a line of n
samples costs n, see entry_rows) is kept beside them by the same scripts; finished lines go to
storage in parts, committed here.
"""

from __future__ import annotations

import enum
import hashlib
import re
import secrets
import time
from dataclasses import dataclass
from typing import Any, cast

import orjson
import redis.asyncio as aioredis

from shared import keys
from shared.files import NewFile
from shared.jobqueue import scripts
from shared.metrics import BatchSnapshot


class BatchStatus(enum.StrEnum):
    VALIDATING = "validating"
    FAILED = "failed"
    IN_PROGRESS = "in_progress"
    FINALIZING = "finalizing"
    COMPLETED = "completed"
    EXPIRED = "expired"
    CANCELLING = "cancelling"
    CANCELLED = "cancelled"

    def is_terminal(self) -> bool:
        return self in TERMINAL_BATCH_STATUSES


TERMINAL_BATCH_STATUSES = frozenset(
    {BatchStatus.COMPLETED, BatchStatus.FAILED, BatchStatus.EXPIRED, BatchStatus.CANCELLED}
)

#: The endpoints a batch's lines may call.
BATCH_ENDPOINTS = ("/v1/chat/completions", "/v1/completions")

BATCH_ID = re.compile(r"^batch_[0-9a-f]{32}$")


def new_batch_id() -> str:
    return "batch_" + secrets.token_hex(16)


def is_batch_id(text: str) -> bool:
    return BATCH_ID.fullmatch(text) is not None


def result_file_id(batch_id: str, which: str) -> str:
    """The id of a batch's output or error file: derived from the batch, so a finalize that is
    retried after a crash writes the same file again instead of leaving a second one."""
    return "file-" + hashlib.sha256(f"{batch_id}:{which}".encode()).hexdigest()[:32]


def _int_or_none(value: str | None) -> int | None:
    return int(float(value)) if value else None


#: The timestamp fields of OpenAI's batch object.
TIMESTAMPS = (
    "in_progress_at", "expires_at", "finalizing_at", "completed_at", "failed_at", "expired_at",
    "cancelling_at", "cancelled_at",
)  # fmt: skip


def public_batch(record: dict[str, str]) -> dict[str, Any]:
    """OpenAI's batch object, from the batch's Redis hash."""
    batch: dict[str, Any] = {
        "id": record["id"],
        "object": "batch",
        "endpoint": record["endpoint"],
        "errors": orjson.loads(record["errors"]) if record.get("errors") else None,
        "input_file_id": record["input_file_id"],
        "completion_window": record["completion_window"],
        "status": record["status"],
        "output_file_id": record.get("output_file_id") or None,
        "error_file_id": record.get("error_file_id") or None,
        "created_at": int(float(record["created_at"])),
        "request_counts": {
            "total": int(record.get("total") or 0),
            "completed": int(record.get("completed") or 0),
            "failed": int(record.get("failed") or 0),
        },
        "metadata": orjson.loads(record.get("metadata") or "null"),
    }
    batch |= {field: _int_or_none(record.get(field)) for field in TIMESTAMPS}
    return batch


@dataclass(frozen=True, slots=True)
class NewBatch:
    batch_id: str
    owner: str
    endpoint: str
    input_file_id: str
    created_at: float
    expires_at: float
    metadata: dict[str, str] | None
    #: Seconds the output and error files live after they are made (0: until deleted).
    output_expires_after_s: int = 0
    #: Where the batch's end is announced ("" for nowhere).
    webhook_url: str = ""

    def fields(self) -> dict[str, str]:
        return {
            "id": self.batch_id, "owner": self.owner, "endpoint": self.endpoint,
            "input_file_id": self.input_file_id, "completion_window": "24h",
            "status": BatchStatus.VALIDATING.value, "created_at": repr(self.created_at),
            "expires_at": repr(self.expires_at), "metadata": orjson.dumps(self.metadata).decode(),
            "output_expires_after_s": str(self.output_expires_after_s), "total": "0", "completed": "0",
            "failed": "0", "cursor_offset": "0", "cursor_line": "0", "part_seq": "0",
            "webhook_url": self.webhook_url,
        }  # fmt: skip


@dataclass(frozen=True, slots=True)
class BatchOutcome:
    """How a batch ends: its final status, why the whole file failed (errors), its files."""

    status: BatchStatus
    errors: list[dict[str, Any]] | None = None
    output: NewFile | None = None
    error: NewFile | None = None
    #: The batch.<status> webhook delivery message, pushed in the same step as the end (b"": none).
    webhook_message: bytes = b""


def _flat(fields: dict[str, str]) -> str:
    return orjson.dumps([item for pair in fields.items() for item in pair]).decode()


class BatchStore:
    """Batch records for the API routes and the feeder (asyncio)."""

    def __init__(self, client: aioredis.Redis, ttl_s: int) -> None:
        self._redis = client
        self._ttl_s = ttl_s
        self._create = client.register_script(scripts.plain("batch_create"))
        self._cancel = client.register_script(scripts.plain("batch_cancel"))
        self._validated = client.register_script(scripts.plain("batch_validated"))
        self._feed = client.register_script(scripts.plain("batch_feed"))
        self._commit = client.register_script(scripts.plain("batch_commit"))
        self._finalizing = client.register_script(scripts.plain("batch_finalizing"))
        self._finish = scripts.AsyncScript(client, "batch_finish")

    # --- the routes ------------------------------------------------------------------------------
    async def create(self, new: NewBatch, active_max: int) -> dict[str, str] | None:
        """Record the new batch; None (nothing written) when its owner already has `active_max`
        batches not yet ended."""
        fields, now = new.fields(), time.time()
        made = await self._create(
            keys=[keys.batch(new.batch_id), keys.owner_batches(new.owner), keys.BATCHES_ACTIVE,
                  keys.owner_active_batches(new.owner)],
            args=[new.batch_id, _flat(fields), self._ttl_s, time.time_ns() // 1000, new.created_at, now,
                  active_max, now + self._ttl_s],
        )  # fmt: skip
        return fields if made else None

    async def get(self, batch_id: str, owner: str) -> dict[str, str] | None:
        if not is_batch_id(batch_id):
            return None
        record = cast(dict[str, str], await self._redis.hgetall(keys.batch(batch_id)))
        if not record or record.get("owner") != owner:
            return None
        return record

    async def cancel(self, batch_id: str, owner: str) -> dict[str, str] | None:
        if not is_batch_id(batch_id):
            return None
        flat = await self._cancel(keys=[keys.batch(batch_id)], args=[owner, repr(time.time())])
        return {flat[i]: flat[i + 1] for i in range(0, len(flat), 2)} or None

    async def page(self, owner: str, after: str | None, limit: int) -> tuple[list[dict[str, str]], bool]:
        """The owner's batches newest first, after the batch `after`; whether more follow."""
        index = keys.owner_batches(owner)
        ids = cast(list[str], await self._redis.zrange(index, 0, -1, desc=True))
        if after is not None:
            ids = ids[ids.index(after) + 1 :] if after in ids else []
        found: list[dict[str, str]] = []
        for batch_id in ids:
            record = cast(dict[str, str], await self._redis.hgetall(keys.batch(batch_id)))
            if not record:
                await self._redis.zrem(index, batch_id)
                continue
            if len(found) == limit:
                return found, True
            found.append(record)
        return found, False

    # --- the feeder ------------------------------------------------------------------------------
    async def any_active(self) -> bool:
        return bool(await self._redis.zcard(keys.BATCHES_ACTIVE))

    async def active(self) -> list[dict[str, str]]:
        """The records of the batches not yet ended, oldest first (a vanished one is dropped)."""
        ids = cast(list[str], await self._redis.zrange(keys.BATCHES_ACTIVE, 0, -1))
        async with self._redis.pipeline(transaction=False) as pipe:
            for batch_id in ids:
                pipe.hgetall(keys.batch(batch_id))
            records = cast(list[dict[str, str]], await pipe.execute())
        gone = [batch_id for batch_id, record in zip(ids, records, strict=True) if not record]
        if gone:
            await self._redis.zrem(keys.BATCHES_ACTIVE, *gone)
        return [record for record in records if record]

    async def snapshot(self) -> BatchSnapshot:
        """How many batches are active and how many of their lines are in flight (/metrics)."""
        ids = cast(list[str], await self._redis.zrange(keys.BATCHES_ACTIVE, 0, -1))
        sizes = await self.window_size(ids)
        return BatchSnapshot(len(ids), sum(sizes.values()))

    async def record(self, batch_id: str) -> dict[str, str]:
        return cast(dict[str, str], await self._redis.hgetall(keys.batch(batch_id)))

    async def mark_expiring(self, batch_id: str) -> None:
        await self._redis.hsetnx(keys.batch(batch_id), "ending", BatchStatus.EXPIRED.value)

    async def validated(
        self, record: dict[str, str], total: int, duplicates: int, kept_bytes: int = 0
    ) -> bool:
        """Validation passed: `total` requests, `duplicates` of them repeating a custom_id, and
        `kept_bytes` written to storage beside the batch for the feeder (charged to its owner's
        file quota until the batch ends)."""
        batch_id = record["id"]
        done = await self._validated(
            keys=[keys.batch(batch_id), keys.owner_file_bytes(record["owner"])],
            args=[repr(time.time()), total, duplicates, kept_bytes],
        )
        return bool(done)

    async def window(self, batch_id: str) -> dict[int, dict[str, Any]]:
        raw = cast(dict[str, str], await self._redis.hgetall(keys.batch_window(batch_id)))
        return {int(line): orjson.loads(entry) for line, entry in raw.items()}

    async def window_size(self, batch_ids: list[str]) -> dict[str, int]:
        """Each batch's lines in its window (whatever they cost)."""
        async with self._redis.pipeline(transaction=False) as pipe:
            for batch_id in batch_ids:
                pipe.hlen(keys.batch_window(batch_id))
            sizes = await pipe.execute()
        return dict(zip(batch_ids, (int(size) for size in sizes), strict=True))

    async def window_rows(self, batch_ids: list[str]) -> dict[str, int]:
        """Each batch's rows in its window (entry_rows of each line): what its lines in flight
        cost the fleet, as batch_feed.lua and batch_commit.lua keep it in the batch's record."""
        async with self._redis.pipeline(transaction=False) as pipe:
            for batch_id in batch_ids:
                pipe.hget(keys.batch(batch_id), "window_rows")
            rows = await pipe.execute()
        return dict(zip(batch_ids, (int(row or 0) for row in rows), strict=True))

    async def feed(
        self, batch_id: str, from_offset: str, to_offset: int, to_line: int, at_end: bool,
        entries: dict[int, dict[str, Any]],
    ) -> bool:  # fmt: skip
        flat = [item for line, entry in entries.items() for item in (str(line), orjson.dumps(entry).decode())]
        rows = sum(entry_rows(entry) for entry in entries.values())
        done = await self._feed(
            keys=[keys.batch(batch_id), keys.batch_window(batch_id)],
            args=[from_offset, to_offset, to_line, "1" if at_end else "0", orjson.dumps(flat), rows],
        )
        return bool(done)

    async def commit(
        self, batch_id: str, part_seq: str, part: str, completed: int, failed: int,
        lines: dict[int, dict[str, Any]],
    ) -> bool:  # fmt: skip
        """Commit a written part holding the results of `lines` (their window entries)."""
        rows = sum(entry_rows(entry) for entry in lines.values())
        done = await self._commit(
            keys=[keys.batch(batch_id), keys.batch_window(batch_id), keys.batch_parts(batch_id)],
            args=[part_seq, part, completed, failed, rows, *lines],
        )
        return bool(done)

    async def parts(self, batch_id: str) -> list[str]:
        return cast(list[str], await self._redis.lrange(keys.batch_parts(batch_id), 0, -1))

    async def finalizing(self, batch_id: str) -> bool:
        return bool(await self._finalizing(keys=[keys.batch(batch_id)], args=[repr(time.time())]))

    async def finish(self, record: dict[str, str], ending: BatchOutcome) -> bool:
        batch_id, owner = record["id"], record["owner"]
        made = ending.output or ending.error
        now = time.time()
        done = await self._finish(
            keys=[keys.batch(batch_id), keys.BATCHES_ACTIVE, keys.batch_window(batch_id),
                  keys.owner_active_batches(owner), keys.batch_parts(batch_id),
                  keys.file(result_file_id(batch_id, "output")), keys.file(result_file_id(batch_id, "error")),
                  keys.owner_files(owner)],
            args=[ending.status.value, repr(now),
                  orjson.dumps({"object": "list", "data": ending.errors}).decode() if ending.errors else "",
                  _flat(ending.output.fields()) if ending.output else "",
                  _flat(ending.error.fields()) if ending.error else "",
                  time.time_ns() // 1000, made.expires_at if made else 0, ending.webhook_message],
            labels=[scripts.label("owner_file_bytes_key", owner),
                    scripts.label("batch_webhook_delivery_key", batch_id, f"batch.{ending.status.value}")],
        )  # fmt: skip
        return bool(done)

    async def job_statuses(self, job_ids: list[str]) -> list[str | None]:
        """Each job's status (None: its record is gone), one round trip: the feeder reads whole
        records only of the jobs that ended."""
        async with self._redis.pipeline(transaction=False) as pipe:
            for job_id in job_ids:
                pipe.hget(keys.job(job_id), "status")
            return cast(list[str | None], await pipe.execute())

    async def forget_lines(self, owner: str, batch_id: str, jobs: dict[int, str], ttl_s: int) -> None:
        """Lines whose results are in storage: their job records are shortened to ttl_s (0: gone
        at once), their output streams deleted (nobody streams a batch line), they leave the
        owner's job list, and their idempotency keys go (the cursor is past them: they are never
        submitted again). So Redis holds a batch's window, not its history."""
        async with self._redis.pipeline(transaction=False) as pipe:
            for line, job_id in jobs.items():
                if ttl_s:
                    pipe.expire(keys.job(job_id), ttl_s)
                else:
                    pipe.delete(keys.job(job_id))
                pipe.delete(keys.job_stream(job_id))
                pipe.delete(keys.idempotency(owner, line_idempotency_key(batch_id, line)))
            if jobs:
                pipe.zrem(keys.owner_jobs(owner), *jobs.values())
            await pipe.execute()


def entry_rows(entry: dict[str, Any]) -> int:
    """What a line in a batch's window costs where capacity is counted: its job's rows (n or
    best_of samples run as that many sequences), or one for a line refused or reported as not run
    (it holds its place in the window until its error is collected)."""
    return int(entry.get("rows") or 1)


def line_idempotency_key(batch_id: str, line: int) -> str:
    """The Idempotency-Key a batch line's job is submitted with: a feeder that died between
    submitting and recording the line resubmits into the same job."""
    return f"batch:{batch_id}:{line}"
