"""Settings that protect the service from overload and from one key: admission, per-key bounds on
what a key stores, rate limits and their per-key overrides (parsed at start-up)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field, ValidationInfo, field_validator


class ProtectionSettings(BaseModel):
    """Admission, per-key bounds and rate limits."""

    max_queue_length: int = Field(10_000, ge=0)
    """Admission bound: while genq_queue_length of a model's queue is at or over this, new jobs
    for it get 503 `overloaded` (or go to the fallback model when they allow it). 0: unbounded."""

    fallback_model: str | None = None
    """A smaller model served by its own workers; jobs with `allow_fallback` go there when their
    model's queue is full."""

    overload_retry_after_s: float = Field(5.0, gt=0)
    """Retry-After sent with a 503 `overloaded`."""

    max_live_jobs_per_key: int = Field(10_000, ge=0)
    """Most rows of queued and running jobs one API key may hold (a job counts n, or best_of,
    rows: the sequences it runs); past it, submissions get 429 `quota_exceeded` (param
    `live_jobs`). 0: no bound. Per-key override: `live_jobs` in rate_limit_overrides."""

    max_stored_bytes_per_key: int = Field(1 << 30, ge=0)
    """Most bytes of job input (prompt, messages, metadata) one API key may have stored while its
    records live (GENQ_JOB_TTL_S, counted per UTC day); past it, submissions get 429
    `quota_exceeded` (param `stored_bytes`), so one key cannot fill Redis for all. 0: no bound.
    Per-key override: `stored_bytes` in rate_limit_overrides."""

    storage_headroom: float = Field(0.9, gt=0, le=1)
    """Submissions get 503 `unavailable` (with Retry-After) while the job store's Redis uses more
    than this fraction of its maxmemory, leaving the rest for running jobs to finish and for
    reads. 1: only Redis's own refusal."""

    rate_limit_submit: str = "60/10"
    """Token bucket for job submissions per API key: `capacity/refill per second`. Empty: off."""

    rate_limit_read: str = "600/100"
    """Token bucket for reads (polls, lists, streams) per API key, kept apart from submissions so
    polling never starves them. Empty: off."""

    rate_limit_upload_tokens: int = Field(10, ge=1)
    """Tokens of the submit bucket one `POST /v1/files` takes (at most the bucket's burst): an
    upload is read, parsed and written up to GENQ_FILE_MAX_BYTES, so it costs more than a job
    submission (1 token); taken before a byte of its body is read."""

    rate_limit_batch_tokens: int = Field(10, ge=1)
    """Tokens of the submit bucket one `POST /v1/batches` takes (at most the bucket's burst): its
    validation reads and parses its whole input file in the API process, so it costs more than a
    job submission (1 token)."""

    rate_limit_overrides: dict[str, dict[str, str]] = {}
    """Per-key limits as JSON: {"<owner id>": {"submit": "600/100", "read": "6000/1000", "streams":
    "500", "long_polls": "500"}}. The owner id of a key is `key-` + the first 16 hex digits of its
    SHA-256."""

    rate_limit_fail_open_reads: bool = True
    """While Redis cannot be asked, let reads through (they fail anyway without Redis)."""

    rate_limit_fail_open_submits: bool = False
    """While Redis cannot be asked, let submissions through (default: refuse with 503)."""

    @field_validator("rate_limit_submit", "rate_limit_read")
    @classmethod
    def _bucket_parses(cls, spec: str, info: ValidationInfo) -> str:
        # At start-up, not as a 500 on every request the limiter would parse it for.
        check_bucket_spec(f"GENQ_{str(info.field_name).upper()}", spec)
        return spec

    @field_validator("rate_limit_overrides")
    @classmethod
    def _overrides_parse(cls, overrides: dict[str, dict[str, str]]) -> dict[str, dict[str, str]]:
        for owner, limits in overrides.items():
            for kind, value in limits.items():
                check_limit_spec(owner, kind, value)
        return overrides

    def owner_bound(self, owner: str, kind: Literal["live_jobs", "stored_bytes"]) -> int:
        """A key's bound on what it keeps in the store: its override, else the setting."""
        override = self.rate_limit_overrides.get(owner, {}).get(kind)
        if override is not None:
            return int(override)
        return self.max_live_jobs_per_key if kind == "live_jobs" else self.max_stored_bytes_per_key


#: The kinds of limit rate_limit_overrides may set: token buckets, and counts of held requests.
BUCKET_KINDS = ("submit", "read")
COUNT_KINDS = ("streams", "long_polls", "live_jobs", "stored_bytes")


def check_limit_spec(owner: str, kind: str, value: str) -> None:
    """Raise a ValueError naming the owner and kind (never the value) unless value parses."""
    where = f"GENQ_RATE_LIMIT_OVERRIDES[{owner!r}][{kind!r}]"
    if kind in COUNT_KINDS:
        if not (value.isascii() and value.isdigit() and int(value) >= 1):
            raise ValueError(f"{where} must be a whole number >= 1")
        return
    if kind not in BUCKET_KINDS:
        raise ValueError(f"{where}: unknown limit; use one of {', '.join(BUCKET_KINDS + COUNT_KINDS)}")
    check_bucket_spec(where, value)


def check_bucket_spec(where: str, value: str) -> None:
    """Raise a ValueError naming `where` unless value is `capacity/refill per second` or empty."""
    capacity, slash, rate = value.partition("/")
    try:
        ok = not value.strip() or (bool(slash) and int(capacity) >= 1 and float(rate) > 0)
    except ValueError:
        ok = False
    if not ok:
        raise ValueError(f"{where} must be `capacity/refill per second` (e.g. 60/10) or empty")
