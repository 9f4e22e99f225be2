"""The API's response cache: level 1 in this process's memory, level 2 in Redis (docs/cache.md).

`ResponseCache` computes a job's cache key (from the model fingerprint workers publish), looks it
up in level 1, then in a dedicated cache Redis if one is configured (when level 2 shares the job
store's Redis, the submit script looks it up in the same round trip that writes the job), and
fills level 1 from whatever level 2 answered. Workers write level 2. A Redis that cannot be asked
only costs hits: the cache then serves from level 1 and every other request goes to the queue.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Literal, cast

import redis.asyncio as aioredis
import redis.exceptions
from prometheus_client import Counter, Gauge
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from api.jobs.store import CacheLookup, Submitted
from shared import keys
from shared.cache import CacheEntry, cache_key, is_cacheable
from shared.config import Settings
from shared.jobspec import JobSpec
from shared.logging import fields

log = logging.getLogger("genq.api")

HITS = Counter("genq_cache_hits_total", "Submissions answered from the response cache.", ["level"])
MISSES = Counter(
    "genq_cache_misses_total",
    "Cacheable submissions that found no response in any level (coalesced ones included).",
)
COALESCED = Counter("genq_cache_coalesced_total", "Submissions that followed an identical job in flight.")
# livesum: with several API processes, /metrics reports the sum over the live ones.
L1_ENTRIES = Gauge(
    "genq_cache_l1_entries", "Responses held in API processes' memory.", multiprocess_mode="livesum"
)
L1_BYTES = Gauge(
    "genq_cache_l1_bytes", "Bytes of responses held in API processes' memory.", multiprocess_mode="livesum"
)

#: While a model's fingerprint is unknown, re-read the published ones at least this often.
UNKNOWN_MODEL_REFRESH_S = 0.5
#: After a dedicated cache Redis fails, skip it for this long (requests must not wait on it).
L2_RETRY_AFTER_S = 5.0


@dataclass(frozen=True, slots=True)
class Lookup:
    #: What the submit script is given.
    request: CacheLookup
    #: The level that already answered ("l1", "l2"), or None.
    level: Literal["l1", "l2"] | None


class LocalCache:
    """Level 1: a bounded LRU of responses with a TTL. Entries and bytes are both capped."""

    def __init__(self, max_entries: int, max_bytes: int, ttl_s: float) -> None:
        self._max_entries = max_entries
        self._max_bytes = max_bytes
        self._ttl_s = ttl_s
        self._entries: OrderedDict[str, tuple[CacheEntry, float]] = OrderedDict()
        self.nbytes = 0

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: str) -> bool:
        return key in self._entries

    def get(self, key: str) -> CacheEntry | None:
        found = self._entries.get(key)
        if found is None:
            return None
        entry, expires_at = found
        if expires_at <= time.monotonic():
            self._remove(key)
            return None
        self._entries.move_to_end(key)
        return entry

    def put(self, key: str, entry: CacheEntry) -> None:
        size = _size(key, entry)
        if size > self._max_bytes or self._max_entries == 0:
            return
        if key in self._entries:
            self._remove(key)
        self._entries[key] = (entry, time.monotonic() + self._ttl_s)
        self.nbytes += size
        while len(self._entries) > self._max_entries or self.nbytes > self._max_bytes:
            self._remove(next(iter(self._entries)))
        self._report()

    def _remove(self, key: str) -> None:
        entry, _ = self._entries.pop(key)
        self.nbytes -= _size(key, entry)
        self._report()

    def _report(self) -> None:
        L1_ENTRIES.set(len(self._entries))
        L1_BYTES.set(self.nbytes)


def _size(key: str, entry: CacheEntry) -> int:
    return len(key) + entry.nbytes


class ModelFingerprints:
    """The {model id: fingerprint} hash workers publish, re-read every `refresh_s` at most.

    A model no worker has published is not cacheable. When Redis cannot be read, the last known
    fingerprints stay in use: entries under them are still right for that revision.
    """

    def __init__(self, client: aioredis.Redis, refresh_s: float) -> None:
        self._redis = client
        self._refresh_s = refresh_s
        self._known: dict[str, str] = {}
        self._read_at = float("-inf")
        self._refreshing: asyncio.Task[None] | None = None

    async def get(self, model: str) -> str | None:
        max_age = self._refresh_s if model in self._known else UNKNOWN_MODEL_REFRESH_S
        if time.monotonic() - self._read_at > max_age:
            await self._refresh()
        return self._known.get(model)

    async def _refresh(self) -> None:
        # One read in flight per process, however many requests find the value stale.
        if self._refreshing is None or self._refreshing.done():
            self._refreshing = asyncio.create_task(self._read())
        await asyncio.shield(self._refreshing)

    async def _read(self) -> None:
        try:
            self._known = cast(dict[str, str], await self._redis.hgetall(keys.MODELS))
        except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError) as exc:
            log.warning("cache_fingerprints_unreadable", extra=fields(error=type(exc).__name__))
        self._read_at = time.monotonic()


class ResponseCache:
    """Keys, level-1 lookups and fills, level-2 lookups in a dedicated Redis, and the metrics."""

    def __init__(self, settings: Settings, store_redis: aioredis.Redis) -> None:
        self._enabled = settings.cache_enabled
        self._ttl_s = settings.cache_ttl_s
        self.local = LocalCache(
            settings.cache_l1_max_entries,
            settings.cache_l1_max_bytes,
            min(settings.cache_l1_ttl_s, settings.cache_ttl_s),
        )
        self.fingerprints = ModelFingerprints(store_redis, settings.cache_fingerprint_refresh_s)
        self._dedicated = _dedicated_client(settings.cache_redis_address)
        self._dedicated_down_until = float("-inf")

    async def close(self) -> None:
        if self._dedicated is not None:
            await self._dedicated.aclose()

    async def key_for(self, model: str, spec: JobSpec, scope: str = "") -> str | None:
        """The job's cache key within `scope` (shared/cache.py); None when it is not cacheable (not
        deterministic, opted out, or the model's fingerprint is not known yet: that last one
        counts as a miss)."""
        if not self._enabled or not is_cacheable(spec):
            return None
        fingerprint = await self.fingerprints.get(model)
        if fingerprint is None:
            MISSES.inc()
            return None
        return cache_key(model, fingerprint, spec, scope)

    async def lookup(self, key: str) -> Lookup:
        """What the submit script needs: a response found in level 1 (or the dedicated level 2),
        or an instruction to look level 2 up itself."""
        entry = self.local.get(key)
        if entry is not None:
            return Lookup(CacheLookup(key, known=entry), "l1")
        if self._dedicated is None:
            return Lookup(CacheLookup(key, look_up=True), None)
        entry = await self._fetch(key)
        if entry is None:
            return Lookup(CacheLookup(key), None)
        self.local.put(key, entry)
        return Lookup(CacheLookup(key, known=entry), "l2")

    def settle(self, lookup: Lookup, submitted: Submitted) -> Literal["l1", "l2"] | None:
        """Count the outcome of a cacheable submission, fill level 1 from a level-2 hit, and
        return the level that answered it (None: it went to the queue, or was a replay)."""
        if not submitted.created:
            return None
        if submitted.hit_record is None:
            MISSES.inc()
            if submitted.follows is not None:
                COALESCED.inc()
            return None
        level = lookup.level or "l2"  # no level yet: the submit script found it in level 2
        HITS.labels(level).inc()
        if lookup.level is None:
            record = submitted.hit_record
            entry = CacheEntry(record["output"], record.get("model_label", ""))
            self.local.put(lookup.request.cache_key, entry)
        return level

    async def _fetch(self, key: str) -> CacheEntry | None:
        assert self._dedicated is not None
        if time.monotonic() < self._dedicated_down_until:
            return None
        try:
            found = await self._dedicated.hmget(keys.cache_entry(key), ["output", "model_label"])
        except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError) as exc:
            self._dedicated_down_until = time.monotonic() + L2_RETRY_AFTER_S
            log.warning("cache_l2_unavailable", extra=fields(error=type(exc).__name__))
            return None
        output, label = cast(list[str | None], found)
        return CacheEntry(output, label or "") if output else None


def _dedicated_client(url: str | None) -> aioredis.Redis | None:
    if url is None:
        return None
    # Short timeouts and no retries: a missing cache costs a miss, never a slow or failed request.
    return aioredis.Redis.from_url(
        url,
        decode_responses=True,
        socket_connect_timeout=0.25,
        socket_timeout=0.5,
        retry=Retry(NoBackoff(), 0),
    )
