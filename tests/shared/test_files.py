"""shared/files.py: file records of the batch API in a real Redis. Every read is the owner's
only, pages follow creation order with `after`, expired records read as gone until the sweep forgets
them, each owner's file bytes are counted with its records, and the public object is OpenAI's."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

import pytest
import redis
import redis.asyncio as aioredis

from cli.redis_server import EmbeddedRedis
from shared import keys
from shared.files import FilePurpose, FileRecords, NewFile, is_file_id, new_file_id, public_file

pytestmark = pytest.mark.anyio


@pytest.fixture
async def files(redis_client: redis.Redis, redis_server: EmbeddedRedis) -> AsyncIterator[FileRecords]:
    client = aioredis.Redis.from_url(redis_server.url, decode_responses=True)
    yield FileRecords(client)
    await client.aclose()


def _new(owner: str = "key-a", purpose: FilePurpose = FilePurpose.BATCH, expires_at: int = 0) -> NewFile:
    return NewFile(new_file_id(), owner, 12, int(time.time()), "in.jsonl", purpose, expires_at)


async def test_a_file_is_its_owners_only(files: FileRecords) -> None:
    new = _new()
    await files.add(new)
    assert (await files.get(new.file_id, "key-a") or {})["filename"] == "in.jsonl"
    assert await files.get(new.file_id, "key-b") is None
    assert not await files.delete(new.file_id, "key-b")
    assert await files.delete(new.file_id, "key-a")
    assert await files.get(new.file_id, "key-a") is None


async def test_ids_that_new_file_id_cannot_make_are_not_looked_up(files: FileRecords) -> None:
    assert all(is_file_id(new_file_id()) for _ in range(20))
    for text in ("file-", "file-" + "0" * 31, "file-" + "G" * 32, "../file-" + "0" * 32):
        assert not is_file_id(text)
        assert await files.get(text, "key-a") is None


async def test_pages_follow_creation_order_with_after_and_purpose(files: FileRecords) -> None:
    made = [_new(purpose=FilePurpose.BATCH if i % 2 == 0 else FilePurpose.BATCH_OUTPUT) for i in range(5)]
    for new in made:
        await files.add(new)
    page, more = await files.page("key-a", None, 2, None, newest_first=False)
    assert [r["id"] for r in page] == [made[0].file_id, made[1].file_id] and more
    page, more = await files.page("key-a", made[1].file_id, 10, None, newest_first=False)
    assert [r["id"] for r in page] == [n.file_id for n in made[2:]] and not more
    page, _ = await files.page("key-a", None, 10, "batch", newest_first=True)
    assert [r["id"] for r in page] == [made[4].file_id, made[2].file_id, made[0].file_id]
    assert await files.page("key-b", None, 10, None, newest_first=True) == ([], False)


async def test_an_expired_file_is_gone_to_reads_and_due_for_the_sweep(
    files: FileRecords, redis_client: redis.Redis
) -> None:
    kept, soon, past = _new(), _new(expires_at=int(time.time()) + 60), _new(expires_at=int(time.time()) - 1)
    for new in (kept, soon, past):
        await files.add(new)
    # No Redis TTL: the record waits for the sweep, which deletes its content too.
    assert all(redis_client.ttl(keys.file(new.file_id)) == -1 for new in (kept, soon, past))
    assert await files.get(past.file_id, "key-a") is None
    page, _ = await files.page("key-a", None, 10, None, newest_first=False)
    assert [r["id"] for r in page] == [kept.file_id, soon.file_id]
    assert await files.due(time.time(), 10) == [past.file_id]
    assert await files.held_bytes("key-a") == 3 * 12
    await files.forget(past.file_id)
    assert await files.due(time.time(), 10) == []
    assert not redis_client.exists(keys.file(past.file_id))
    assert redis_client.zrange(keys.owner_files("key-a"), 0, -1) == [kept.file_id, soon.file_id]
    assert await files.held_bytes("key-a") == 2 * 12
    await files.forget(past.file_id)  # a second sweeper: nothing more released
    assert await files.held_bytes("key-a") == 2 * 12


async def test_a_record_gone_without_its_index_entry_drops_out_of_the_list(
    files: FileRecords, redis_client: redis.Redis
) -> None:
    kept, gone = _new(), _new()
    await files.add(kept)
    await files.add(gone)
    redis_client.delete(keys.file(gone.file_id))
    page, _ = await files.page("key-a", None, 10, None, newest_first=False)
    assert [r["id"] for r in page] == [kept.file_id]
    assert redis_client.zrange(keys.owner_files("key-a"), 0, -1) == [kept.file_id]


@pytest.mark.parametrize(
    ("held", "quota", "added", "held_after"),
    [
        (0, 0, True, 12),  # no quota
        (0, 12, True, 12),  # exactly fills it
        (1, 12, False, 1),  # one byte over: nothing written
        (100, 0, True, 112),
    ],
)
async def test_add_counts_bytes_against_the_quota(
    files: FileRecords, redis_client: redis.Redis, held: int, quota: int, added: bool, held_after: int
) -> None:
    if held:
        redis_client.set(keys.owner_file_bytes("key-a"), held)
    new = _new(expires_at=int(time.time()) + 60)
    assert await files.add(new, quota) is added
    assert await files.held_bytes("key-a") == held_after
    assert bool(redis_client.exists(keys.file(new.file_id))) is added
    assert redis_client.zrange(keys.owner_files("key-a"), 0, -1) == ([new.file_id] if added else [])
    assert redis_client.zrange(keys.FILES_EXPIRING, 0, -1) == ([new.file_id] if added else [])


async def test_delete_releases_the_bytes_once(files: FileRecords, redis_client: redis.Redis) -> None:
    new = _new(expires_at=int(time.time()) + 60)
    await files.add(new)
    assert await files.delete(new.file_id, "key-a")
    assert not await files.delete(new.file_id, "key-a")
    assert await files.held_bytes("key-a") == 0
    assert redis_client.keys("genq:*") == []  # record, index entries and the counter all gone


def test_the_public_object_is_openais() -> None:
    new = _new(expires_at=1_900_000_000)
    public = public_file(new.fields())
    assert public == {
        "id": new.file_id, "object": "file", "bytes": 12, "created_at": new.created_at,
        "expires_at": 1_900_000_000, "filename": "in.jsonl", "purpose": "batch", "status": "processed",
        "status_details": None,
    }  # fmt: skip
    assert public_file(_new().fields())["expires_at"] is None
