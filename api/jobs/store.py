"""The API's side of job records (asyncio): submitting a job (record, idempotency, response
cache, coalescing and its message in one script, submit.lua), reading, cancelling and listing.
The record codec both tiers share is shared/jobqueue/records.py; the worker's side is workers/jobs.py."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cached_property, partial
from typing import Any, cast

import orjson
import redis.asyncio as aioredis

from api.redis_io.commands import Commands
from shared import keys
from shared.cache import CacheEntry
from shared.errors import QuotaExceeded
from shared.jobqueue import scripts
from shared.jobqueue.records import SUMMARY_FIELDS, as_text, flat_record
from shared.schemas import JobStatus


@dataclass(frozen=True)  # no slots: `record` is computed once and kept in the instance's __dict__
class NewJob:
    """Everything the API writes when it accepts a job."""

    job_id: str
    owner: str
    model: str
    queue: str
    input_json: bytes
    metadata_json: bytes
    created_at: float
    deadline: float
    #: kombu's priority step of the job's messages (0 is served first).
    priority: int = 0
    #: Pre-built webhook delivery messages by event ("start", "completed"), pushed by the scripts.
    webhook_messages: tuple[tuple[str, bytes], ...] = ()
    #: The response-cache key of a cacheable job ("" for none): coalescing and lookups use it.
    cache_key: str = ""
    #: The start of the prompt (or last message), for lists: they never read the whole input.
    preview: str = ""
    #: Whose cache the result goes to ("" shared); the worker keys its result with it.
    cache_scope: str = ""
    #: Sequences the engine runs for it (JobCreate.rows): what it counts against the live bound.
    rows: int = 1

    @cached_property
    def record(self) -> dict[str, str]:
        """The job's Redis hash as the submit script first writes it (the submission's reply
        shows it too, so it is built once)."""
        record = {
            keys.webhook_message_field(event): message.decode() for event, message in self.webhook_messages
        }
        if self.cache_key:
            record["cache_key"] = self.cache_key
        if self.preview:
            record["preview"] = self.preview
        if self.cache_scope:
            record["cache_scope"] = self.cache_scope
        if self.rows != 1:  # absent means 1 (submit.lua)
            record["rows"] = str(self.rows)
        record |= {
            "id": self.job_id, "owner": self.owner, "status": JobStatus.QUEUED.value, "model": self.model,
            "queue": self.queue, "input": self.input_json.decode(), "metadata": self.metadata_json.decode(),
            "created_at": repr(self.created_at), "deadline": repr(self.deadline), "cached": "0",
            "attempts": "0", "priority": str(self.priority),
        }  # fmt: skip
        return record

    @property
    def stored_bytes(self) -> int:
        """What the job's input costs its owner's stored-bytes bound."""
        return len(self.input_json) + len(self.metadata_json)

    def fields(self) -> list[str]:
        """The record as the submit script takes it: field, value, field, value, ..."""
        return [item for pair in self.record.items() for item in pair]


@dataclass(frozen=True, slots=True)
class CacheLookup:
    """What the submit script does with a cacheable job's key."""

    cache_key: str
    #: A response already found (level 1, or a dedicated cache Redis): the job succeeds with it.
    known: CacheEntry | None = None
    #: Look the entry up in the job store's Redis (when the shared cache level lives there).
    look_up: bool = False


@dataclass(frozen=True, slots=True)
class Submitted:
    job_id: str
    created: bool
    #: For an Idempotency-Key replay: the digest of the body that created the job.
    request_digest: str | None = None
    #: A cache hit: the job's record, already succeeded.
    hit_record: dict[str, str] | None = None
    #: A follower: the id of the job whose result it waits for.
    follows: str | None = None


#: The submit script's outcomes (the first item of its reply).
SUBMIT_REPLAY, SUBMIT_QUEUED, SUBMIT_HIT, SUBMIT_FOLLOWS, SUBMIT_OVER_BOUND = 0, 1, 2, 3, 4


def _submit_cache_keys(cache: CacheLookup | None) -> list[str]:
    """The submit script's in-flight and cache-entry keys."""
    if cache is None:
        return ["", ""]
    entry = keys.cache_entry(cache.cache_key) if cache.look_up and cache.known is None else ""
    return [keys.inflight(cache.cache_key), entry]


def submit_labels(job: NewJob, today: int, days: int, bounded: bool) -> list[str]:
    """The keys submit.lua touches beyond its KEYS, declared with it: the owner's stored bytes of
    today (and, with a bound on them, of every day a record lives), the queue's index, the job's
    webhook deliveries. A leader's keys, which only the script finds, it asks for."""
    first = today - days if bounded else today
    return [
        *(scripts.label("owner_bytes_key", job.owner, day) for day in range(first, today + 1)),
        scripts.label("queued_key", job.queue),
        scripts.label("webhook_delivery_key", job.job_id, "start"),
        scripts.label("webhook_delivery_key", job.job_id, "completed"),
    ]


def cancel_labels(job_id: str) -> list[str]:
    """The keys cancel.lua touches beyond its KEYS that its caller knows (the rest depend on the
    record: the script asks for them)."""
    return [
        scripts.label("followers_key", job_id),
        scripts.label("webhook_delivery_key", job_id, "completed"),
    ]


@dataclass(frozen=True, slots=True)
class JobHead:
    """What a list needs to know of a job before reading its summary."""

    status: JobStatus
    #: Bytes of its metadata and error: the summary's fields whose size the job's owner decides.
    summary_bytes: int


@dataclass(frozen=True, slots=True)
class OwnerBounds:
    """Per-key bounds the submit script enforces (0: no bound)."""

    live_jobs: int = 0
    stored_bytes: int = 0


class JobStore:
    """The API's view of job records (asyncio)."""

    def __init__(
        self,
        client: aioredis.Redis,
        commands: Commands,
        job_ttl_s: int,
        idempotency_ttl_s: int,
        bounds: Callable[[str], OwnerBounds] = lambda _owner: OwnerBounds(),
    ) -> None:
        self._redis = client
        #: The hot commands (submit, read, cancel) go through it, pipelined with other requests'.
        self._commands = commands
        self._job_ttl_s = job_ttl_s
        self._idempotency_ttl_s = idempotency_ttl_s
        self._bounds = bounds
        self._submit = client.register_script(scripts.source("submit"))
        self._cancel = client.register_script(scripts.source("cancel"))
        #: Each script through the pipelined runner, with the keys its call declares
        #: (shared/jobqueue/scripts.py).
        self._run_submit = partial(self._commands.run_script, self._submit)
        self._run_cancel = partial(self._commands.run_script, self._cancel)

    async def load_scripts(self) -> None:
        """SCRIPT LOAD the scripts jobs run here, at start-up: the first job then pays no NOSCRIPT
        reply, load and retry (+2 round trips). After a Redis restart forgets them, run_script's
        NOSCRIPT fallback loads them again, as before."""
        for script in (self._submit, self._cancel):
            await self._redis.script_load(script.script)

    async def submit(
        self,
        job: NewJob,
        message: bytes,
        queue_key: str,
        idempotency: tuple[str, str] | None = None,
        cache: CacheLookup | None = None,
    ) -> Submitted:
        """Write the record and enqueue its message atomically (one round trip).

        idempotency is (key, request digest): when the key already names a job, nothing is
        written and that job is returned instead. With `cache`, a cached response makes the job
        succeed at once (nothing enqueued), and a job in flight for the same key makes it a
        follower of that job (nothing enqueued either); otherwise it becomes that key's leader.
        Raises QuotaExceeded (nothing written) when the owner is at one of its bounds.
        """
        idem_key, digest = idempotency or ("", "")
        score = int(job.created_at * 1_000_000)
        trim_below = score - self._job_ttl_s * 1_000_000
        known = cache.known if cache is not None else None
        cache_keys = _submit_cache_keys(cache)
        today = int(job.created_at // 86_400)
        bounds = self._bounds(job.owner)
        days = -(-self._job_ttl_s // 86_400)
        reply = await scripts.run_async(
            self._run_submit,
            keys=[keys.job(job.job_id), keys.owner_jobs(job.owner), queue_key, idem_key, *cache_keys,
                  keys.owner_live(job.owner)],
            args=[job.job_id, score, self._job_ttl_s, message, self._idempotency_ttl_s,
                  f"{job.job_id} {digest}", f"({trim_below}", repr(time.time()),
                  known.output if known else "", known.model_label if known else "",
                  bounds.live_jobs, bounds.stored_bytes, job.stored_bytes, today, days, *job.fields()],
            labels=submit_labels(job, today, days, bounds.stored_bytes > 0),
        )  # fmt: skip
        outcome = int(reply[0])
        if outcome == SUBMIT_HIT:
            return Submitted(job.job_id, created=True, hit_record=flat_record(reply[1:]))
        if outcome == SUBMIT_FOLLOWS:
            return Submitted(job.job_id, created=True, follows=as_text(reply[1]))
        if outcome == SUBMIT_QUEUED:
            return Submitted(job.job_id, created=True)
        if outcome == SUBMIT_OVER_BOUND:
            raise _over_bound(as_text(reply[1]), int(reply[2]))
        existing_id, existing_digest = as_text(reply[1]).split(" ", 1)
        return Submitted(existing_id, created=False, request_digest=existing_digest)

    async def get(self, job_id: str, owner: str) -> dict[str, str] | None:
        return _owned(await self._commands.execute("HGETALL", keys.job(job_id)), owner)

    async def get_then(
        self, job_id: str, owner: str, then: Sequence[Any]
    ) -> tuple[dict[str, str] | None, Any]:
        """get(), and the reply to `then`, a command Redis runs right after reading the record
        (api/redis_io/batching.py execute_in_order): one round trip for both."""
        record, reply = await self._commands.execute_in_order(("HGETALL", keys.job(job_id)), then)
        return _owned(record, owner), reply

    @property
    def redis(self) -> aioredis.Redis:
        """The store's Redis client, for reads beside the job records (a key's webhook secrets)."""
        return self._redis

    async def webhook_log(self, job_id: str, newest: int) -> list[dict[str, Any]]:
        rows = await self._redis.lrange(keys.webhook_log(job_id), -newest, -1)
        return [orjson.loads(row) for row in rows]

    async def heads(self, job_ids: list[str]) -> list[JobHead | None]:
        """Each job's head (None: it no longer exists): its status and the bytes of its summary's
        variable fields, without reading them (one pipelined round trip)."""
        async with self._redis.pipeline(transaction=False) as pipe:
            for job_id in job_ids:
                pipe.hget(keys.job(job_id), "status")
                pipe.hstrlen(keys.job(job_id), "metadata")
                pipe.hstrlen(keys.job(job_id), "error")
            rows = await pipe.execute()
        return [
            None if status is None else JobHead(JobStatus(status), int(metadata) + int(error))
            for status, metadata, error in zip(rows[::3], rows[1::3], rows[2::3], strict=True)
        ]

    async def get_summaries(self, job_ids: list[str]) -> list[dict[str, str]]:
        """The SUMMARY_FIELDS of each job that still exists (one pipelined round trip)."""
        async with self._redis.pipeline(transaction=False) as pipe:
            for job_id in job_ids:
                pipe.hmget(keys.job(job_id), list(SUMMARY_FIELDS))
            rows = await pipe.execute()
        found = [{f: v for f, v in zip(SUMMARY_FIELDS, row, strict=True) if v is not None} for row in rows]
        return [record for record in found if "id" in record]

    async def cancel(self, job_id: str, owner: str) -> dict[str, str] | None:
        flat = await scripts.run_async(
            self._run_cancel, keys=[keys.job(job_id)], args=[owner, repr(time.time()), job_id],
            labels=cancel_labels(job_id),
        )  # fmt: skip
        if not flat:
            return None
        return flat_record(flat)

    async def page(self, owner: str, max_score: str, count: int) -> list[tuple[str, float]]:
        """Job ids of an owner, newest first, from max_score ('+inf' or a score) down."""
        rows = await self._redis.zrange(
            keys.owner_jobs(owner), max_score, "-inf", byscore=True, desc=True,
            offset=0, num=count, withscores=True,
        )  # fmt: skip
        return cast(list[tuple[str, float]], rows)


def _over_bound(bound: str, limit: int) -> QuotaExceeded:
    setting = {"live_jobs": "GENQ_MAX_LIVE_JOBS_PER_KEY", "stored_bytes": "GENQ_MAX_STORED_BYTES_PER_KEY"}
    what = {
        "live_jobs": f"{limit} rows of queued or running jobs (a job counts n, or best_of, rows)",
        "stored_bytes": f"{limit} bytes of job input",
    }
    return QuotaExceeded(
        f"this job would take this API key past {what[bound]} ({setting[bound]}); "
        "wait for some to finish or expire",
        param=bound,
    )


def _owned(record: Any, owner: str) -> dict[str, str] | None:
    """An HGETALL reply as the owner's job record; None when there is none, or it is not theirs."""
    if not record or record.get("owner") != owner:
        return None
    return cast(dict[str, str], record)
