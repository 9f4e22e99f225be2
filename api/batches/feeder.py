"""The batch feeder: the loop that turns batches' input lines into ordinary genq jobs a bounded
number at a time, and their results into the batches' output and error files.

Each period, for every active batch (docs/batches.md has the policy):
1. validating: one streamed pass over the input file; whole-file problems fail the batch
   (api/batches/input_file.py);
2. collect: lines of its window whose jobs ended (or that were refused) are written to storage
   as one result part, then committed in Redis (they leave the window and count) in one step
   (api/batches/results.py);
3. top up: new lines are read from the input file at the batch's durable cursor and submitted
   as jobs, up to the batch's share of the capacity (api/batches/window.py; the share is
   api/batches/capacity.py's arithmetic);
4. wind up (cancelled or expired): its jobs in flight are canceled and the lines never fed are
   reported as `batch_cancelled` / `batch_expired`, so every line still has one result
   (api/batches/window.py);
5. finish: once the input is read and the window is empty, the parts are joined into the output
   and error files and the batch ends, in one script (api/batches/results.py).

It runs in every API process (it submits through the API's JobQueue); a Redis lock lets one of
them feed per period, and each step is guarded by the batch's own state (cursor, part number,
status), so two feeders at once still write each line's result exactly once. Everything it
knows lives in Redis and storage: an API killed mid-batch loses nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time

import redis.asyncio as aioredis
import redis.exceptions

from api.batches.capacity import batch_capacity, fair_shares
from api.batches.files import Files
from api.batches.input_file import lost_from_storage, validate_input
from api.batches.results import Results
from api.batches.window import Window
from api.jobs.fleet import fleet_slots
from api.jobs.queue import JobQueue
from api.jobs.schema_compile import SchemaChecker
from shared import keys
from shared.batches import BatchOutcome, BatchStatus, BatchStore
from shared.config import Settings
from shared.logging import fields

log = logging.getLogger("genq.batches")

#: After a period that did work, the next comes this soon (a busy batch is not held to the
#: interval); an idle feeder waits the whole interval.
BUSY_PAUSE_S = 0.05


class BatchFeeder:
    def __init__(
        self,
        settings: Settings,
        client: aioredis.Redis,
        store: BatchStore,
        files: Files,
        queue: JobQueue,
        schemas: SchemaChecker,
    ) -> None:
        self._settings = settings
        #: Compiles each distinct response-format schema of a batch once, at validation.
        self._schemas = schemas
        self._redis = client
        self._store = store
        self._files = files
        self._window = Window(store, files, queue, settings.batch_window, settings.batch_line_max_bytes)
        self._results = Results(store, files, queue, settings.batch_line_ttl_s)
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
        """One period's work, if this process holds the lock; whether anything moved. Expired
        files are swept first, lock or not (deleting one twice is harmless)."""
        swept = await self._files.sweep_expired()
        if not await self._store.any_active() or not await self._hold_lock():
            return swept > 0
        records = await self._store.active()
        shares = await self._shares(records)
        busy = False
        for record in records:
            try:
                busy |= await self._step(record, shares.get(record["id"], 0))
            except redis.exceptions.RedisError:
                raise  # Redis is every batch's: the period is over
            except Exception as exc:  # one batch's trouble (its storage, a bug) stalls no other batch
                log.warning(
                    "batch_step_failed", extra=fields(batch_id=record["id"], error=type(exc).__name__)
                )
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
        # In rows, not lines: a line of n samples runs n sequences on a worker (entry_rows).
        sizes = await self._store.window_rows([r["id"] for r in records])
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
        except FileNotFoundError as lost:  # its input's content, or its own files, went from storage
            # It fails with what can still be read: every period would otherwise fail the same way.
            return await self._results.finish(record, lost_from_storage(record, lost), partial=True)

    async def _advance(self, record: dict[str, str], share: int) -> bool:
        status = BatchStatus(record["status"])
        if status is BatchStatus.VALIDATING:
            return await self._validate(record)
        if status is BatchStatus.CANCELLING and record.get("validated") != "1":
            return await self._results.finish(record, BatchOutcome(BatchStatus.CANCELLED))
        if self._past_window(record):
            await self._store.mark_expiring(record["id"])
            record = await self._store.record(record["id"])
        ending = _ending(record)
        busy = await self._results.collect(record, ending)
        if ending is not None:
            busy |= await self._window.wind_up(record, ending)
        elif share:
            busy |= await self._window.top_up(record, share)
        record = await self._store.record(record["id"])
        if (
            record.get("input_done") == "1"
            and not (await self._store.window_size([record["id"]]))[record["id"]]
        ):
            busy |= await self._results.finish(record, BatchOutcome(ending or BatchStatus.COMPLETED))
        return busy

    async def _validate(self, record: dict[str, str]) -> bool:
        settings = self._settings
        ending = await validate_input(
            record,
            self._files,
            self._store,
            settings.batch_max_lines,
            settings.batch_line_max_bytes,
            schemas=self._schemas,
            schemas_max=settings.batch_schemas_max,
        )
        return True if ending is None else await self._results.finish(record, ending)

    @staticmethod
    def _past_window(record: dict[str, str]) -> bool:
        in_progress = record["status"] == BatchStatus.IN_PROGRESS and not record.get("ending")
        return in_progress and time.time() > float(record["expires_at"])


def _ending(record: dict[str, str]) -> BatchStatus | None:
    """How a batch is being wound up early (None: it is running to completion)."""
    if record["status"] == BatchStatus.CANCELLING:
        return BatchStatus.CANCELLED
    return BatchStatus(record["ending"]) if record.get("ending") else None
