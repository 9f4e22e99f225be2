"""The batch feeder: turns batches' input lines into ordinary genq jobs a bounded number at a time,
and their results into the batches' output and error files.

Each period, for every active batch (docs/batches.md has the policy):
1. validating: one streamed pass over the input file; whole-file problems fail the batch;
2. collect: lines of its window whose jobs ended (or that were refused) are written to storage
   as one result part, then committed in Redis (they leave the window and count) in one step;
3. top up: new lines are read from the input file at the batch's durable cursor and submitted
   through JobQueue.submit (the path every job takes) at `batch` priority, each with the
   idempotency key `batch:<batch id>:<line>`, so a feeder that dies between submitting and
   recording resubmits into the same jobs;
4. wind up (cancelled or expired): its jobs in flight are canceled and the lines never fed are
   reported as `batch_cancelled` / `batch_expired`, so every line still has one result;
5. finish: once the input is read and the window is empty, the parts are joined into the output
   and error files and the batch ends, in one script.

It runs in every API process (it submits through the API's JobQueue); a Redis lock lets one of
them feed per period, and each step is guarded by the batch's own state (cursor, part number,
status), so two feeders at once still write each line's result exactly once. Everything it
knows lives in Redis and storage: an API killed mid-batch loses nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import secrets
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import anyio.to_thread
import redis.asyncio as aioredis
import redis.exceptions

from api.batches.files import Files
from api.batches.filestore import FileStorage, lines_from
from api.batches.lines import KIND_OF_ENDPOINT, LineError, error_result, job_result, parse_line, validate
from api.jobs.queue import Accepted, JobQueue
from api.openai.kind import Kind
from shared import keys, metrics
from shared.batches import BatchStatus, BatchStore, Ending, line_idempotency_key, result_file_id
from shared.config import Settings
from shared.errors import Conflict, GenqError, InvalidRequest, NotFound
from shared.files import FilePurpose, NewFile
from shared.ids import new_id
from shared.logging import fields
from shared.messages import task_message
from shared.schemas import JobStatus, JobView
from shared.store import fleet_slots

log = logging.getLogger("genq.batches")

#: After a period that did work, the next comes this soon (a busy batch is not held to the
#: interval); an idle feeder waits the whole interval.
BUSY_PAUSE_S = 0.05


def fair_shares(
    demands: dict[str, dict[str, int]], free: int, start: int, weights: dict[str, int] | None = None
) -> dict[str, int]:
    """Split `free` slots between owners {owner: {batch id: lines wanted}}: in each round an owner
    gets as many slots as its weight (1 unless `weights` names it), owners in sorted order from
    `start`, and an owner's slots go round-robin over its batches. So keys share by weight
    whatever their number of batches or lines, and what one key cannot use goes to the others."""
    owners = sorted(demands)
    if not owners:
        return {}
    owners = owners[start % len(owners) :] + owners[: start % len(owners)]
    wants = {owner: dict(demands[owner]) for owner in owners}
    turn = dict.fromkeys(owners, 0)
    shares: dict[str, int] = {}
    while free > 0 and any(sum(w.values()) for w in wants.values()):
        for owner in owners:
            for _ in range((weights or {}).get(owner, 1)):
                open_batches = sorted(b for b, want in wants[owner].items() if want > 0)
                if not open_batches or free == 0:
                    break
                batch = open_batches[turn[owner] % len(open_batches)]
                turn[owner] += 1
                wants[owner][batch] -= 1
                shares[batch] = shares.get(batch, 0) + 1
                free -= 1
    return shares


def batch_capacity(fleet_slots: int, reserve: float, max_inflight: int) -> int:
    """Lines all batches may have in flight: the fleet's slots less the interactive reserve
    (rounded up), at least one line while any worker is live, at most max_inflight. No live
    worker: none (lines fed then would only wait in the queue, ahead of the fleet's return)."""
    if fleet_slots <= 0:
        return 0
    return min(max_inflight, max(1, fleet_slots - math.ceil(fleet_slots * reserve)))


@dataclass(slots=True)
class Taken:
    """Lines read from the input file at the batch's cursor."""

    #: (line number, its bytes, its offset in the file)
    lines: list[tuple[int, bytes, int]] = field(default_factory=list)
    end_offset: int = 0
    end_line: int = 0
    at_end: bool = False


def take_lines(storage: FileStorage, name: str, offset: int, line: int, count: int) -> Taken:
    """Up to `count` request lines from byte `offset` (after line number `line`); blank lines are
    stepped over. Blocking: run it on a thread."""
    taken = Taken(end_offset=offset, end_line=line)
    chunks = storage.read(name, offset)
    lines = lines_from(chunks)
    try:
        for raw in lines:
            if len(taken.lines) == count:
                return taken
            taken.end_line += 1
            if raw.strip():
                taken.lines.append((taken.end_line, raw, taken.end_offset))
            taken.end_offset += len(raw)
        taken.at_end = True
        return taken
    finally:
        _close(chunks)


def _close(chunks: Iterator[bytes]) -> None:
    close = getattr(chunks, "close", None)
    if close is not None:
        close()


#: Errors of a submission that say "not now" (the next period retries the line).
RETRY_LATER = (GenqError, redis.exceptions.RedisError)


class BatchFeeder:
    def __init__(
        self, settings: Settings, client: aioredis.Redis, store: BatchStore, files: Files, queue: JobQueue
    ) -> None:
        self._settings = settings
        self._redis = client
        self._store = store
        self._files = files
        self._queue = queue
        self._id = secrets.token_hex(8)
        self._stopped = asyncio.Event()

    # --- the loop --------------------------------------------------------------------------------
    async def run_forever(self) -> None:
        while not self._stopped.is_set():
            busy = False
            try:
                busy = await self.run_once()
            except (redis.exceptions.RedisError, OSError) as exc:
                log.warning("batch_feeder_skipped", extra=fields(error=type(exc).__name__))
            pause = BUSY_PAUSE_S if busy else self._settings.batch_feeder_interval_s
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stopped.wait(), pause)

    def stop(self) -> None:
        self._stopped.set()

    async def run_once(self) -> bool:
        """One period's work, if this process holds the lock; whether anything moved."""
        if not await self._store.any_active() or not await self._hold_lock():
            return False
        records = await self._store.active()
        shares = await self._shares(records)
        busy = False
        for record in records:
            busy |= await self._step(record, shares.get(record["id"], 0))
        return busy

    async def _hold_lock(self) -> bool:
        lock_ms = int(max(self._settings.batch_feeder_interval_s * 4, 2.0) * 1000)
        if await self._redis.set(keys.BATCH_FEEDER_LOCK, self._id, nx=True, px=lock_ms):
            return True
        if await self._redis.get(keys.BATCH_FEEDER_LOCK) == self._id:
            await self._redis.pexpire(keys.BATCH_FEEDER_LOCK, lock_ms)
            return True
        return False

    async def _shares(self, records: list[dict[str, str]]) -> dict[str, int]:
        feeding = [r for r in records if r["status"] == BatchStatus.IN_PROGRESS and not r.get("ending")]
        sizes = await self._store.window_size([r["id"] for r in records])
        free = await self._capacity() - sum(sizes.values())
        demands: dict[str, dict[str, int]] = {}
        for record in feeding:
            if record.get("input_done") != "1":
                want = max(0, self._settings.batch_window - sizes[record["id"]])
                demands.setdefault(record["owner"], {})[record["id"]] = want
        start = int(await self._redis.incr(keys.BATCH_ROTATION))
        return fair_shares(demands, free, start, self._settings.batch_key_weights)

    async def _capacity(self) -> int:
        settings = self._settings
        slots = await fleet_slots(self._redis, settings.heartbeat_ttl_s, unknown=settings.concurrency)
        return batch_capacity(slots, settings.batch_interactive_reserve, settings.batch_max_inflight)

    # --- one batch -------------------------------------------------------------------------------
    async def _step(self, record: dict[str, str], share: int) -> bool:
        try:
            return await self._advance(record, share)
        except FileNotFoundError:  # its input file's content vanished from storage mid-batch
            message = f"the input file {record['input_file_id']} was removed from storage during the batch"
            problem = {"code": "file_not_found", "message": message, "param": "input_file_id", "line": None}
            return await self._finish(record, Ending(BatchStatus.FAILED, errors=[problem]))

    async def _advance(self, record: dict[str, str], share: int) -> bool:
        status = BatchStatus(record["status"])
        if status is BatchStatus.VALIDATING:
            return await self._validate(record)
        if status is BatchStatus.CANCELLING and record.get("validated") != "1":
            return await self._finish(record, Ending(BatchStatus.CANCELLED))
        if self._past_window(record):
            await self._store.mark_expiring(record["id"])
            record = await self._store.record(record["id"])
        ending = _ending(record)
        busy = await self._collect(record, ending)
        if ending is not None:
            busy |= await self._wind_up(record, ending)
        elif share:
            busy |= await self._feed(record, share)
        record = await self._store.record(record["id"])
        if (
            record.get("input_done") == "1"
            and not (await self._store.window_size([record["id"]]))[record["id"]]
        ):
            busy |= await self._finish(record, Ending(ending or BatchStatus.COMPLETED))
        return busy

    @staticmethod
    def _past_window(record: dict[str, str]) -> bool:
        in_progress = record["status"] == BatchStatus.IN_PROGRESS and not record.get("ending")
        return in_progress and time.time() > float(record["expires_at"])

    async def _validate(self, record: dict[str, str]) -> bool:
        batch_id, endpoint = record["id"], record["endpoint"]
        if time.time() > float(record["expires_at"]):
            return await self._finish(record, Ending(BatchStatus.EXPIRED))
        try:
            await self._files.get(record["input_file_id"], record["owner"])
            chunks = await anyio.to_thread.run_sync(self._files.storage.read, record["input_file_id"])
        except (NotFound, FileNotFoundError):
            message = f"the input file {record['input_file_id']} is gone"
            problem = {"code": "file_not_found", "message": message, "param": "input_file_id", "line": None}
            return await self._finish(record, Ending(BatchStatus.FAILED, errors=[problem]))
        max_lines = self._settings.batch_max_lines
        checked = await anyio.to_thread.run_sync(
            lambda: validate(lines_from(chunks), endpoint, batch_id, max_lines)
        )
        if checked.problem is not None:
            return await self._finish(record, Ending(BatchStatus.FAILED, errors=[checked.problem]))
        await self._store.validated(batch_id, checked.total, checked.invalid)
        log.info(
            "batch_validated",
            extra=fields(batch_id=batch_id, total=checked.total, invalid=len(checked.invalid)),
        )
        return True

    async def _feed(self, record: dict[str, str], share: int) -> bool:
        """Submit up to `share` more lines as jobs and record them in the window."""
        batch_id, offset = record["id"], record["cursor_offset"]
        taken = await anyio.to_thread.run_sync(
            take_lines, self._files.storage, record["input_file_id"], int(offset), int(record["cursor_line"]),
            share,
        )  # fmt: skip
        invalid = await self._store.invalid(batch_id, [number for number, _, _ in taken.lines])
        outcomes = await asyncio.gather(
            *(self._submit(record, number, raw, invalid.get(number)) for number, raw, _ in taken.lines)
        )
        entries: dict[int, dict[str, Any]] = {}
        for (number, _, line_offset), entry in zip(taken.lines, outcomes, strict=True):
            if entry is None:  # not now: this line and those after it wait for the next period
                return await self._record_fed(batch_id, offset, line_offset, number - 1, False, entries)
            entries[number] = entry
        return await self._record_fed(
            batch_id, offset, taken.end_offset, taken.end_line, taken.at_end, entries
        )

    async def _record_fed(
        self, batch_id: str, offset: str, end_offset: int, end_line: int, at_end: bool,
        entries: dict[int, dict[str, Any]],
    ) -> bool:  # fmt: skip
        if str(end_offset) == offset and not at_end:
            return False
        return await self._store.feed(batch_id, offset, end_offset, end_line, at_end, entries)

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

    async def _collect(self, record: dict[str, str], ending: BatchStatus | None) -> bool:
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
        lines = [number for number, _, _ in results]
        completed = sum(1 for _, _, ok in results if ok)
        if not await self._store.commit(
            batch_id, record["part_seq"], part, completed, len(lines) - completed, lines
        ):
            await anyio.to_thread.run_sync(_delete_part, storage, part)  # another feeder got there first
            return False
        metrics.BATCH_LINES.labels("completed").inc(completed)
        metrics.BATCH_LINES.labels("failed").inc(len(lines) - completed)
        jobs = {number: window[number]["job"] for number in lines if "job" in window[number]}
        await self._store.forget_lines(record["owner"], batch_id, jobs, self._settings.batch_line_ttl_s)
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
            results.append(_job_line(batch_id, number, entry, kind, job, ending))
        return results

    async def _job(self, job_id: str, owner: str) -> JobView | None:
        try:
            return await self._queue.get(job_id, owner)
        except NotFound:
            return None

    async def _wind_up(self, record: dict[str, str], ending: BatchStatus) -> bool:
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
        return await self._drain(record, ending) or busy

    async def _drain(self, record: dict[str, str], ending: BatchStatus) -> bool:
        batch_id, offset = record["id"], record["cursor_offset"]
        taken = await anyio.to_thread.run_sync(
            take_lines, self._files.storage, record["input_file_id"], int(offset), int(record["cursor_line"]),
            self._settings.batch_window,
        )  # fmt: skip
        invalid = await self._store.invalid(batch_id, [number for number, _, _ in taken.lines])
        entries: dict[int, dict[str, Any]] = {}
        for number, raw, _ in taken.lines:
            refused = invalid.get(number)
            if refused is not None:
                entries[number] = dict(json.loads(refused))
                continue
            parsed = parse_line(raw, number, record["endpoint"], batch_id)
            custom_id = parsed.custom_id
            code, message = _NOT_RUN[ending]
            entries[number] = LineError(custom_id, code, message).entry()
        return await self._record_fed(
            batch_id, offset, taken.end_offset, taken.end_line, taken.at_end, entries
        )

    async def _finish(self, record: dict[str, str], ending: Ending) -> bool:
        """Join the committed parts into the output and error files and end the batch."""
        batch_id = record["id"]
        if ending.status is BatchStatus.COMPLETED:
            await self._store.finalizing(batch_id)
        parts = await self._store.parts(batch_id)
        output = await self._join(record, parts, "output", ".out")
        error = await self._join(record, parts, "error", ".err")
        ending = Ending(ending.status, ending.errors, output, error, _webhook_message(record, ending.status))
        if not await self._store.finish(record, ending):
            return False
        metrics.BATCHES.labels(ending.status.value).inc()
        await anyio.to_thread.run_sync(_delete_parts, self._files.storage, parts)
        log.info("batch_ended", extra=fields(batch_id=batch_id, status=ending.status.value))
        return True

    async def _join(
        self, record: dict[str, str], parts: list[str], which: str, suffix: str
    ) -> NewFile | None:
        storage = self._files.storage
        file_id = result_file_id(record["id"], which)
        size = await anyio.to_thread.run_sync(storage.put, file_id, _joined(storage, parts, suffix))
        if size == 0:
            await anyio.to_thread.run_sync(storage.delete, file_id)
            return None
        now = int(time.time())
        expires_s = int(record.get("output_expires_after_s") or 0)
        name = f"{record['id']}_{which}.jsonl"
        return NewFile(file_id, record["owner"], size, now, name, FilePurpose.BATCH_OUTPUT,
                       now + expires_s if expires_s else 0)  # fmt: skip


#: The error of a line a batch never ran, by how the batch ended (OpenAI's codes).
_NOT_RUN = {
    BatchStatus.CANCELLED: ("batch_cancelled", "the batch was cancelled before this request ran"),
    BatchStatus.EXPIRED: (
        "batch_expired",
        "this request could not be executed before the completion window expired",
    ),
}


def _webhook_message(record: dict[str, str], status: BatchStatus) -> bytes:
    """The batch.<status> delivery message when the batch has a webhook URL."""
    if not record.get("webhook_url"):
        return b""
    event = f"batch.{status.value}"
    return task_message(keys.BATCH_WEBHOOK_TASK, new_id(), [record["id"], event], keys.WEBHOOK_QUEUE, 0)


def _ending(record: dict[str, str]) -> BatchStatus | None:
    """How a batch is being wound up early (None: it is running to completion)."""
    if record["status"] == BatchStatus.CANCELLING:
        return BatchStatus.CANCELLED
    return BatchStatus(record["ending"]) if record.get("ending") else None


def _job_line(
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
        return number, _wound_up(batch_id, number, custom_id, ending), False
    return number, job_result(batch_id, number, entry, kind, job), status is JobStatus.SUCCEEDED


def _wound_up(batch_id: str, number: int, custom_id: str, ending: BatchStatus) -> bytes:
    code, message = _NOT_RUN[ending]
    return error_result(batch_id, number, custom_id, code, message)


def _joined(storage: FileStorage, parts: list[str], suffix: str) -> Iterator[bytes]:
    for part in parts:
        yield from storage.read(part + suffix)


def _delete_part(storage: FileStorage, part: str) -> None:
    storage.delete(part + ".out")
    storage.delete(part + ".err")


def _delete_parts(storage: FileStorage, parts: list[str]) -> None:
    for part in parts:
        _delete_part(storage, part)
