"""Job records in Redis: one hash per job, moved between statuses by atomic Lua scripts.

Every move is checked and set inside Redis by one script (shared/lua/): queued -> running ->
terminal, and running -> queued only when the store hands a job back (a drain, an engine death,
or a lease that lapsed). A running job carries a lease its worker renews; the reaper
(shared/reaper.py) hands back jobs whose lease lapsed. So a redelivered message never re-runs a
finished job, and a job ends exactly once. The API side (`JobStore`, asyncio) creates, reads,
cancels and lists; the worker side (`WorkerJobs`, blocking) claims, renews, finishes and hands
back. Both share the record codec below.
"""

from __future__ import annotations

import enum
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import cached_property
from typing import Any, cast

import orjson
import redis
import redis.asyncio as aioredis

from shared import keys, scripts
from shared.autopipeline import Commands
from shared.cache import CacheEntry
from shared.errors import QuotaExceeded
from shared.messages import task_message
from shared.schemas import JobCoreView, JobStatus, JobSummaryView, JobView

TIMEOUT_ERROR = orjson.dumps(
    {"type": "timeout", "message": "the job reached its deadline (GENQ_JOB_TIMEOUT_S) before it ran"}
)
#: The error of a job whose worker was lost (its lease lapsed) on each of GENQ_MAX_ATTEMPTS runs.
WORKER_LOST_ERROR = orjson.dumps(
    {
        "type": "worker_lost",
        "message": "the job's worker stopped (crash, kill or hang) on every attempt (GENQ_MAX_ATTEMPTS)",
    }
)


def rfc3339(epoch: str | float | None) -> str | None:
    if epoch is None or epoch == "":
        return None
    moment = datetime.fromtimestamp(float(epoch), UTC)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _json_or_none(raw: str | None) -> Any:
    return orjson.loads(raw) if raw else None


def public_job(record: dict[str, str]) -> JobView:
    """The job as the API returns it, from its Redis hash: its core view with input, output and
    metrics."""
    metrics = _json_or_none(record.get("metrics")) or {}
    started = record.get("started_at")
    if started and "queue_ms" not in metrics:
        metrics["queue_ms"] = round((float(started) - float(record["created_at"])) * 1000, 3)
    return {
        **_core(record),
        "input": orjson.loads(record["input"]),
        "output": _json_or_none(record.get("output")),
        "metrics": {
            "queue_ms": metrics.get("queue_ms"),
            "inference_ms": metrics.get("inference_ms"),
            "batch_size": metrics.get("batch_size"),
        },
    }


#: The record fields a job summary is made of (never input or output: they can be MiBs).
SUMMARY_FIELDS = (
    "id", "owner", "status", "model", "model_label", "preview", "error", "created_at", "started_at",
    "completed_at", "cached", "metadata",
)  # fmt: skip


def job_summary(record: dict[str, str]) -> JobSummaryView:
    """A job as lists return it: its core view with the start of its input (no input, output or
    metrics)."""
    return {**_core(record), "preview": record.get("preview") or ""}


def _core(record: dict[str, str]) -> JobCoreView:
    job_id = record["id"]
    url = f"/v1/jobs/{job_id}"
    created_at = rfc3339(record["created_at"])
    assert created_at is not None  # every record is written with one
    return {
        "id": job_id,
        "status": JobStatus(record["status"]),
        "model": record["model"],
        "model_label": record.get("model_label") or None,
        "error": _json_or_none(record.get("error")),
        "created_at": created_at,
        "started_at": rfc3339(record.get("started_at")),
        "completed_at": rfc3339(record.get("completed_at")),
        "cached": record.get("cached") == "1",
        "metadata": orjson.loads(record.get("metadata") or "{}"),
        "urls": {"get": url, "cancel": f"{url}/cancel", "stream": f"{url}/stream"},
    }


def is_terminal(record: dict[str, str]) -> bool:
    return JobStatus(record["status"]).is_terminal()


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

    def fields_json(self) -> bytes:
        """The record as the submit script takes it: [field, value, field, value, ...]."""
        return orjson.dumps([item for pair in self.record.items() for item in pair])


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


def as_text(value: bytes | str) -> str:
    """A Redis reply item as text (clients may be built with or without decode_responses)."""
    return value.decode() if isinstance(value, bytes) else value


def _record(flat: list[bytes | str]) -> dict[str, str]:
    return {as_text(flat[i]): as_text(flat[i + 1]) for i in range(0, len(flat), 2)}


def _submit_cache_keys(cache: CacheLookup | None) -> list[str]:
    """The submit script's in-flight and cache-entry keys."""
    if cache is None:
        return ["", ""]
    entry = keys.cache_entry(cache.cache_key) if cache.look_up and cache.known is None else ""
    return [keys.inflight(cache.cache_key), entry]


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
        reply = await self._commands.run_script(
            self._submit,
            keys=[keys.job(job.job_id), keys.owner_jobs(job.owner), queue_key, idem_key, *cache_keys,
                  keys.owner_live(job.owner)],
            args=[job.job_id, score, self._job_ttl_s, message, self._idempotency_ttl_s,
                  f"{job.job_id} {digest}", f"({trim_below}", repr(time.time()),
                  known.output if known else "", known.model_label if known else "", job.fields_json(),
                  bounds.live_jobs, bounds.stored_bytes, job.stored_bytes, today,
                  -(-self._job_ttl_s // 86_400)],
        )  # fmt: skip
        outcome = int(reply[0])
        if outcome == SUBMIT_HIT:
            return Submitted(job.job_id, created=True, hit_record=_record(reply[1:]))
        if outcome == SUBMIT_FOLLOWS:
            return Submitted(job.job_id, created=True, follows=as_text(reply[1]))
        if outcome == SUBMIT_QUEUED:
            return Submitted(job.job_id, created=True)
        if outcome == SUBMIT_OVER_BOUND:
            raise _over_bound(as_text(reply[1]), int(reply[2]))
        existing_id, existing_digest = as_text(reply[1]).split(" ", 1)
        return Submitted(existing_id, created=False, request_digest=existing_digest)

    async def get(self, job_id: str, owner: str) -> dict[str, str] | None:
        record = cast(dict[str, str], await self._commands.execute("HGETALL", keys.job(job_id)))
        if not record or record.get("owner") != owner:
            return None
        return record

    async def webhook_log(self, job_id: str, newest: int) -> list[dict[str, Any]]:
        rows = await self._redis.lrange(keys.webhook_log(job_id), -newest, -1)
        return [orjson.loads(row) for row in rows]

    async def get_summaries(self, job_ids: list[str]) -> list[dict[str, str]]:
        """The SUMMARY_FIELDS of each job that still exists (one pipelined round trip)."""
        async with self._redis.pipeline(transaction=False) as pipe:
            for job_id in job_ids:
                pipe.hmget(keys.job(job_id), list(SUMMARY_FIELDS))
            rows = await pipe.execute()
        found = [{f: v for f, v in zip(SUMMARY_FIELDS, row, strict=True) if v is not None} for row in rows]
        return [record for record in found if "id" in record]

    async def cancel(self, job_id: str, owner: str) -> dict[str, str] | None:
        flat = await self._commands.run_script(
            self._cancel, keys=[keys.job(job_id)], args=[owner, repr(time.time()), job_id]
        )
        if not flat:
            return None
        return _record(flat)

    async def page(self, owner: str, max_score: str, count: int) -> list[tuple[str, float]]:
        """Job ids of an owner, newest first, from max_score ('+inf' or a score) down."""
        rows = await self._redis.zrange(
            keys.owner_jobs(owner), max_score, "-inf", byscore=True, desc=True,
            offset=0, num=count, withscores=True,
        )  # fmt: skip
        return cast(list[tuple[str, float]], rows)


def _over_bound(bound: str, limit: int) -> QuotaExceeded:
    setting = {"live_jobs": "GENQ_MAX_LIVE_JOBS_PER_KEY", "stored_bytes": "GENQ_MAX_STORED_BYTES_PER_KEY"}
    what = {"live_jobs": f"{limit} queued or running jobs", "stored_bytes": f"{limit} bytes of job input"}
    return QuotaExceeded(
        f"this API key holds {what[bound]} ({setting[bound]}); wait for some to finish or expire",
        param=bound,
    )


class ClaimOutcome(enum.StrEnum):
    """What the claim script decided about a delivered job."""

    CLAIMED = "claimed"
    SKIP = "skip"
    EXPIRED = "expired"
    EXHAUSTED = "exhausted"
    MISSING = "missing"


@dataclass(frozen=True, slots=True)
class Claim:
    outcome: ClaimOutcome
    status: str
    #: The job's record as the claim left it (CLAIMED only; empty otherwise).
    record: dict[str, str] = field(default_factory=dict)


def job_message(job_id: str, queue: str, priority: int) -> tuple[bytes, str]:
    """A fresh Celery message for a job and the list it goes onto (hand-backs and the reaper)."""
    message = task_message(keys.GENERATE_TASK, job_id, [job_id], queue, priority)
    return message, keys.queue_key(queue, priority)


class WorkerJobs:
    """The worker's view of job records (blocking; called from Celery task threads)."""

    def __init__(self, client: redis.Redis, lease_s: float, max_attempts: int, job_timeout_s: float) -> None:
        self._redis = client
        self._lease_s = lease_s
        self._max_attempts = max_attempts
        self._job_timeout_s = job_timeout_s
        self._start = client.register_script(scripts.source("claim"))
        self._renew = client.register_script(scripts.source("renew"))
        self._finish = client.register_script(scripts.source("finish"))
        self._hand_back = client.register_script(scripts.source("hand_back"))

    def claim(self, job_id: str, worker_id: str) -> Claim:
        outcome, status, *flat = self._start(
            keys=[keys.job(job_id)],
            args=[worker_id, repr(time.time()), self._lease_s, TIMEOUT_ERROR, job_id, self._max_attempts,
                  WORKER_LOST_ERROR],
        )  # fmt: skip
        return Claim(ClaimOutcome(as_text(outcome)), as_text(status), _record(flat))

    def renew(self, worker_id: str, job_ids: list[str]) -> list[str]:
        """Extend the leases of the jobs this worker runs; the ids it no longer holds."""
        if not job_ids:
            return []
        lost = self._renew(args=[worker_id, repr(time.time() + self._lease_s), *job_ids])
        return [as_text(job_id) for job_id in lost]

    def finish(
        self,
        job_id: str,
        worker_id: str,
        fields: dict[str, str | bytes],
        cache_entry: tuple[str, int] | None = None,
    ) -> bool:
        """End the job this worker holds (False: it ended elsewhere, e.g. canceled). cache_entry is
        (cache key, ttl): on success the response is stored there in the same step."""
        flat = [item for pair in fields.items() for item in pair]
        entry_key, ttl = (keys.cache_entry(cache_entry[0]), cache_entry[1]) if cache_entry else ("", 0)
        done = self._finish(
            keys=[keys.job(job_id), entry_key],
            args=[worker_id, job_id, ttl, "completed_at", repr(time.time()), *flat],
        )
        return bool(done)

    def hand_back(self, job_id: str, worker_id: str, record: dict[str, str], *, count_attempt: bool) -> bool:
        """Put a job this worker holds back in the queue with a fresh deadline (drain, engine death)."""
        message, queue_list = job_message(job_id, record["queue"], int(record.get("priority") or 0))
        now = time.time()
        done = self._hand_back(
            keys=[keys.job(job_id)],
            args=[worker_id, job_id, message, queue_list, repr(now), repr(now + self._job_timeout_s),
                  "1" if count_attempt else "0"],
        )  # fmt: skip
        return bool(done)

    def publish_model(self, model_id: str, fingerprint: str) -> None:
        """Tell the API tier which revision of the model this worker serves (cache keys use it)."""
        self._redis.hset(keys.MODELS, model_id, fingerprint)

    def heartbeat(self, worker_id: str, registry: str = keys.WORKERS, slots: int | None = None) -> None:
        """Say this worker is alive; a model worker also says how many jobs it runs at once."""
        pipe = self._redis.pipeline(transaction=False)
        pipe.zadd(registry, {worker_id: time.time()})
        if slots is not None:
            pipe.hset(keys.WORKER_SLOTS, worker_id, slots)
        pipe.execute()

    def leave(self, worker_id: str, registry: str = keys.WORKERS) -> None:
        pipe = self._redis.pipeline(transaction=False)
        pipe.zrem(registry, worker_id)
        pipe.hdel(keys.WORKER_SLOTS, worker_id)
        pipe.execute()


async def live_workers(client: aioredis.Redis, heartbeat_ttl_s: float) -> int:
    """How many model workers sent a heartbeat within heartbeat_ttl_s."""
    return int(await client.zcount(keys.WORKERS, time.time() - heartbeat_ttl_s, "+inf"))


async def fleet_slots(client: aioredis.Redis, heartbeat_ttl_s: float, unknown: int) -> int:
    """Job slots of the model workers that sent a heartbeat within heartbeat_ttl_s; a live worker
    that published none (an older version) counts as `unknown` slots."""
    live = cast(list[str], await client.zrangebyscore(keys.WORKERS, time.time() - heartbeat_ttl_s, "+inf"))
    if not live:
        return 0
    slots = await client.hmget(keys.WORKER_SLOTS, live)
    return sum(int(s) if s is not None else unknown for s in slots)
