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
from collections.abc import Callable
from typing import Any, TypeVar

import anyio.to_thread
import redis.exceptions

from api.batches.files import Files
from api.batches.filestore import FileStorage
from api.batches.input_file import Taken, read_duplicates, take_at_cursor
from api.batches.line_schemas import KeptSchemas, read_refused, refused_again
from api.batches.lines import NOT_RUN, LineError, LineRequest, duplicate, parse_line
from api.batches.splitter import Line
from api.jobs.queue import Accepted, JobQueue
from shared.batches import BatchStatus, BatchStore, line_idempotency_key
from shared.errors import Conflict, GenqError, InvalidRequest, NotFound
from shared.schemas import JobStatus

T = TypeVar("T")

#: Errors of a submission that say "not now" (the next period retries the line).
RETRY_LATER = (GenqError, redis.exceptions.RedisError)
#: Batches whose repeated-custom_id lines a feeder keeps in memory (read once from storage).
DUPLICATES_CACHED = 64


class Window:
    """Moves lines into a batch's window: fed as jobs, or reported as not run."""

    def __init__(
        self, store: BatchStore, files: Files, queue: JobQueue, window: int, line_max_bytes: int
    ) -> None:
        self._store = store
        self._files = files
        self._queue = queue
        #: GENQ_BATCH_WINDOW: the most lines a wind-up reports per period.
        self._window = window
        #: GENQ_BATCH_LINE_MAX_BYTES: a longer line is refused unread.
        self._line_max_bytes = line_max_bytes
        self._duplicates: dict[str, frozenset[int]] = {}
        self._schemas: dict[str, KeptSchemas] = {}

    async def top_up(self, record: dict[str, str], share: int) -> bool:
        """Submit more lines as jobs, as many as `share` rows pay for (a line costs its job's
        rows: n or best_of), and record them in the window. A line that costs more than any share
        goes alone into an empty window, so every batch moves."""
        taken = await take_at_cursor(self._files.storage, record, share, self._line_max_bytes)
        duplicates, schemas = await self._repeats(record), await self._refused_schemas(record)
        parsed = [
            (number, self._parse(record, number, raw, number in duplicates, schemas), offset)
            for number, raw, offset in taken.lines
        ]
        paid = _paid_for(
            [line for _, line, _ in parsed], share, empty=not int(record.get("window_rows") or 0)
        )
        outcomes = await asyncio.gather(
            *(self._submit(record, number, line) for number, line, _ in parsed[:paid])
        )
        entries: dict[int, dict[str, Any]] = {}
        for index, (number, _, line_offset) in enumerate(parsed):
            entry = outcomes[index] if index < paid else None
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
        taken = await take_at_cursor(self._files.storage, record, self._window, self._line_max_bytes)
        duplicates, schemas = await self._repeats(record), await self._refused_schemas(record)
        entries: dict[int, dict[str, Any]] = {}
        for number, raw, _ in taken.lines:
            parsed = self._parse(record, number, raw, number in duplicates, schemas)
            if isinstance(parsed, LineRequest):
                code, message = NOT_RUN[ending]
                parsed = LineError(parsed.custom_id, code, message)
            entries[number] = parsed.entry()
        return await self._record(record, taken, entries)

    @staticmethod
    def _parse(
        record: dict[str, str], number: int, raw: Line, repeated: bool, schemas: KeptSchemas
    ) -> LineRequest | LineError:
        """The line's job, or its refusal: as validation found it (a repeated custom_id and a
        schema that cannot be enforced are the refusals the line alone does not show cheaply, so
        validation kept their numbers, and the schemas' verdicts by hash: nothing compiles here)."""
        parsed = parse_line(raw, number, record["endpoint"], record["id"])
        if repeated and isinstance(parsed, LineRequest):
            return duplicate(parsed.custom_id, number)
        if isinstance(parsed, LineRequest):
            return refused_again(parsed, number, schemas) or parsed
        return parsed

    async def _refused_schemas(self, record: dict[str, str]) -> KeptSchemas:
        """What validation kept of the batch's schemas (read from storage once)."""
        return await self._kept(self._schemas, record["id"], read_refused)

    async def _repeats(self, record: dict[str, str]) -> frozenset[int]:
        """The batch's lines refused for a repeated custom_id (read from storage once)."""
        if not int(record.get("duplicates") or 0):
            return frozenset()
        return await self._kept(self._duplicates, record["id"], read_duplicates)

    async def _kept(self, cache: dict[str, T], batch_id: str, read: Callable[[FileStorage, str], T]) -> T:
        """What validation kept beside a batch in file storage, read once into a bounded cache."""
        if batch_id not in cache:
            if len(cache) >= DUPLICATES_CACHED:
                cache.clear()
            cache[batch_id] = await anyio.to_thread.run_sync(read, self._files.storage, batch_id)
        return cache[batch_id]

    async def _record(self, record: dict[str, str], taken: Taken, entries: dict[int, dict[str, Any]]) -> bool:
        """Move the cursor past what was taken and put the entries in the window, in one step."""
        offset = record["cursor_offset"]
        if str(taken.end_offset) == offset and not taken.at_end:
            return False
        return await self._store.feed(
            record["id"], offset, taken.end_offset, taken.end_line, taken.at_end, entries
        )

    async def _submit(
        self, record: dict[str, str], number: int, parsed: LineRequest | LineError
    ) -> dict[str, Any] | None:
        """The line's window entry: its job (with the rows it costs), or its error; None when it
        must wait (the queue is full, the key is at a bound, Redis refused)."""
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
        job = {"job": accepted.job["id"], "custom_id": parsed.custom_id, "echo": parsed.echo}
        return job | {"rows": parsed.create.rows}


def _paid_for(lines: list[LineRequest | LineError], share: int, *, empty: bool) -> int:
    """How many of `lines`, in order, `share` rows pay for: a job costs its rows, a refused line
    one (entry_rows). The first line of an empty window is always paid for, whatever it costs:
    a line of n=16 under a share of 4 would otherwise never run."""
    spent = 0
    for index, line in enumerate(lines):
        cost = line.create.rows if isinstance(line, LineRequest) else 1
        if spent + cost > share and not (index == 0 and empty):
            return index
        spent += cost
    return len(lines)
