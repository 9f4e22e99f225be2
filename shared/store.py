"""Job records in Redis: one hash per job, moved between statuses by atomic Lua scripts.

State only moves forward (queued -> running -> terminal), checked and set inside Redis, so
a redelivered message never re-runs a finished job nor regresses its status. The API side
(`JobStore`, asyncio) creates, reads, cancels and lists; the worker side (`WorkerJobs`,
blocking) claims and finishes. Both share the scripts and the record codec below.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import cached_property
from typing import Any, cast

import orjson
import redis
import redis.asyncio as aioredis

from shared import keys
from shared.autopipeline import AutoPipeline
from shared.cache import CacheEntry
from shared.schemas import JobStatus

# Functions prepended to the scripts that use them. push_webhook pushes a job's pre-built
# webhook message for `event` onto the webhook queue, once.
LUA_FUNCTIONS = """
local function push_webhook(job_key, queue_key, event)
  local field = 'webhook_message:' .. event
  local message = redis.call('HGET', job_key, field)
  if message then
    redis.call('LPUSH', queue_key, message)
    redis.call('HDEL', job_key, field)
  end
end

-- The set of a queue's running jobs (genq_queue_length subtracts them from the messages workers
-- hold), named from the job's queue field like keys.RUNNING.
local function running_set(job_key)
  return 'genq:running:' .. (redis.call('HGET', job_key, 'queue') or '')
end
"""


def _lua_key(name: str, template: str, param: str) -> str:
    """A Lua function building a key from keys.py's template (for keys named only in records)."""
    head, tail = template.split("{" + param + "}")
    return f"local function {name}({param}) return '{head}' .. {param} .. '{tail}' end\n"


#: metrics of a job answered without a generation of its own (a cache hit or a follower).
NO_INFERENCE_METRICS = '{"inference_ms":0}'

# Coalescing (docs/cache.md). A cacheable job that finds no job in flight for its cache key
# becomes the leader (keys.INFLIGHT names it); identical submissions meanwhile become followers,
# listed under the leader (keys.FOLLOWERS). The scripts that end the leader resolve its followers:
# its result or failure is copied into each one still queued; when the leader is canceled or
# expires in the queue, the oldest follower is promoted (its own message goes onto its queue) and
# the rest follow it. Follower keys come from job ids stored in Redis, so they are built here.
COALESCE_LUA = (
    _lua_key("job_key", keys.JOB, "job_id")
    + _lua_key("followers_key", keys.FOLLOWERS, "job_id")
    + _lua_key("inflight_key", keys.INFLIGHT, "cache_key")
    + f"local NO_INFERENCE_METRICS = '{NO_INFERENCE_METRICS}'\n"
    + """
local function release_inflight(leader_key, leader_id)
  local cache_key = redis.call('HGET', leader_key, 'cache_key')
  if cache_key and redis.call('GET', inflight_key(cache_key)) == leader_id then
    redis.call('DEL', inflight_key(cache_key))
  end
end

local function resolve_followers(leader_key, leader_id, webhook_queue, channel)
  local list = followers_key(leader_id)
  local r = redis.call('HMGET', leader_key, 'status', 'output', 'error', 'model_label', 'completed_at')
  for _, id in ipairs(redis.call('LRANGE', list, 0, -1)) do
    local key = job_key(id)
    if redis.call('HGET', key, 'status') == 'queued' then
      redis.call('HSET', key, 'status', r[1], 'model_label', r[4] or '', 'started_at', r[5],
                 'completed_at', r[5])
      if r[1] == 'succeeded' then
        redis.call('HSET', key, 'output', r[2], 'cached', '1', 'metrics', NO_INFERENCE_METRICS)
      else
        redis.call('HSET', key, 'error', r[3] or '')
      end
      push_webhook(key, webhook_queue, 'start')
      push_webhook(key, webhook_queue, 'completed')
      redis.call('PUBLISH', channel, id)
    end
  end
  redis.call('DEL', list)
end

local function promote_followers(leader_key, leader_id)
  local list = followers_key(leader_id)
  local ids = redis.call('LRANGE', list, 0, -1)
  redis.call('DEL', list)
  release_inflight(leader_key, leader_id)
  local leader = nil
  for _, id in ipairs(ids) do
    local key = job_key(id)
    local rec = redis.call('HMGET', key, 'status', 'message', 'queue_key', 'cache_key')
    if rec[1] == 'queued' and rec[2] then
      if leader == nil then
        leader = id
        local ttl = math.max(redis.call('TTL', key), 1)
        redis.call('HDEL', key, 'follows', 'message', 'queue_key')
        redis.call('LPUSH', rec[3], rec[2])
        redis.call('SET', inflight_key(rec[4]), id, 'NX', 'EX', ttl)
        redis.call('EXPIRE', followers_key(id), ttl)
      else
        redis.call('HSET', key, 'follows', leader)
        redis.call('RPUSH', followers_key(leader), id)
      end
    end
  end
end
"""
)

# KEYS: job, owner index, queue list, idempotency key ('' for none), in-flight key ('' when the
# job is not cacheable), cache entry to look up ('' for none), webhook queue.
# ARGV: job id, score, job ttl, message, idem ttl, idem value, trim-below score, now, known
# cached output ('' for none), its model label, the record's field/value pairs as one JSON array
# (one argument, not dozens: redis-py packs each argument in Python, and that showed in profiles).
# Returns {0, idem value} (a replay: nothing written), {1} (queued: enqueued), {2, record...}
# (a cache hit: succeeded at once), {3, leader id} (a follower: waits for the leader's result).
SUBMIT_LUA = (
    LUA_FUNCTIONS
    + COALESCE_LUA
    + """
local function accept()
  redis.call('EXPIRE', KEYS[1], ARGV[3])
  redis.call('ZADD', KEYS[2], ARGV[2], ARGV[1])
  redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', ARGV[7])
  redis.call('EXPIRE', KEYS[2], ARGV[3])
  if KEYS[4] ~= '' then redis.call('SET', KEYS[4], ARGV[6], 'EX', ARGV[5]) end
end

local function cached_response()
  if ARGV[9] ~= '' or KEYS[6] == '' then return ARGV[9], ARGV[10] end
  local entry = redis.call('HMGET', KEYS[6], 'output', 'model_label')
  return entry[1] or '', entry[2] or ''
end

local function live_leader()
  local leader = redis.call('GET', KEYS[5])
  if not leader then return nil end
  local status = redis.call('HGET', job_key(leader), 'status')
  if status == 'queued' or status == 'running' then return leader end
  return nil
end

if KEYS[4] ~= '' then
  local existing = redis.call('GET', KEYS[4])
  if existing then return {0, existing} end
end
redis.call('HSET', KEYS[1], unpack(cjson.decode(ARGV[11])))
local output, label = cached_response()
if output ~= '' then
  redis.call('HSET', KEYS[1], 'status', 'succeeded', 'cached', '1', 'output', output, 'model_label', label,
             'metrics', NO_INFERENCE_METRICS, 'started_at', ARGV[8], 'completed_at', ARGV[8])
  accept()
  push_webhook(KEYS[1], KEYS[7], 'start')
  push_webhook(KEYS[1], KEYS[7], 'completed')
  local record = redis.call('HGETALL', KEYS[1])
  table.insert(record, 1, 2)
  return record
end
if KEYS[5] ~= '' then
  local leader = live_leader()
  if leader then
    redis.call('HSET', KEYS[1], 'follows', leader, 'message', ARGV[4], 'queue_key', KEYS[3])
    redis.call('RPUSH', followers_key(leader), ARGV[1])
    redis.call('EXPIRE', followers_key(leader), ARGV[3])
    accept()
    return {3, leader}
  end
  redis.call('SET', KEYS[5], ARGV[1], 'EX', ARGV[3])
end
accept()
redis.call('LPUSH', KEYS[3], ARGV[4])
return {1}
"""
)

# A worker claims a job: a queued one before its deadline, or a running one whose worker
# stopped heart-beating (a takeover after a crash runs even past the queue deadline: the job
# was accepted and begun, and dropping it now would lose it). KEYS: job, workers zset.
# ARGV: worker id, now, heartbeat ttl, timeout error JSON, job id, events channel. KEYS[3]: the
# webhook queue (a first start sends `start`; a takeover does not send it again).
# Returns {outcome, status}: outcome 'claimed' (run it), 'skip' (someone else has it or it is
# over), 'expired' (deadline passed while queued: failed here), 'missing'.
START_LUA = (
    LUA_FUNCTIONS
    + COALESCE_LUA
    + """
local rec = redis.call('HMGET', KEYS[1], 'status', 'worker', 'deadline')
local status = rec[1]
if not status then return {'missing', ''} end
local now = tonumber(ARGV[2])
if status == 'running' then
  local beat = redis.call('ZSCORE', KEYS[2], rec[2])
  if rec[2] == ARGV[1] or (beat and tonumber(beat) > now - tonumber(ARGV[3])) then
    return {'skip', status}
  end
elseif status ~= 'queued' then
  return {'skip', status}
end
if status == 'queued' and tonumber(rec[3]) < now then
  redis.call('HSET', KEYS[1], 'status', 'failed', 'error', ARGV[4], 'completed_at', ARGV[2])
  redis.call('PUBLISH', ARGV[6], ARGV[5])
  push_webhook(KEYS[1], KEYS[3], 'completed')
  promote_followers(KEYS[1], ARGV[5])
  return {'expired', 'failed'}
end
redis.call('HSET', KEYS[1], 'status', 'running', 'worker', ARGV[1], 'started_at', ARGV[2])
redis.call('SADD', running_set(KEYS[1]), ARGV[5])
push_webhook(KEYS[1], KEYS[3], 'start')
redis.call('HINCRBY', KEYS[1], 'attempts', 1)
return {'claimed', status}
"""
)

# A worker hands back a job it holds (drain): it becomes queued again. KEYS: job.
# ARGV: worker id, job id.
REQUEUE_LUA = (
    LUA_FUNCTIONS
    + """
local rec = redis.call('HMGET', KEYS[1], 'status', 'worker')
if rec[1] ~= 'running' or rec[2] ~= ARGV[1] then return 0 end
redis.call('HSET', KEYS[1], 'status', 'queued', 'worker', '')
redis.call('SREM', running_set(KEYS[1]), ARGV[2])
redis.call('HDEL', KEYS[1], 'started_at')
return 1
"""
)

# A worker ends the job it holds. KEYS: job, webhook queue, cache entry to write on success ('' for
# none). ARGV: worker id, job id, events channel, cache ttl, fields... Followers of the job get its
# outcome in the same step.
FINISH_LUA = (
    LUA_FUNCTIONS
    + COALESCE_LUA
    + """
local rec = redis.call('HMGET', KEYS[1], 'status', 'worker')
if rec[1] ~= 'running' or rec[2] ~= ARGV[1] then return 0 end
redis.call('HSET', KEYS[1], unpack(ARGV, 5))
redis.call('SREM', running_set(KEYS[1]), ARGV[2])
redis.call('PUBLISH', ARGV[3], ARGV[2])
push_webhook(KEYS[1], KEYS[2], 'completed')
local done = redis.call('HMGET', KEYS[1], 'status', 'output', 'model_label')
if KEYS[3] ~= '' and done[1] == 'succeeded' then
  redis.call('HSET', KEYS[3], 'output', done[2], 'model_label', done[3] or '')
  redis.call('EXPIRE', KEYS[3], ARGV[4])
end
release_inflight(KEYS[1], ARGV[2])
resolve_followers(KEYS[1], ARGV[2], KEYS[2], ARGV[3])
return 1
"""
)

# A client cancels. KEYS: job, webhook queue. ARGV: owner, now, job id, events channel, cancel channel.
# Returns the record (empty when missing or not the caller's). A canceled leader's followers are
# not canceled with it: the oldest is promoted to run in its place.
CANCEL_LUA = (
    LUA_FUNCTIONS
    + COALESCE_LUA
    + """
local rec = redis.call('HMGET', KEYS[1], 'status', 'owner')
if not rec[1] or rec[2] ~= ARGV[1] then return {} end
if rec[1] == 'queued' or rec[1] == 'running' then
  redis.call('HSET', KEYS[1], 'status', 'canceled', 'completed_at', ARGV[2],
             'error', '{"type":"canceled","message":"canceled by the client"}')
  redis.call('PUBLISH', ARGV[4], ARGV[3])
  if rec[1] == 'running' then
    redis.call('SREM', running_set(KEYS[1]), ARGV[3])
    redis.call('PUBLISH', ARGV[5], ARGV[3])
  end
  push_webhook(KEYS[1], KEYS[2], 'completed')
  promote_followers(KEYS[1], ARGV[3])
end
return redis.call('HGETALL', KEYS[1])
"""
)

TIMEOUT_ERROR = orjson.dumps(
    {"type": "timeout", "message": "the job reached its deadline (GENQ_JOB_TIMEOUT_S) before it ran"}
)


def rfc3339(epoch: str | float | None) -> str | None:
    if epoch is None or epoch == "":
        return None
    moment = datetime.fromtimestamp(float(epoch), UTC)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _json_or_none(raw: str | None) -> Any:
    return orjson.loads(raw) if raw else None


def public_job(record: dict[str, str]) -> dict[str, Any]:
    """The job object as the API returns it, from its Redis hash: its summary (less the preview)
    with input, output and metrics."""
    metrics = _json_or_none(record.get("metrics")) or {}
    started = record.get("started_at")
    if started and "queue_ms" not in metrics:
        metrics["queue_ms"] = round((float(started) - float(record["created_at"])) * 1000, 3)
    job = job_summary(record)
    del job["preview"]
    job["input"] = orjson.loads(record["input"])
    job["output"] = _json_or_none(record.get("output"))
    job["metrics"] = {
        "queue_ms": metrics.get("queue_ms"),
        "inference_ms": metrics.get("inference_ms"),
        "batch_size": metrics.get("batch_size"),
    }
    return job


#: The record fields a job summary is made of (never input or output: they can be MiBs).
SUMMARY_FIELDS = (
    "id", "owner", "status", "model", "model_label", "preview", "error", "created_at", "started_at",
    "completed_at", "cached", "metadata",
)  # fmt: skip


def job_summary(record: dict[str, str]) -> dict[str, Any]:
    """A job as lists return it: public_job without input, output and metrics."""
    job_id = record["id"]
    url = f"/v1/jobs/{job_id}"
    return {
        "id": job_id,
        "status": record["status"],
        "model": record["model"],
        "model_label": record.get("model_label") or None,
        "preview": record.get("preview") or "",
        "error": _json_or_none(record.get("error")),
        "created_at": rfc3339(record["created_at"]),
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
            "attempts": "0",
        }  # fmt: skip
        return record

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


#: SUBMIT_LUA's outcomes (the first item of its reply).
SUBMIT_REPLAY, SUBMIT_QUEUED, SUBMIT_HIT, SUBMIT_FOLLOWS = 0, 1, 2, 3


def as_text(value: bytes | str) -> str:
    """A Redis reply item as text (clients may be built with or without decode_responses)."""
    return value.decode() if isinstance(value, bytes) else value


def _record(flat: list[bytes | str]) -> dict[str, str]:
    return {as_text(flat[i]): as_text(flat[i + 1]) for i in range(0, len(flat), 2)}


def _submit_cache_keys(cache: CacheLookup | None) -> list[str]:
    """SUBMIT_LUA's in-flight and cache-entry keys."""
    if cache is None:
        return ["", ""]
    entry = keys.cache_entry(cache.cache_key) if cache.look_up and cache.known is None else ""
    return [keys.inflight(cache.cache_key), entry]


class JobStore:
    """The API's view of job records (asyncio)."""

    def __init__(
        self, client: aioredis.Redis, commands: AutoPipeline, job_ttl_s: int, idempotency_ttl_s: int
    ) -> None:
        self._redis = client
        #: The hot commands (submit, read, cancel) go through it, pipelined with other requests'.
        self._commands = commands
        self._job_ttl_s = job_ttl_s
        self._idempotency_ttl_s = idempotency_ttl_s
        self._submit = client.register_script(SUBMIT_LUA)
        self._cancel = client.register_script(CANCEL_LUA)

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
        """
        idem_key, digest = idempotency or ("", "")
        score = int(job.created_at * 1_000_000)
        trim_below = score - self._job_ttl_s * 1_000_000
        known = cache.known if cache is not None else None
        cache_keys = _submit_cache_keys(cache)
        reply = await self._commands.run_script(
            self._submit,
            keys=[keys.job(job.job_id), keys.owner_jobs(job.owner), queue_key, idem_key, *cache_keys,
                  keys.WEBHOOK_QUEUE],
            args=[job.job_id, score, self._job_ttl_s, message, self._idempotency_ttl_s,
                  f"{job.job_id} {digest}", f"({trim_below}", repr(time.time()),
                  known.output if known else "", known.model_label if known else "", job.fields_json()],
        )  # fmt: skip
        outcome = int(reply[0])
        if outcome == SUBMIT_HIT:
            return Submitted(job.job_id, created=True, hit_record=_record(reply[1:]))
        if outcome == SUBMIT_FOLLOWS:
            return Submitted(job.job_id, created=True, follows=as_text(reply[1]))
        if outcome == SUBMIT_QUEUED:
            return Submitted(job.job_id, created=True)
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
            self._cancel,
            keys=[keys.job(job_id), keys.WEBHOOK_QUEUE],
            args=[owner, repr(time.time()), job_id, keys.JOB_EVENTS_CHANNEL, keys.CANCEL_CHANNEL],
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


@dataclass(frozen=True, slots=True)
class Claim:
    outcome: str
    status: str


class WorkerJobs:
    """The worker's view of job records (blocking; called from Celery task threads)."""

    def __init__(self, client: redis.Redis, heartbeat_ttl_s: float) -> None:
        self._redis = client
        self._heartbeat_ttl_s = heartbeat_ttl_s
        self._start = client.register_script(START_LUA)
        self._finish = client.register_script(FINISH_LUA)
        self._requeue = client.register_script(REQUEUE_LUA)

    def claim(self, job_id: str, worker_id: str) -> Claim:
        outcome, status = self._start(
            keys=[keys.job(job_id), keys.WORKERS, keys.WEBHOOK_QUEUE],
            args=[worker_id, repr(time.time()), self._heartbeat_ttl_s, TIMEOUT_ERROR, job_id,
                  keys.JOB_EVENTS_CHANNEL],
        )  # fmt: skip
        return Claim(as_text(outcome), as_text(status))

    def read(self, job_id: str) -> dict[str, str]:
        return self._redis.hgetall(keys.job(job_id))  # type: ignore[return-value]

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
            keys=[keys.job(job_id), keys.WEBHOOK_QUEUE, entry_key],
            args=[worker_id, job_id, keys.JOB_EVENTS_CHANNEL, ttl, "completed_at", repr(time.time()),
                  *flat],
        )  # fmt: skip
        return bool(done)

    def publish_model(self, model_id: str, fingerprint: str) -> None:
        """Tell the API tier which revision of the model this worker serves (cache keys use it)."""
        self._redis.hset(keys.MODELS, model_id, fingerprint)

    def requeue(self, job_id: str, worker_id: str) -> bool:
        return bool(self._requeue(keys=[keys.job(job_id)], args=[worker_id, job_id]))

    def heartbeat(self, worker_id: str) -> None:
        self._redis.zadd(keys.WORKERS, {worker_id: time.time()})

    def leave(self, worker_id: str) -> None:
        self._redis.zrem(keys.WORKERS, worker_id)


async def live_workers(client: aioredis.Redis, heartbeat_ttl_s: float) -> int:
    """How many workers sent a heartbeat within heartbeat_ttl_s."""
    return int(await client.zcount(keys.WORKERS, time.time() - heartbeat_ttl_s, "+inf"))
