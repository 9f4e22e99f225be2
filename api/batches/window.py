"""A batch's window: its lines in flight as jobs (or refused, awaiting their error result).

Topping it up reads the next lines at the batch's durable cursor and submits each through
JobQueue.submit (the path every job takes) at `batch` priority, with the idempotency key
`batch:<batch id>:<line>`, so a feeder that dies between submitting and recording resubmits into
the same jobs; the cursor moves and the lines enter the window in one script (batch_feed.lua).
Winding it up (a cancelled or expiring batch) cancels its jobs in flight and puts the lines never
fed in the window as `batch_cancelled` / `batch_expired` errors, so every line still has one
result. Collecting what leaves the window is api/batches/results.py's job."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import redis.exceptions

from api.batches.files import Files
from api.batches.input_file import Taken, take_at_cursor
from api.batches.lines import NOT_RUN, LineError, parse_line
from api.jobs.queue import Accepted, JobQueue
from shared.batches import BatchStatus, BatchStore, line_idempotency_key
from shared.errors import Conflict, GenqError, InvalidRequest, NotFound
from shared.schemas import JobStatus

#: Errors of a submission that say "not now" (the next period retries the line).
RETRY_LATER = (GenqError, redis.exceptions.RedisError)


class Window:
    """Moves lines into a batch's window: fed as jobs, or reported as not run."""

    def __init__(self, store: BatchStore, files: Files, queue: JobQueue, window: int) -> None:
        self._store = store
        self._files = files
        self._queue = queue
        #: GENQ_BATCH_WINDOW: the most lines a wind-up reports per period.
        self._window = window

    async def top_up(self, record: dict[str, str], share: int) -> bool:
        """Submit up to `share` more lines as jobs and record them in the window."""
        taken = await take_at_cursor(self._files.storage, record, share)
        invalid = await self._refused(record["id"], taken)
        outcomes = await asyncio.gather(
            *(self._submit(record, number, raw, invalid.get(number)) for number, raw, _ in taken.lines)
        )
        entries: dict[int, dict[str, Any]] = {}
        for (number, _, line_offset), entry in zip(taken.lines, outcomes, strict=True):
            if entry is None:  # not now: this line and those after it wait for the next period
                return await self._record(record, Taken([], line_offset, number - 1, False), entries)
            entries[number] = entry
        return await self._record(record, taken, entries)

    async def wind_up(self, record: dict[str, str], ending: BatchStatus) -> bool:
        """Cancel the batch's jobs in flight; report lines never fed as not run."""
        busy = False
        for entry in (await self._store.window(record["id"])).values():
            if "job" in entry:
                try:
                    job = await self._queue.cancel(entry["job"], record["owner"])
                    busy |= job["status"] is JobStatus.CANCELED
                except NotFound:
                    pass
        if record.get("input_done") == "1":
            return busy
        return await self._not_run(record, ending) or busy

    async def _not_run(self, record: dict[str, str], ending: BatchStatus) -> bool:
        taken = await take_at_cursor(self._files.storage, record, self._window)
        invalid = await self._refused(record["id"], taken)
        entries: dict[int, dict[str, Any]] = {}
        for number, raw, _ in taken.lines:
            refused = invalid.get(number)
            if refused is not None:
                entries[number] = dict(json.loads(refused))
                continue
            parsed = parse_line(raw, number, record["endpoint"], record["id"])
            code, message = NOT_RUN[ending]
            entries[number] = LineError(parsed.custom_id, code, message).entry()
        return await self._record(record, taken, entries)

    async def _refused(self, batch_id: str, taken: Taken) -> dict[int, bytes]:
        """The error entries validation kept for the taken lines it refused."""
        return await self._store.invalid(batch_id, [number for number, _, _ in taken.lines])

    async def _record(self, record: dict[str, str], taken: Taken, entries: dict[int, dict[str, Any]]) -> bool:
        """Move the cursor past what was taken and put the entries in the window, in one step."""
        offset = record["cursor_offset"]
        if str(taken.end_offset) == offset and not taken.at_end:
            return False
        return await self._store.feed(
            record["id"], offset, taken.end_offset, taken.end_line, taken.at_end, entries
        )

    async def _submit(
        self, record: dict[str, str], number: int, raw: bytes, refused: bytes | None
    ) -> dict[str, Any] | None:
        """The line's window entry: its job, or its error; None when it must wait (the queue is
        full, the key is at a bound, Redis refused)."""
        if refused is not None:
            return dict(json.loads(refused))
        parsed = parse_line(raw, number, record["endpoint"], record["id"])
        if isinstance(parsed, LineError):
            return parsed.entry()
        try:
            accepted: Accepted = await self._queue.submit(
                parsed.create, record["owner"], idempotency_key=line_idempotency_key(record["id"], number)
            )
        except (InvalidRequest, Conflict) as exc:
            return LineError(parsed.custom_id, "invalid_request", f"line {number}: {exc.message}").entry()
        except RETRY_LATER:
            return None
        return {"job": accepted.job["id"], "custom_id": parsed.custom_id, "echo": parsed.echo}
