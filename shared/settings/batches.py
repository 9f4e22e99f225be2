"""Settings of files and batches (the OpenAI Batch API, docs/batches.md): file size and storage
(local or S3), and the batch feeder's bounds, fair shares and timing."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field, PositiveInt, SecretStr


class BatchSettings(BaseModel):
    """Files and batches."""

    file_max_bytes: int = Field(200 << 20, ge=1024)
    """Largest file `POST /v1/files` accepts (the upload is streamed to storage, never held in
    memory); larger ones get 413."""

    file_quota_bytes: int = Field(1 << 30, ge=0)
    """Most bytes of files one API key may hold in the file storage: its uploads plus its
    batches' output and error files (always written, so they may pass it, and then leave no room
    for uploads until files are deleted or expire). An upload that would pass it gets 429
    `quota_exceeded` and stores nothing. 0: no quota."""

    file_storage: Literal["local", "s3"] = "local"
    """Where file content lives: `local` (a folder under data_dir, one host) or `s3` (an
    S3-compatible bucket every API replica shares; set the s3_* settings)."""

    s3_endpoint_url: str | None = None
    """The S3-compatible endpoint (MinIO, Ceph, R2, ...); unset: AWS S3."""

    s3_bucket: str | None = None
    """The bucket file content goes to (required with file_storage s3)."""

    s3_prefix: str = "genq/files/"
    """Key prefix of genq's objects in the bucket."""

    s3_region: str = "us-east-1"
    """The bucket's region."""

    s3_access_key_id: SecretStr | None = None
    """Access key id; unset: boto3's own chain (environment, instance role)."""

    s3_secret_access_key: SecretStr | None = None
    """Secret access key; unset: boto3's own chain."""

    batch_max_lines: int = Field(50_000, ge=1)
    """Most request lines one batch's input file may hold (OpenAI's limit); more fails the batch
    in validation with the code `too_many_lines`."""

    batch_line_max_bytes: int = Field((1 << 20) + (16 << 10), ge=1024)
    """Longest line (one request, with its newline) a batch input file may hold. OpenAI sets no
    cap of its own per line beyond its request limits, so the default is the longest body the API
    takes directly (max_body_bytes' 1 MiB) plus 16 KiB for the line's envelope (custom_id, method,
    url). A longer line is read past without being held and refused as `line_too_long`."""

    batch_active_max: int = Field(20, ge=1)
    """Most batches one API key may have not yet ended (validating, in progress, finalizing,
    cancelling); one more is refused with 429 until one of them ends."""

    batch_schemas_max: int = Field(64, ge=1)
    """Most distinct response-format JSON schemas one batch's lines may carry. Each is compiled
    once when the batch is validated; the lines of any schema past this many are refused as
    `too_many_schemas` without compiling, so one batch holds the compile pool for a bounded time
    and keeps a bounded record of its schemas."""

    batch_window: int = Field(64, ge=1)
    """Most rows of one batch queued or running as jobs at a time (a line costs its n or best_of:
    the sequences it runs; a refused line one); the feeder tops the window up as they finish, so a
    50,000-line batch costs Redis a bounded amount. A line costing more goes alone."""

    batch_max_inflight: int = Field(256, ge=1)
    """Most rows (a line costs its n or best_of) of all batches queued or running at a time (also
    bounded by the fleet's slots less batch_interactive_reserve). The feeder shares this capacity
    between the API keys with active batches (by batch_key_weights), then round-robin between
    each key's batches."""

    batch_interactive_reserve: float = Field(0.25, ge=0, lt=1)
    """Share of the live model workers' job slots (their concurrency, published with their
    heartbeats) that batch lines leave free, so an interactive job starts at once instead of
    waiting for a line to finish. A line of n samples takes n slots. 0 lets batches fill every
    slot; a fleet's batch capacity is at least one line."""

    batch_key_weights: dict[str, PositiveInt] = {}
    """Fair-share weights of API keys' batches as JSON {"<owner id>": weight}; a key not named
    weighs 1. Each round of the fair share gives a key as many rows as its weight."""

    batch_feeder_interval_s: float = Field(0.5, gt=0, le=60)
    """How often the batch feeder runs (in every API process; a Redis lock lets one feed per
    period): validates new batches, collects finished lines, tops windows up, finalizes."""

    batch_completion_window_s: float = Field(86_400.0, gt=0)
    """How long a batch has to finish once created (OpenAI's `completion_window: "24h"`); after
    it the batch is `expired`: unfinished lines are canceled and reported as `batch_expired`.
    Shorten it only for tests."""

    batch_webhook_urls: dict[str, str] = {}
    """Per-key default URL of batch webhooks (batch.completed, batch.failed, batch.expired,
    batch.cancelled) as JSON {"<owner id>": "https://..."}; a batch's metadata `webhook_url`
    overrides it. Signed like job webhooks, checked against the same target policy."""

    batch_line_ttl_s: int = Field(10, ge=0)
    """How long a batch line's job record (GET /v1/jobs/{id}) is kept once its result is in the
    batch's files (0: deleted at once); Redis holds the records of the lines finished this
    recently, plus the window."""
