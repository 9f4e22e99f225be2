"""The per-key file quota (GENQ_FILE_QUOTA_BYTES) and the sweep of expired files, on a real Redis
and a local folder: uploads fill the quota and the next is refused storing nothing, deleting a
file frees its room, a batch's output file counts against its owner, and once a file's expiry
passes the sweep deletes its content and releases its bytes."""

from __future__ import annotations

import io
import time
from pathlib import Path
from typing import cast

import pytest
import redis
import redis.asyncio as aioredis

from api.batches.files import Files
from api.batches.filestore import LocalStorage
from shared import keys
from shared.batches import BatchOutcome, BatchStatus, BatchStore, result_file_id
from shared.errors import QuotaExceeded
from shared.files import FilePurpose, FileRecords, NewFile
from tests.api.batches.conftest import MAX_BYTES

pytestmark = pytest.mark.anyio

LINES = b'{"custom_id": "a"}\n' * 20  # 380 bytes
#: Room for two such files, not three.
QUOTA = 2 * len(LINES) + 100


@pytest.fixture
def quota_files(aio_redis: aioredis.Redis, folder: Path) -> Files:
    return Files(FileRecords(aio_redis), LocalStorage(folder), MAX_BYTES, QUOTA)


def stored(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.rglob("*")) if folder.exists() else []


async def test_uploads_fill_the_quota_the_next_is_refused_and_a_delete_frees_room(
    quota_files: Files, folder: Path
) -> None:
    first = await quota_files.upload("alice", io.BytesIO(LINES), "1.jsonl", "batch")
    await quota_files.upload("alice", io.BytesIO(LINES), "2.jsonl", "batch")
    assert await quota_files.records.held_bytes("alice") == 2 * len(LINES)
    before = stored(folder)
    with pytest.raises(QuotaExceeded) as refused:
        await quota_files.upload("alice", io.BytesIO(LINES), "3.jsonl", "batch")
    assert refused.value.param == "file" and "GENQ_FILE_QUOTA_BYTES" in refused.value.message
    assert stored(folder) == before  # nothing of it stored
    assert await quota_files.records.held_bytes("alice") == 2 * len(LINES)
    # Another key has its own quota.
    await quota_files.upload("bob", io.BytesIO(LINES), "1.jsonl", "batch")
    await quota_files.delete(first["id"], "alice")
    assert await quota_files.records.held_bytes("alice") == len(LINES)
    await quota_files.upload("alice", io.BytesIO(LINES), "3.jsonl", "batch")


async def test_an_upload_that_passes_the_room_left_is_stopped_and_stores_nothing(
    quota_files: Files, folder: Path, redis_client: redis.Redis
) -> None:
    await quota_files.upload("alice", io.BytesIO(LINES), "1.jsonl", "batch")
    room = QUOTA - len(LINES)
    with pytest.raises(QuotaExceeded):
        await quota_files.upload("alice", io.BytesIO(b"x" * (room + 1)), "big.jsonl", "batch")
    assert len(stored(folder)) == 1  # the first file only: no partial write left
    assert await quota_files.records.held_bytes("alice") == len(LINES)
    assert redis_client.zcard(keys.owner_files("alice")) == 1


async def _finish_with_output(aio_redis: aioredis.Redis, files: Files, expires_at: int) -> NewFile:
    """A finalizing batch of alice's ends with an output file (its content already in storage)."""
    batch_id = "batch_" + "0" * 32
    await aio_redis.hset(
        keys.batch(batch_id), mapping={"id": batch_id, "owner": "alice", "status": "finalizing"}
    )
    output = NewFile(
        result_file_id(batch_id, "output"), "alice", len(LINES), int(time.time()), f"{batch_id}_output.jsonl",
        FilePurpose.BATCH_OUTPUT, expires_at,
    )  # fmt: skip
    files.storage.put(output.file_id, [LINES])
    record = cast(dict[str, str], await aio_redis.hgetall(keys.batch(batch_id)))
    outcome = BatchOutcome(BatchStatus.COMPLETED, output=output)
    assert await BatchStore(aio_redis, 3600).finish(record, outcome)
    return output


async def test_a_batch_output_file_counts_against_its_owner_even_past_the_quota(
    quota_files: Files, aio_redis: aioredis.Redis
) -> None:
    await quota_files.upload("alice", io.BytesIO(LINES), "1.jsonl", "batch")
    await quota_files.upload("alice", io.BytesIO(LINES), "2.jsonl", "batch")
    output = await _finish_with_output(aio_redis, quota_files, 0)
    assert await quota_files.records.held_bytes("alice") == 3 * len(LINES)  # written all the same
    assert b"".join(await quota_files.content(output.file_id, "alice")) == LINES
    await quota_files.delete(output.file_id, "alice")
    assert await quota_files.records.held_bytes("alice") == 2 * len(LINES)


async def test_an_expired_output_file_loses_its_content_and_its_quota_to_the_sweep(
    quota_files: Files, aio_redis: aioredis.Redis, folder: Path, redis_client: redis.Redis
) -> None:
    kept = await quota_files.upload("alice", io.BytesIO(LINES), "kept.jsonl", "batch")
    output = await _finish_with_output(aio_redis, quota_files, int(time.time()) - 1)  # its expiry passed
    assert await quota_files.records.held_bytes("alice") == 2 * len(LINES)
    assert await quota_files.sweep_expired() == 1
    assert stored(folder) == [kept["id"]]
    assert await quota_files.records.held_bytes("alice") == len(LINES)
    assert not redis_client.exists(keys.file(output.file_id))
    assert redis_client.zrange(keys.owner_files("alice"), 0, -1) == [kept["id"]]
    assert redis_client.zcard(keys.FILES_EXPIRING) == 0
    assert await quota_files.sweep_expired() == 0
