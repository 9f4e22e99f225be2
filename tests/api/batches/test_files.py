"""api/batches/files.py: an upload is stored only when it is a non-empty JSONL batch file within
GENQ_FILE_MAX_BYTES, and then read and deleted by its owner only (real Redis, a local folder)."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
import redis

from api.batches.files import FILENAME_MAX, Files
from shared.errors import GenqError, InvalidRequest, NotFound, PayloadTooLarge
from tests.api.batches.conftest import MAX_BYTES
from tests.conftest import assert_nothing_written

pytestmark = pytest.mark.anyio

LINES = b'{"custom_id": "a"}\n' * 10


def stored(folder: Path) -> list[Path]:
    """What the storage folder holds (temporary files included)."""
    return sorted(folder.rglob("*")) if folder.exists() else []


async def test_an_upload_is_stored_and_read_back_by_its_owner(files: Files) -> None:
    public = await files.upload("alice", io.BytesIO(LINES), "input.jsonl", "batch")
    assert public["bytes"] == len(LINES) and public["filename"] == "input.jsonl"
    assert public["purpose"] == "batch" and public["id"].startswith("file-")
    assert b"".join(await files.content(public["id"], "alice")) == LINES
    assert (await files.get(public["id"], "alice"))["owner"] == "alice"
    for read in (files.get, files.content, files.delete):
        with pytest.raises(NotFound):
            await read(public["id"], "bob")
    long_name = "n" * (FILENAME_MAX + 10) + ".jsonl"
    assert (
        len((await files.upload("alice", io.BytesIO(LINES), long_name, "batch"))["filename"]) == FILENAME_MAX
    )


@pytest.mark.parametrize(
    ("content", "name", "purpose", "refusal", "param"),
    [
        (LINES, "input.jsonl", "fine-tune", InvalidRequest, "purpose"),
        (LINES, "input.csv", "batch", InvalidRequest, "file"),
        (b"", "input.jsonl", "batch", InvalidRequest, "file"),
        (b"x" * (MAX_BYTES + 1), "input.jsonl", "batch", PayloadTooLarge, "file"),
    ],
)
async def test_a_refused_upload_leaves_nothing_behind(
    files: Files,
    folder: Path,
    redis_client: redis.Redis,
    content: bytes,
    name: str,
    purpose: str,
    refusal: type[GenqError],
    param: str | None,
) -> None:
    with pytest.raises(refusal) as refused:
        await files.upload("alice", io.BytesIO(content), name, purpose)
    assert refused.value.param == param
    assert stored(folder) == []
    assert_nothing_written(redis_client)


async def test_a_deleted_file_is_gone_and_a_lost_content_is_a_404(files: Files, folder: Path) -> None:
    kept = (await files.upload("alice", io.BytesIO(LINES), "a.jsonl", "batch"))["id"]
    assert await files.delete(kept, "alice") == {"id": kept, "object": "file", "deleted": True}
    with pytest.raises(NotFound):
        await files.delete(kept, "alice")
    assert folder / kept not in stored(folder)
    lost = (await files.upload("alice", io.BytesIO(LINES), "b.jsonl", "batch"))["id"]
    for path in stored(folder):  # the storage lost it (a bucket emptied by hand)
        path.unlink()
    with pytest.raises(NotFound) as gone:
        await files.content(lost, "alice")
    assert "is gone" in gone.value.message
