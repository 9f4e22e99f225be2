"""Per-key token buckets in Redis, shared by every API replica: one atomic Lua script per check.

Submissions and reads have separate buckets, so polling never starves submitting. A job of n
samples (or best_of) runs as many sequences, so its submission takes that many tokens: the request
takes one (api/edge/pipeline.py), JobQueue the rest once the body says how many. An operation
that costs the API process more than a submission (an upload, a batch's validation) takes the
tokens its setting says (`charge`), so a tenant's burst buys fewer of them. The bucket's clock is
the Redis server's (TIME), so replicas with skewed clocks agree.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Literal

import redis.asyncio as aioredis
import redis.exceptions

from api.redis_io.commands import Commands
from shared import keys, metrics
from shared.config import Settings
from shared.errors import RateLimited, Unavailable, rate_limit_headers, storage_refusal
from shared.jobqueue import scripts
from shared.logging import fields

log = logging.getLogger("genq.api")
Kind = Literal["submit", "read"]
#: Operations dearer than a submission: an upload (GENQ_RATE_LIMIT_UPLOAD_TOKENS) and a batch's
#: creation, whose validation reads its whole input file (GENQ_RATE_LIMIT_BATCH_TOKENS).
Costly = Literal["upload", "batch"]


@dataclass(frozen=True, slots=True)
class Bucket:
    capacity: int
    per_second: float

    @classmethod
    def parse(cls, spec: str) -> Bucket | None:
        """ "60/10" -> 60 tokens, 10 per second; "" -> no limit."""
        if not spec.strip():
            return None
        capacity, _, rate = spec.partition("/")
        return cls(int(capacity), float(rate))


def bucket_for(settings: Settings, owner: str, kind: Kind) -> Bucket | None:
    override = settings.rate_limit_overrides.get(owner, {}).get(kind)
    if override is not None:
        return Bucket.parse(override)
    return Bucket.parse(settings.rate_limit_submit if kind == "submit" else settings.rate_limit_read)


#: Why a job takes more than one token.
SAMPLES = "'s further samples: a job takes n, or best_of"


class RateLimiter:
    def __init__(self, client: aioredis.Redis, commands: Commands, settings: Settings) -> None:
        self._settings = settings
        self._commands = commands
        self._script = client.register_script(scripts.plain("token_bucket"))
        #: Parsed once per owner and kind (settings do not change while the process runs).
        self._buckets: dict[tuple[str, Kind], Bucket | None] = {}

    async def charge(self, owner: str, operation: Costly) -> None:
        """Take the rest of a costly operation's tokens from the owner's submit bucket (its
        request took one); raises RateLimited when over."""
        settings = self._settings
        tokens = (
            settings.rate_limit_upload_tokens if operation == "upload" else settings.rate_limit_batch_tokens
        )
        await self.take_rest(owner, tokens, f"{tokens} tokens for each {operation}")

    async def take_rest(self, owner: str, tokens: int, why: str | None = None) -> None:
        """Take the rest of a submission's `tokens` (its request took one) from the owner's
        submit bucket, all of it counted at most at the bucket's burst, so that a burst smaller
        than an operation's weight still lets one through once the bucket is full."""
        bucket = self._bucket(owner, "submit")
        if bucket is not None:
            await self.check(owner, "submit", min(tokens, bucket.capacity) - 1, why)

    async def check(
        self,
        owner: str,
        kind: Kind,
        cost: int = 1,
        why: str | None = None,
    ) -> dict[str, str]:
        """The X-RateLimit headers for an allowed request that takes `cost` tokens (at most the
        bucket's burst, so any request can pass once the bucket is full); raises RateLimited when
        over, saying `why` when it takes more than one."""
        bucket = self._bucket(owner, kind)
        if bucket is None or cost <= 0:
            return {}
        cost = min(cost, bucket.capacity)
        try:
            allowed, left_milli, full_ms, wait_ms = await self._commands.run_script(
                self._script, [keys.rate_limit(owner, kind)], [bucket.capacity, bucket.per_second, cost]
            )
        except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError) as exc:
            return self._redis_down(kind, exc)
        except redis.exceptions.ResponseError as exc:
            return self._write_refused(kind, exc)
        remaining = int(left_milli) // 1000
        if not allowed:
            metrics.RATE_LIMITED.labels(kind).inc()
            raise RateLimited(
                f"rate limit for {'submissions' if kind == 'submit' else 'reads'} exceeded "
                f"({bucket.capacity} burst, {bucket.per_second:g}/s"
                + (f"; {why or f'{cost} tokens for this job{SAMPLES}'}" if cost > 1 else "")
                + ")",
                limit=bucket.capacity,
                remaining=remaining,
                reset_s=full_ms / 1000,
                retry_after_s=wait_ms / 1000,
            )
        return rate_limit_headers(bucket.capacity, remaining, full_ms / 1000)

    def _bucket(self, owner: str, kind: Kind) -> Bucket | None:
        try:
            return self._buckets[owner, kind]
        except KeyError:
            bucket = self._buckets[owner, kind] = bucket_for(self._settings, owner, kind)
            return bucket

    @staticmethod
    def _write_refused(kind: Kind, exc: redis.exceptions.ResponseError) -> dict[str, str]:
        """The bucket cannot be written (Redis full, read-only): reads go on unlimited, since
        they store nothing; a submission could not be stored either, so it is refused (503)."""
        refusal = storage_refusal(exc)
        if refusal is None:
            raise exc
        if kind == "read":
            return {}
        raise refusal from exc

    def _redis_down(self, kind: Kind, exc: Exception) -> dict[str, str]:
        fail_open = (
            self._settings.rate_limit_fail_open_reads
            if kind == "read"
            else self._settings.rate_limit_fail_open_submits
        )
        log.warning("rate_limit_unavailable", extra=fields(kind=kind, fail_open=fail_open))
        if fail_open:
            return {}
        raise Unavailable("rate limiting is unavailable (Redis unreachable); retry shortly") from exc
