"""A batch's window (api/batches/window.py) against a real Redis and the API's real JobQueue (no
worker: jobs stay queued): topping it up submits each line as a job with the batch's
idempotency key, keeps a line refused at validation as its error, and moves the cursor; a
cancelled batch's wind-up cancels its jobs and reports every line never fed as not run."""

from __future__ import annotations

import io
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import orjson
import pytest
import redis.asyncio as aioredis
from fastapi import FastAPI

from api.app import job_api
from api.batches.files import Files
from api.batches.filestore import LocalStorage
from api.batches.input_file import validate_input
from api.batches.results import Results
from api.batches.window import Window
from api.edge.ratelimit import RateLimiter
from api.jobs.events import JobEvents
from api.jobs.queue import JobQueue
from api.jobs.schema_compile import CompileBudget, SchemaChecker
from api.redis_io.commands import DirectCommands
from shared import keys
from shared.batches import BatchOutcome, BatchStatus, BatchStore, NewBatch, new_batch_id
from shared.config import Settings
from shared.files import FileRecords
from shared.schemas import JobStatus
from tests.api.routes.test_batches import chat_line

OWNER = "key-a"
#: GENQ_BATCH_LINE_MAX_BYTES for these tests.
LINE_MAX = 4096
#: No line of these tests asks for a schema: the checker never starts a compile process.
SCHEMAS = SchemaChecker(CompileBudget(timeout_s=10, memory_bytes=512 << 20))


@pytest.fixture
async def client(settings: Settings) -> AsyncIterator[aioredis.Redis]:
    client = aioredis.Redis.from_url(settings.require_redis_url(), decode_responses=True)
    yield client
    await client.aclose()


@pytest.fixture
async def queue(settings: Settings, client: aioredis.Redis) -> AsyncIterator[JobQueue]:
    app = FastAPI()
    app.state.rate_limiter = RateLimiter(client, DirectCommands(client), settings)
    cache, _, _ = job_api(app, settings, client, DirectCommands(client), JobEvents(client))
    yield app.state.queue
    await cache.close()


async def new_batch(
    store: BatchStore, files: Files, lines: list[bytes], schemas: SchemaChecker = SCHEMAS
) -> dict[str, str]:
    """A batch of `lines` (blank ones skipped), validated as the feeder does: a line of b"{" is
    refused (not JSON), and so is one over LINE_MAX."""
    upload = await files.upload(OWNER, io.BytesIO(b"".join(lines)), "in.jsonl", "batch")
    now = time.time()
    new = NewBatch(new_batch_id(), OWNER, "/v1/chat/completions", upload["id"], now, now + 3600, None)
    record = await store.create(new, active_max=100)
    assert record is not None
    assert (
        await validate_input(
            record, files, store, max_lines=100, line_max_bytes=LINE_MAX, schemas=schemas, schemas_max=64
        )
        is None
    )
    return await store.record(new.batch_id)


def window_of(
    settings: Settings, client: aioredis.Redis, queue: JobQueue, tmp_path: Path
) -> tuple[Window, BatchStore, Files]:
    store = BatchStore(client, settings.job_ttl_s)
    files = Files(FileRecords(client), LocalStorage(tmp_path), 1 << 20)
    return Window(store, files, queue, window=64, line_max_bytes=LINE_MAX), store, files


@pytest.mark.anyio
async def test_a_top_up_submits_lines_as_jobs_and_keeps_refused_ones_as_errors(
    settings: Settings, client: aioredis.Redis, queue: JobQueue, tmp_path: Path
) -> None:
    window, store, files = window_of(settings, client, queue, tmp_path)
    record = await new_batch(store, files, [chat_line("a", "hi"), b"{\n", b"\n", chat_line("c", "yo")])
    assert await window.top_up(record, share=2)
    entries: dict[int, dict[str, Any]] = await store.window(record["id"])
    assert set(entries) == {1, 2}
    assert (
        entries[1]["custom_id"] == "a"
        and (await queue.get(entries[1]["job"], OWNER))["status"] is JobStatus.QUEUED
    )
    assert entries[2]["error"]["code"] == "invalid_json_line"
    record = await store.record(record["id"])
    assert (record["cursor_line"], record.get("input_done")) == ("2", None)
    # The next top-up resumes after the cursor, steps over the blank line, and reaches the end.
    assert await window.top_up(record, share=2)
    entries = await store.window(record["id"])
    assert set(entries) == {1, 2, 4} and entries[4]["custom_id"] == "c"
    assert (await store.record(record["id"]))["input_done"] == "1"


@pytest.mark.anyio
async def test_a_resubmitted_line_joins_its_first_job(
    settings: Settings, client: aioredis.Redis, queue: JobQueue, tmp_path: Path
) -> None:
    """A feeder that died after submitting, before recording: the next one submits the same job."""
    window, store, files = window_of(settings, client, queue, tmp_path)
    record = await new_batch(store, files, [chat_line("a", "hi")])
    assert await window.top_up(record, share=1)
    first = (await store.window(record["id"]))[1]["job"]
    await client.hset(keys.batch(record["id"]), mapping={"cursor_offset": "0", "cursor_line": "0"})
    await client.delete(keys.batch_window(record["id"]))
    assert await window.top_up(await store.record(record["id"]), share=1)
    assert (await store.window(record["id"]))[1]["job"] == first


@pytest.mark.anyio
async def test_a_wind_up_cancels_the_jobs_and_reports_lines_never_fed(
    settings: Settings, client: aioredis.Redis, queue: JobQueue, tmp_path: Path
) -> None:
    window, store, files = window_of(settings, client, queue, tmp_path)
    record = await new_batch(store, files, [chat_line("a", "hi"), b"{\n", chat_line("c", "yo")])
    assert await window.top_up(record, share=1)
    job = (await store.window(record["id"]))[1]["job"]
    assert await window.wind_up(await store.record(record["id"]), BatchStatus.CANCELLED)
    assert (await queue.get(job, OWNER))["status"] is JobStatus.CANCELED
    entries = await store.window(record["id"])
    assert entries[2]["error"]["code"] == "invalid_json_line"  # refused at validation: its own error
    assert entries[3] == {"custom_id": "c", "error": {"code": "batch_cancelled",
                          "message": "the batch was cancelled before this request ran"}}  # fmt: skip
    assert (await store.record(record["id"]))["input_done"] == "1"


@pytest.mark.anyio
async def test_refusals_are_found_again_from_the_line_and_repeats_from_storage(
    settings: Settings, client: aioredis.Redis, queue: JobQueue, tmp_path: Path
) -> None:
    """Validation copies no refused line into Redis: the feeder finds each refusal again when it
    reads the line, and the repeated custom_ids' line numbers from the file storage."""
    window, store, files = window_of(settings, client, queue, tmp_path)
    too_long = chat_line("b", "x" * LINE_MAX)
    bad_url = (
        orjson.dumps({"custom_id": "u", "method": "POST", "url": "/v1/" + "u" * 2000, "body": {}}) + b"\n"
    )
    lines = [chat_line("a", "hi"), too_long, bad_url, chat_line("a", "again"), chat_line("c", "yo")]
    record = await new_batch(store, files, lines)
    assert (record["total"], record["duplicates"]) == ("5", "1")
    assert await client.keys(keys.batch(record["id"]) + ":*") == []  # nothing kept per line
    assert await window.top_up(record, share=5)
    entries = await store.window(record["id"])
    assert [entries[n].get("error", {}).get("code") for n in range(1, 6)] == [
        None, "line_too_long", "invalid_url", "duplicate_custom_id", None
    ]  # fmt: skip
    assert entries[2]["custom_id"] is None and len(entries[3]["error"]["message"]) <= 300
    assert (entries[4]["custom_id"], entries[5]["custom_id"]) == ("a", "c")


@pytest.mark.anyio
async def test_a_share_is_spent_in_rows_not_lines(
    settings: Settings, client: aioredis.Redis, queue: JobQueue, tmp_path: Path
) -> None:
    """Lines of n=8 run 8 sequences each: a share of 16 rows admits two of them, not sixteen, and
    the window's rows count what they cost until their results are committed."""
    window, store, files = window_of(settings, client, queue, tmp_path)
    lines = [chat_line(f"w{i}", "hi", n=8, temperature=1) for i in range(4)]
    record = await new_batch(store, files, lines)
    assert await window.top_up(record, share=16)
    entries = await store.window(record["id"])
    assert set(entries) == {1, 2} and {entries[1]["rows"], entries[2]["rows"]} == {8}
    assert await store.window_rows([record["id"]]) == {record["id"]: 16}
    record = await store.record(record["id"])
    assert record["cursor_line"] == "2"
    # A share that pays for less than the next line feeds nothing while the window holds lines.
    assert not await window.top_up(record, share=7)
    assert set(await store.window(record["id"])) == {1, 2}


@pytest.mark.anyio
async def test_a_line_dearer_than_any_share_goes_alone_into_an_empty_window(
    settings: Settings, client: aioredis.Redis, queue: JobQueue, tmp_path: Path
) -> None:
    window, store, files = window_of(settings, client, queue, tmp_path)
    record = await new_batch(store, files, [chat_line(f"w{i}", "hi", n=16, temperature=1) for i in range(2)])
    assert await window.top_up(record, share=4)
    assert set(await store.window(record["id"])) == {1}
    assert await store.window_rows([record["id"]]) == {record["id"]: 16}


@pytest.mark.anyio
async def test_the_files_kept_beside_a_batch_count_against_its_owners_quota_until_it_ends(
    settings: Settings, client: aioredis.Redis, queue: JobQueue, tmp_path: Path
) -> None:
    """Validation keeps a repeated custom_id's line numbers and a refused schema's verdict in the
    file storage for the feeder: their bytes are the owner's, like its files, until the batch ends
    and they are deleted."""
    _, store, files = window_of(settings, client, queue, tmp_path)
    bad = {"type": "json_schema", "json_schema": {"name": "b", "schema": {"type": "strin"}}}
    lines = [chat_line("a", "hi"), chat_line("a", "again"), chat_line("b", "hi", response_format=bad)]
    checker = SchemaChecker(CompileBudget(timeout_s=30, memory_bytes=512 << 20))
    try:
        record = await new_batch(store, files, lines, checker)
    finally:
        checker.close()
    kept = [tmp_path / record["id"] / name for name in ("duplicates", "schemas")]
    kept_bytes = sum(path.stat().st_size for path in kept)
    assert kept_bytes > 0 and record["kept_bytes"] == str(kept_bytes)
    input_bytes = len(b"".join(lines))
    assert await files.records.held_bytes(OWNER) == input_bytes + kept_bytes
    assert await Results(store, files, queue, 60).finish(record, BatchOutcome(BatchStatus.CANCELLED))
    assert not any(path.exists() for path in kept)
    assert await files.records.held_bytes(OWNER) == input_bytes  # released once they are gone
