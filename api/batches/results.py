"""A batch's results: collecting the lines of its window that ended (or were refused) into
result parts, and joining the parts into its output and error files when it ends.

Each collection writes one part (a `.out` and an `.err` object in storage) and commits it in
Redis in one script (batch_commit.lua: the lines leave the window and count) that checks the
part number read, so two feeders at once write each line's result exactly once; the loser
deletes its part. The end joins the committed parts into the two files and ends the batch (and
pushes its webhook delivery) in one script, batch_finish.lua."""

from __future__ import annotations

import logging
import secrets
import time
from collections.abc import Iterator
from typing import Any

import anyio.to_thread

from api.batches.files import Files
from api.batches.filestore import FileStorage
from api.batches.input_file import duplicates_name
from api.batches.line_schemas import refused_name
from api.batches.lines import KIND_OF_ENDPOINT, NOT_RUN, error_result, job_result
from api.jobs.queue import JobQueue
from api.openai.kind import Kind
from shared import keys, metrics
from shared.batches import BatchOutcome, BatchStatus, BatchStore, result_file_id
from shared.errors import NotFound
from shared.files import FilePurpose, NewFile
from shared.ids import new_id
from shared.jobqueue.kombu_layout import task_message
from shared.logging import fields
from shared.schemas import JobStatus, JobView

log = logging.getLogger("genq.batches")


class Results:
    """Writes a batch's result lines to storage, part by part, and its output and error files."""

    def __init__(self, store: BatchStore, files: Files, queue: JobQueue, line_ttl_s: int) -> None:
        self._store = store
        self._files = files
        self._queue = queue
        #: GENQ_BATCH_LINE_TTL_S: how long a collected line's job is kept.
        self._line_ttl_s = line_ttl_s

    async def collect(self, record: dict[str, str], ending: BatchStatus | None) -> bool:
        """Write the results of the window's finished lines as one part, then commit them."""
        batch_id = record["id"]
        window = await self._store.window(batch_id)
        results = await self._results(record, window, ending)
        if not results:
            return False
        out = b"".join(line for _, line, ok in results if ok)
        err = b"".join(line for _, line, ok in results if not ok)
        part = f"{batch_id}/part-{int(record['part_seq']):06d}-{secrets.token_hex(4)}"
        storage = self._files.storage
        await anyio.to_thread.run_sync(storage.put, part + ".out", [out])
        await anyio.to_thread.run_sync(storage.put, part + ".err", [err])
        lines = {number: window[number] for number, _, _ in results}
        completed = sum(1 for _, _, ok in results if ok)
        if not await self._store.commit(
            batch_id, record["part_seq"], part, completed, len(lines) - completed, lines
        ):
            await anyio.to_thread.run_sync(_delete_part, storage, part)  # another feeder got there first
            return False
        metrics.BATCH_LINES.labels("completed").inc(completed)
        metrics.BATCH_LINES.labels("failed").inc(len(lines) - completed)
        jobs = {number: window[number]["job"] for number in lines if "job" in window[number]}
        await self._store.forget_lines(record["owner"], batch_id, jobs, self._line_ttl_s)
        return True

    async def finish(self, record: dict[str, str], ending: BatchOutcome, *, partial: bool = False) -> bool:
        """Join the committed parts into the output and error files and end the batch. `partial`
        (a batch failing because storage lost what it needs): parts gone from storage are left
        out, not an error."""
        batch_id = record["id"]
        if ending.status is BatchStatus.COMPLETED:
            await self._store.finalizing(batch_id)
        parts = await self._store.parts(batch_id)
        output = await self._join(record, parts, "output", ".out", partial)
        error = await self._join(record, parts, "error", ".err", partial)
        webhook = _webhook_message(record, ending.status)
        ending = BatchOutcome(ending.status, ending.errors, output, error, webhook)
        # Gone before the end releases their bytes from the owner's quota: nothing reads them now,
        # and a crash between the two leaves them charged until the next period ends the batch.
        await anyio.to_thread.run_sync(self._files.storage.delete, duplicates_name(batch_id))
        await anyio.to_thread.run_sync(self._files.storage.delete, refused_name(batch_id))
        if not await self._store.finish(record, ending):
            return False
        metrics.BATCHES.labels(ending.status.value).inc()
        await anyio.to_thread.run_sync(_delete_parts, self._files.storage, parts)
        log.info("batch_ended", extra=fields(batch_id=batch_id, status=ending.status.value))
        return True

    async def _results(
        self, record: dict[str, str], window: dict[int, dict[str, Any]], ending: BatchStatus | None
    ) -> list[tuple[int, bytes, bool]]:
        """(line, result line, succeeded) for each finished line of the window, in line order."""
        batch_id, kind = record["id"], KIND_OF_ENDPOINT[record["endpoint"]]
        jobs = {number: entry["job"] for number, entry in window.items() if "job" in entry}
        statuses = dict(zip(jobs, await self._store.job_statuses(list(jobs.values())), strict=True))
        results = []
        for number in sorted(window):
            entry = window[number]
            if "error" in entry:
                error = entry["error"]
                line = error_result(batch_id, number, entry["custom_id"], error["code"], error["message"])
                results.append((number, line, False))
                continue
            status = statuses[number]
            if status is not None and not JobStatus(status).is_terminal():
                continue
            job = await self._job(entry["job"], record["owner"])
            results.append(job_line(batch_id, number, entry, kind, job, ending))
        return results

    async def _job(self, job_id: str, owner: str) -> JobView | None:
        try:
            return await self._queue.get(job_id, owner)
        except NotFound:
            return None

    async def _join(
        self, record: dict[str, str], parts: list[str], which: str, suffix: str, partial: bool
    ) -> NewFile | None:
        storage = self._files.storage
        file_id = result_file_id(record["id"], which)
        joined = _joined(storage, parts, suffix, partial)
        size = await anyio.to_thread.run_sync(storage.put, file_id, joined)
        if size == 0:
            await anyio.to_thread.run_sync(storage.delete, file_id)
            return None
        now = int(time.time())
        expires_s = int(record.get("output_expires_after_s") or 0)
        name = f"{record['id']}_{which}.jsonl"
        return NewFile(file_id, record["owner"], size, now, name, FilePurpose.BATCH_OUTPUT,
                       now + expires_s if expires_s else 0)  # fmt: skip


def job_line(
    batch_id: str, number: int, entry: dict[str, Any], kind: Kind, job: JobView | None,
    ending: BatchStatus | None,
) -> tuple[int, bytes, bool]:  # fmt: skip
    """(line, result line, succeeded) of a line whose job ended (or whose record is gone)."""
    custom_id = entry["custom_id"]
    if job is None:
        message = "the line's job record is gone (expired or deleted)"
        return number, error_result(batch_id, number, custom_id, "job_lost", message), False
    status = job["status"]
    if status is JobStatus.CANCELED and ending is not None:
        code, message = NOT_RUN[ending]
        return number, error_result(batch_id, number, custom_id, code, message), False
    return number, job_result(batch_id, number, entry, kind, job), status is JobStatus.SUCCEEDED


def _webhook_message(record: dict[str, str], status: BatchStatus) -> bytes:
    """The batch.<status> delivery message when the batch has a webhook URL."""
    if not record.get("webhook_url"):
        return b""
    event = f"batch.{status.value}"
    return task_message(keys.BATCH_WEBHOOK_TASK, new_id(), [record["id"], event], keys.WEBHOOK_QUEUE, 0)


def _joined(storage: FileStorage, parts: list[str], suffix: str, partial: bool) -> Iterator[bytes]:
    for part in parts:
        try:
            chunks = storage.read(part + suffix)
        except FileNotFoundError:
            if not partial:
                raise
            continue
        yield from chunks


def _delete_part(storage: FileStorage, part: str) -> None:
    storage.delete(part + ".out")
    storage.delete(part + ".err")


def _delete_parts(storage: FileStorage, parts: list[str]) -> None:
    for part in parts:
        _delete_part(storage, part)
