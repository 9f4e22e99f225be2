"""The API's one door to the queue: submit, read, wait for, cancel and list jobs.

Routes call this and nothing else; it owns validation that needs settings (served models,
the max_tokens cap), idempotency, and long-poll waiting.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import random
import time
from dataclasses import dataclass, replace
from typing import Any

import orjson

from api.edge.concurrency import ConcurrencyLimits, Held, Slot
from api.edge.ratelimit import RateLimiter
from api.jobs.cache import Lookup, ResponseCache
from api.jobs.events import JobEvents, set_within
from api.jobs.listing import list_page
from api.jobs.queue_stats import QueueStatsReader
from api.jobs.store import JobStore, NewJob
from api.jobs.stream_hub import StreamHub
from api.jobs.streams import OutputEntry, OutputStreams, page_command, page_of
from shared import key_secrets, keys, metrics
from shared.config import Settings
from shared.errors import Conflict, InvalidRequest, NotFound, Overloaded, StorageRefused
from shared.ids import is_job_id, new_id
from shared.jobqueue.kombu_layout import task_message
from shared.jobqueue.records import encode_input, is_terminal, public_job
from shared.jobspec import JobSpec
from shared.schemas import JobCreate, JobStatus, JobSummaryView, JobView, WebhookEvent
from shared.ssrf import check_url

#: The newest webhook delivery attempts a log read returns (a long job's `output` events add many).
WEBHOOK_LOG_SHOWN = 1000

#: Characters of a job's prompt (or last message) its summary shows in lists.
PREVIEW_CHARS = 120

#: Long-pollers re-read the record at least this often, whatever pub/sub says. Pub/sub wakes them
#: when their job ends and the hub wakes everyone after a reconnect, so this only bounds the delay
#: of a lost message; 1,000 pollers cost 1,000 / RECHECK_S reads a second (bench/scale.py).
RECHECK_S = 5.0


@dataclass(frozen=True, slots=True)
class Accepted:
    job: JobView
    #: False when an Idempotency-Key replay returned an existing job.
    created: bool
    #: True when this submission wrote the job as queued (in its queue, or following a job in
    #: flight): its record is the one `job` shows, so a wait need not read it back.
    queued: bool = False


def request_digest(create: JobCreate) -> str:
    """The body's digest an Idempotency-Key replay is compared with: the fields it sets apart from
    their defaults, so a field added to the spec (a default every older body has) changes nothing."""
    canonical = orjson.dumps(
        create.model_dump(mode="json", exclude_defaults=True), option=orjson.OPT_SORT_KEYS
    )
    return hashlib.sha256(canonical).hexdigest()


class JobQueue:
    def __init__(
        self,
        settings: Settings,
        store: JobStore,
        events: JobEvents,
        streams: OutputStreams,
        queue_stats: QueueStatsReader,
        cache: ResponseCache,
        hub: StreamHub,
        rate_limiter: RateLimiter | None = None,
    ) -> None:
        self._settings = settings
        #: Charges a caller's submission its rows beyond the one token its request took.
        self._rate_limiter = rate_limiter
        self._hub = hub
        self._limits = ConcurrencyLimits(settings)
        self._cache = cache
        self._store = store
        self._events = events
        self._streams = streams
        self._queue_stats = queue_stats

    def _check(self, create: JobCreate) -> tuple[str, int]:
        model = create.model or self._settings.model
        served = self._settings.served_models
        if model not in served:
            raise InvalidRequest(
                f"model {model!r} is not served; served models: {', '.join(served)}", param="model"
            )
        max_tokens = self._settings.default_max_tokens if create.max_tokens is None else create.max_tokens
        cap = self._settings.max_tokens_cap
        if max_tokens > cap:
            raise InvalidRequest(f"max_tokens is {max_tokens}; the most allowed is {cap}", param="max_tokens")
        error = create.length_error(max_tokens)
        if error is not None:
            raise InvalidRequest(error[1], param=error[0])
        return model, max_tokens

    async def submit(
        self, create: JobCreate, owner: str, idempotency_key: str | None, *, charged: bool = False
    ) -> Accepted:
        """Accept a job. `charged`: a caller's request, whose submit bucket pays the job's rows
        beyond the token the request took (the batch feeder's lines are bounded by their share)."""
        return await self._submit(create, owner, idempotency_key, new_id(), charged)

    async def submit_and_wait(
        self,
        create: JobCreate,
        owner: str,
        idempotency_key: str | None,
        timeout_s: float,
        *,
        charged: bool = False,
    ) -> Accepted:
        """submit(), then wait() for the job: `job` is the job as the wait left it.

        The new job's watch is set before its submit script is sent. The PUBLISH that ends the
        job can only follow that script, so it cannot be missed, and a job the script queued is
        not read back (its record is the one this API wrote a round trip ago): the wait starts on
        the event. A cache hit or an idempotent replay is read as any wait reads.
        """
        job_id = new_id()
        with self._events.watch(job_id) as changed:
            accepted = await self._submit(create, owner, idempotency_key, job_id, charged)
            if accepted.queued:
                job = await self._wait(job_id, owner, timeout_s, changed, read_first=False)
                return replace(accepted, job=job)
        return replace(accepted, job=await self.wait(accepted.job["id"], owner, timeout_s))

    async def _submit(
        self, create: JobCreate, owner: str, idempotency_key: str | None, job_id: str, charged: bool
    ) -> Accepted:
        model, max_tokens = self._check(create)
        if charged and self._rate_limiter is not None:
            await self._rate_limiter.take_rest(owner, create.rows)
        if create.webhook is not None:
            await key_secrets.require_own_secret(self._store.redis, owner, self._settings, "webhook")
            await check_url(str(create.webhook), self._settings.webhook_policy)
        spec = create.spec(max_tokens)
        scope = owner if self._settings.cache_scoped_per_key else ""
        model, lookup = await self._route(create, model, spec, scope)
        now = time.time()
        job = NewJob(
            job_id=job_id,
            owner=owner,
            model=model,
            queue=keys.queue_for_model(model),
            input_json=encode_input(spec),
            metadata_json=orjson.dumps(create.metadata),
            created_at=now,
            deadline=now + self._settings.job_timeout_s,
            priority=create.priority.broker_priority,
            webhook_messages=_webhook_messages(job_id, create),
            cache_key=lookup.request.cache_key if lookup else "",
            cache_scope=scope,
            preview=job_preview(create),
            rows=create.rows,
        )
        priority = create.priority.broker_priority
        message = task_message(keys.GENERATE_TASK, job.job_id, [job.job_id], job.queue, priority)
        idempotency = None
        digest = ""
        if idempotency_key is not None:
            digest = request_digest(create)
            idempotency = (keys.idempotency(owner, idempotency_key), digest)
        queue_key = keys.queue_key(job.queue, priority)
        cache = lookup.request if lookup else None
        submitted = await self._store.submit(job, message, queue_key, idempotency, cache)
        if lookup is not None:
            self._cache.settle(lookup, submitted)
        if submitted.created:
            # A follower stays queued until its leader ends; a cache hit is already succeeded.
            hit = submitted.hit_record
            return Accepted(public_job(hit or job.record), created=True, queued=hit is None)
        if submitted.request_digest != digest:
            raise Conflict(
                "this Idempotency-Key was used with a different request body", param="Idempotency-Key"
            )
        return Accepted(await self.get(submitted.job_id, owner), created=False)

    async def _route(
        self, create: JobCreate, model: str, spec: JobSpec, scope: str
    ) -> tuple[str, Lookup | None]:
        """The model the job goes to and its response-cache lookup (None: not cacheable).

        A response already found needs no room in the queue, so admission control is asked
        only otherwise; a fallback model has its own fingerprint, hence its own key.
        """
        lookup = await self._lookup(model, spec, scope)
        if lookup is not None and lookup.level is not None:
            return model, lookup
        admitted = await self._admit(create, model)
        if admitted != model:
            lookup = await self._lookup(admitted, spec, scope)
        return admitted, lookup

    async def _lookup(self, model: str, spec: JobSpec, scope: str) -> Lookup | None:
        cache_key = await self._cache.key_for(model, spec, scope)
        return None if cache_key is None else await self._cache.lookup(cache_key)

    async def _admit(self, create: JobCreate, model: str) -> str:
        """Admission control: the model to queue on, or Overloaded when its queue is full.

        A full queue sheds the job with 503, unless the request allows a fallback and one is
        configured: then it goes to the fallback model's queue (its record names that model).
        """
        bound = self._settings.max_queue_length
        await self._check_storage()
        if not bound or await self._queue_stats.length(keys.queue_for_model(model)) < bound:
            return model
        fallback = self._settings.fallback_model
        fallback_open = (
            create.allow_fallback
            and fallback is not None
            and fallback != model
            and await self._queue_stats.length(keys.queue_for_model(fallback)) < bound
        )
        if fallback_open and fallback is not None:
            metrics.SHED.labels("fallback").inc()
            return fallback
        metrics.SHED.labels("queue_full").inc()
        raise Overloaded(
            f"the queue of {model!r} holds {bound} or more jobs; retry later"
            + ("" if create.allow_fallback else ", or allow a fallback model with allow_fallback"),
            retry_after_s=self._settings.overload_retry_after_s,
        )

    async def _check_storage(self) -> None:
        """Storage back-pressure: past GENQ_STORAGE_HEADROOM of Redis's maxmemory, new jobs wait
        (503, Retry-After), so jobs already accepted can still finish and reads still work."""
        memory = (await self._queue_stats.read()).memory
        if memory.fraction() > self._settings.storage_headroom:
            metrics.SHED.labels("storage_full").inc()
            raise StorageRefused(
                f"the job store is {memory.fraction():.0%} full (GENQ_STORAGE_HEADROOM "
                f"{self._settings.storage_headroom:g} of Redis maxmemory); retry shortly",
                retry_after_s=self._settings.overload_retry_after_s,
            )

    async def get(self, job_id: str, owner: str) -> JobView:
        _require_job_id(job_id)
        return _found(job_id, await self._store.get(job_id, owner))

    async def wait(self, job_id: str, owner: str, timeout_s: float) -> JobView:
        """The job once it is terminal, or as it is when timeout_s has passed."""
        _require_job_id(job_id)
        with self._events.watch(job_id) as changed:
            return await self._wait(job_id, owner, timeout_s, changed)

    async def _wait(
        self, job_id: str, owner: str, timeout_s: float, changed: asyncio.Event, *, read_first: bool = True
    ) -> JobView:
        """wait() on a job watched through `changed`; without read_first, the first read comes
        on the event (or the recheck), not at once."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + min(timeout_s, self._settings.max_wait_s)
        if not read_first:
            await _changed_or_recheck(changed, deadline - loop.time())
        while True:
            # Cleared before the read, never after: a job that ends while the read is in
            # flight sets the event during the await, and clearing it then lost the wake-up
            # (the answer waited for the recheck, 2.5-5 s; bench/machinery.py saw p99 3.9 s).
            changed.clear()
            record = await self._store.get(job_id, owner)
            if record is None:
                raise _no_job(job_id)
            remaining = deadline - loop.time()
            if is_terminal(record) or remaining <= 0:
                return public_job(record)
            await _changed_or_recheck(changed, remaining)

    async def get_with_entries(
        self, job_id: str, owner: str, after_id: str
    ) -> tuple[JobView, list[OutputEntry]]:
        """The job, and up to READ_COUNT of its stream's entries after `after_id`, read right after
        the record in the same round trip. Once the record is terminal that read holds every
        entry the job will have (its worker writes the last ones before the record turns
        terminal), unless the page is full."""
        _require_job_id(job_id)
        record, rows = await self._store.get_then(job_id, owner, page_command(job_id, after_id))
        return _found(job_id, record), page_of(rows)

    async def stream_entries(self, job_id: str, after_id: str) -> list[OutputEntry]:
        """The job's output deltas after entry `after_id`, without waiting. Callers check the owner
        with get() first."""
        return await self._streams.read_all(job_id, after_id)

    def hold(self, owner: str, kind: Held) -> Slot:
        """A slot for a request held open (a stream, a long-poll), or ConcurrencyLimited when
        the owner holds its limit already; release it when the request ends."""
        return self._limits.acquire(owner, kind)

    def follow_stream(self, job_id: str, event: asyncio.Event) -> contextlib.AbstractContextManager[None]:
        """Within the block, `event` is set when the job's stream gets entries (api/jobs/stream_hub.py)."""
        return self._hub.follow(job_id, event)

    def watch(
        self, job_id: str, event: asyncio.Event | None = None
    ) -> contextlib.AbstractContextManager[asyncio.Event]:
        """An event (`event`, or a new one) set when the job may have ended (re-read it to know)."""
        return self._events.watch(job_id, event)

    async def webhook_log(self, job_id: str, owner: str) -> list[dict[str, Any]]:
        """The job's webhook delivery attempts, oldest first (the newest WEBHOOK_LOG_SHOWN)."""
        await self.get(job_id, owner)  # 404 unless the job exists and is the caller's
        return await self._store.webhook_log(job_id, WEBHOOK_LOG_SHOWN)

    async def cancel(self, job_id: str, owner: str) -> JobView:
        _require_job_id(job_id)
        return _found(job_id, await self._store.cancel(job_id, owner))

    async def list(
        self, owner: str, status: JobStatus | None, limit: int, cursor: int | None
    ) -> tuple[list[JobSummaryView], str | None]:
        """A page of the owner's job summaries, newest first (api/jobs/listing.py): it ends early,
        with a cursor, before the summaries read pass list_max_bytes."""
        return await list_page(self._store, owner, status, limit, cursor, self._settings.list_max_bytes)


async def _changed_or_recheck(changed: asyncio.Event, remaining: float) -> None:
    """Until `changed` is set, `remaining` seconds pass, or a recheck is due."""
    # Jittered, so pollers that arrived together do not re-read together.
    await set_within(changed, min(remaining, RECHECK_S * random.uniform(0.5, 1.0)))


def job_preview(create: JobCreate) -> str:
    """The start of what the job was asked (lists show it instead of the whole input)."""
    text = create.prompt if create.prompt is not None else (create.messages or [])[-1].content
    return text[:PREVIEW_CHARS]


def _webhook_messages(job_id: str, create: JobCreate) -> tuple[tuple[str, bytes], ...]:
    """Delivery messages for the job's start/completed events, built now so the job store's
    scripts can enqueue them atomically with the state change that causes them."""
    if create.webhook is None:
        return ()
    wanted = [e for e in (WebhookEvent.START, WebhookEvent.COMPLETED) if e in create.webhook_events_filter]
    return tuple(
        (
            event.value,
            task_message(keys.WEBHOOK_TASK, new_id(), [job_id, event.value], keys.WEBHOOK_QUEUE, 0),
        )
        for event in wanted
    )


def _require_job_id(job_id: str) -> None:
    """404 for anything that is not a job id, before Redis is asked (shared/ids.py)."""
    if not is_job_id(job_id):
        raise _no_job(job_id)


def _found(job_id: str, record: dict[str, str] | None) -> JobView:
    """The job's view of a record the store returned; 404 when it had none (no such job, or
    not the caller's)."""
    if record is None:
        raise _no_job(job_id)
    return public_job(record)


def _no_job(job_id: str) -> NotFound:
    return NotFound(f"no job {job_id!r}", param="id")
