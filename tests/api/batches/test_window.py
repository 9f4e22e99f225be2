"""A batch's window (api/batches/window.py) against a real Redis and the API's real JobQueue (no
worker: jobs stay queued): topping it up submits each line as a job with the batch's
idempotency key, keeps a line refused at validation as its error, and moves the cursor; a
cancelled batch's wind-up cancels its jobs and reports every line never fed as not run."""

from __future__ import annotations

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
from api.batches.window import Window
from api.edge.autopipeline import DirectCommands
from api.jobs.events import JobEvents
from api.jobs.queue import JobQueue
from shared import keys
from shared.batches import BatchStatus, BatchStore, NewBatch, new_batch_id
from shared.config import Settings
from shared.files import FileRecords
from shared.schemas import JobStatus
from tests.api.routes.test_batches import chat_line

OWNER = "key-a"


@pytest.fixture
async def client(settings: Settings) -> AsyncIterator[aioredis.Redis]:
    client = aioredis.Redis.from_url(settings.require_redis_url(), decode_responses=True)
    yield client
    await client.aclose()


@pytest.fixture
async def queue(settings: Settings, client: aioredis.Redis) -> AsyncIterator[JobQueue]:
    app = FastAPI()
    cache, _, _ = job_api(app, settings, client, DirectCommands(client), JobEvents(client))
    yield app.state.queue
    await cache.close()


async def new_batch(store: BatchStore, storage: LocalStorage, lines: list[bytes]) -> dict[str, str]:
    """A validated batch of `lines` (blank ones skipped); a line of b"{" is refused at validation."""
    batch_id = new_batch_id()
    storage.put(batch_id + "-input", [b"".join(lines)])
    now = time.time()
    await store.create(
        NewBatch(batch_id, OWNER, "/v1/chat/completions", batch_id + "-input", now, now + 3600, None)
    )
    refused = {n: orjson.dumps({"custom_id": None, "error": {"code": "invalid_json", "message": "m"}})
               for n, line in enumerate(lines, start=1) if line == b"{\n"}  # fmt: skip
    await store.validated(batch_id, sum(1 for line in lines if line.strip()), refused)
    return await store.record(batch_id)


def window_of(
    settings: Settings, client: aioredis.Redis, queue: JobQueue, tmp_path: Path
) -> tuple[Window, BatchStore, LocalStorage]:
    store = BatchStore(client, settings.job_ttl_s)
    storage = LocalStorage(tmp_path)
    return Window(store, Files(FileRecords(client), storage, 1 << 20), queue, window=64), store, storage


@pytest.mark.anyio
async def test_a_top_up_submits_lines_as_jobs_and_keeps_refused_ones_as_errors(
    settings: Settings, client: aioredis.Redis, queue: JobQueue, tmp_path: Path
) -> None:
    window, store, storage = window_of(settings, client, queue, tmp_path)
    record = await new_batch(store, storage, [chat_line("a", "hi"), b"{\n", b"\n", chat_line("c", "yo")])
    assert await window.top_up(record, share=2)
    entries: dict[int, dict[str, Any]] = await store.window(record["id"])
    assert set(entries) == {1, 2}
    assert (
        entries[1]["custom_id"] == "a"
        and (await queue.get(entries[1]["job"], OWNER))["status"] is JobStatus.QUEUED
    )
    assert entries[2]["error"]["code"] == "invalid_json"
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
    window, store, storage = window_of(settings, client, queue, tmp_path)
    record = await new_batch(store, storage, [chat_line("a", "hi")])
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
    window, store, storage = window_of(settings, client, queue, tmp_path)
    record = await new_batch(store, storage, [chat_line("a", "hi"), b"{\n", chat_line("c", "yo")])
    assert await window.top_up(record, share=1)
    job = (await store.window(record["id"]))[1]["job"]
    assert await window.wind_up(await store.record(record["id"]), BatchStatus.CANCELLED)
    assert (await queue.get(job, OWNER))["status"] is JobStatus.CANCELED
    entries = await store.window(record["id"])
    assert entries[2]["error"]["code"] == "invalid_json"  # refused at validation: its own error
    assert entries[3] == {"custom_id": "c", "error": {"code": "batch_cancelled",
                          "message": "the batch was cancelled before this request ran"}}  # fmt: skip
    assert (await store.record(record["id"]))["input_done"] == "1"
