"""Every setting of genq, in one place. Each field is the environment variable GENQ_<NAME>.

Values come from the environment, then an optional `.env` file, then the defaults here,
which are the embedded local stack's. Cross-field rules fail fast at start-up with a
message naming both values.
"""

from __future__ import annotations

import hashlib
from functools import cached_property
from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from shared.signing import parse_secrets
from shared.ssrf import TargetPolicy, parse_ports

CommaList = Annotated[list[str], NoDecode]


def _split_commas(value: object) -> object:
    if isinstance(value, str):
        return [item.strip() for item in value.split(",") if item.strip()]
    return value


class Settings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="GENQ_", env_file=".env", extra="ignore", frozen=True, validate_default=True
    )

    # --- Connections -------------------------------------------------------------------------
    redis_url: str | None = None
    """Redis (or Valkey) URL used as Celery broker and job store. Unset: `genq up` starts an
    embedded server under data_dir; every other command refuses to start."""

    data_dir: Path = Path(".genq")
    """Local state of the embedded stack: the embedded Redis's files, converted models, pidfiles."""

    # --- API tier ------------------------------------------------------------------------------
    api_host: str = "127.0.0.1"
    """Address `genq api` binds. Anything but loopback requires API keys (or allow_anonymous)."""

    api_port: int = Field(8000, ge=1, le=65535)
    """Port `genq api` binds."""

    api_workers: int = Field(1, ge=1, le=64)
    """Uvicorn worker processes of `genq api`."""

    api_keys: CommaList = []
    """Comma-separated API keys. Kept only as SHA-256 digests in memory; compared in constant time.
    Empty: the API serves anonymously, on loopback only unless allow_anonymous."""

    allow_anonymous: bool = False
    """Serve without API keys even on a non-loopback address (trusted networks only)."""

    api_hot_paths: bool = True
    """Serve `POST /v1/jobs` and `GET /v1/jobs/{id}` of the common shape through a raw-ASGI path
    that skips FastAPI's per-request machinery (api/hotpath.py); the answers are the same. Turn it
    off only to compare the two."""

    max_body_bytes: int = Field(1 << 20, ge=1024)
    """Largest request body accepted; larger ones get 413."""

    max_wait_s: float = Field(60.0, ge=0, le=300)
    """Longest long-poll (`?wait=`) or `Prefer: wait=` hold."""

    idempotency_ttl_s: int = Field(86_400, ge=60)
    """How long an Idempotency-Key maps to its job."""

    # --- Response cache ------------------------------------------------------------------------
    cache_enabled: bool = True
    """Answer identical deterministic requests (temperature 0 or a fixed seed) from the response
    cache, and coalesce identical ones in flight into one generation (docs/cache.md)."""

    cache_ttl_s: int = Field(86_400, ge=1)
    """How long a response stays in the shared (Redis) cache level after it was generated."""

    cache_redis_url: str | None = None
    """A dedicated Redis for the shared cache level (recommended in production, with
    `maxmemory-policy allkeys-lru`). Unset: the job store's Redis (TTL-bounded only)."""

    cache_l1_max_entries: int = Field(10_000, ge=0)
    """Most responses each API process keeps in memory (level 1); 0 turns level 1 off."""

    cache_l1_max_bytes: int = Field(64 << 20, ge=0)
    """Most bytes of responses each API process keeps in memory (level 1)."""

    cache_l1_ttl_s: float = Field(300.0, gt=0)
    """How long an API process keeps a response in memory (never longer than cache_ttl_s)."""

    cache_fingerprint_refresh_s: float = Field(5.0, gt=0)
    """How often an API process re-reads the models' fingerprints that workers publish (a new
    model revision gets new cache keys within this long)."""

    # --- Jobs and queue ---------------------------------------------------------------------------
    model: str = "smollm2-135m-instruct"
    """The model workers load (and the API's default for jobs that name none)."""

    models: CommaList = []
    """Further models served by other worker pools (each has its own queue genq.<model>)."""

    default_max_tokens: int = Field(256, ge=1)
    """max_tokens of a job that gives none."""

    max_tokens_cap: int = Field(1024, ge=1)
    """Largest max_tokens a job may ask for."""

    job_ttl_s: int = Field(7 * 86_400, ge=60)
    """How long job records (and their webhook logs) are kept."""

    job_timeout_s: float = Field(600.0, gt=0)
    """Bounds both a job's wait in the queue (counted from acceptance: a job still queued then is
    failed with a `timeout` error instead of run) and each run (counted from its start: a job still
    running then is stopped at the next step and fails with `timeout`)."""

    visibility_timeout_s: int = Field(1800, ge=1)
    """Seconds before the broker redelivers a message a worker took and never acknowledged (a
    killed worker's jobs come back after this). Must exceed job_timeout_s, or a long job is
    delivered twice."""

    max_attempts: int = Field(3, ge=1, le=100)
    """Most times a job is started. A job whose worker is lost (its lease lapsed: a crash, a kill,
    a hang) is handed back to the queue until it has been started this often, then failed with a
    `worker_lost` error. A drain's hand-back does not count."""

    lease_ttl_s: float = Field(30.0, gt=0)
    """A running job's lease: its worker renews it with each heartbeat; a job whose lease is older
    than this is handed back by the reaper (or taken over by a worker that receives it). Must
    exceed heartbeat_interval_s."""

    reaper_interval_s: float = Field(2.0, gt=0, le=60)
    """How often the reaper runs (in every API process; a Redis lock lets one run per period):
    hands back jobs with lapsed leases, fails queued jobs past their deadline, re-pushes the
    message of a queued job the broker lost, and promotes followers of a vanished leader."""

    # --- Protection -----------------------------------------------------------------------------
    max_queue_length: int = Field(10_000, ge=0)
    """Admission bound: while genq_queue_length of a model's queue is at or over this, new jobs
    for it get 503 `overloaded` (or go to the fallback model when they allow it). 0: unbounded."""

    fallback_model: str | None = None
    """A smaller model served by its own workers; jobs with `allow_fallback` go there when their
    model's queue is full."""

    overload_retry_after_s: float = Field(5.0, gt=0)
    """Retry-After sent with a 503 `overloaded`."""

    max_live_jobs_per_key: int = Field(10_000, ge=0)
    """Most queued and running jobs one API key may hold; past it, submissions get 429
    `quota_exceeded` (param `live_jobs`). 0: no bound."""

    max_stored_bytes_per_key: int = Field(1 << 30, ge=0)
    """Most bytes of job input (prompt, messages, metadata) one API key may have stored while its
    records live (GENQ_JOB_TTL_S, counted per UTC day); past it, submissions get 429
    `quota_exceeded` (param `stored_bytes`), so one key cannot fill Redis for all. 0: no bound."""

    storage_headroom: float = Field(0.9, gt=0, le=1)
    """Submissions get 503 `unavailable` (with Retry-After) while the job store's Redis uses more
    than this fraction of its maxmemory, leaving the rest for running jobs to finish and for
    reads. 1: only Redis's own refusal."""

    rate_limit_submit: str = "60/10"
    """Token bucket for job submissions per API key: `capacity/refill per second`. Empty: off."""

    rate_limit_read: str = "600/100"
    """Token bucket for reads (polls, lists, streams) per API key, kept apart from submissions so
    polling never starves them. Empty: off."""

    rate_limit_overrides: dict[str, dict[str, str]] = {}
    """Per-key buckets as JSON: {"<owner id>": {"submit": "600/100", "read": "6000/1000"}}. The owner
    id of a key is `key-` + the first 16 hex digits of its SHA-256."""

    rate_limit_fail_open_reads: bool = True
    """While Redis cannot be asked, let reads through (they fail anyway without Redis)."""

    rate_limit_fail_open_submits: bool = False
    """While Redis cannot be asked, let submissions through (default: refuse with 503)."""

    # --- Worker -----------------------------------------------------------------------------------
    worker_concurrency: int | None = Field(None, ge=1)
    """Celery task threads per worker; default max_batch_size (each running job holds one)."""

    worker_prefetch_multiplier: int = Field(1, ge=1, le=64)
    """Messages a worker reserves per task thread. 1 keeps jobs in the shared queue where any free
    worker can take them; more only hides them from other workers."""

    heartbeat_interval_s: float = Field(2.0, gt=0)
    """How often a worker records that it is alive."""

    heartbeat_ttl_s: float = Field(10.0, gt=0)
    """A worker silent this long is dead: its running jobs may be taken over on redelivery."""

    worker_ready_file: Path | None = None
    """File a worker creates once warmed up (readiness probes); default data_dir/worker-<pid>.ready."""

    worker_pidfile: Path | None = None
    """Where `genq worker` writes its pid for `genq drain`; default data_dir/worker.pid."""

    drain_timeout_s: float = Field(120.0, gt=0)
    """On SIGTERM a worker finishes its jobs for this long, then hands the rest back to the queue."""

    worker_metrics_port: int = Field(9100, ge=0, le=65535)
    """Port of a worker's Prometheus /metrics (all interfaces, so Prometheus can scrape pods);
    0 turns it off."""

    pod_deletion_cost: bool = False
    """In Kubernetes: keep this pod's controller.kubernetes.io/pod-deletion-cost equal to its
    in-flight job count, so scale-in removes idle workers first (needs the worker RBAC Role)."""

    pod_name: str | None = None
    """This pod's name (downward API), for pod_deletion_cost."""

    pod_namespace: str | None = None
    """This pod's namespace (downward API), for pod_deletion_cost."""

    # --- Engine -------------------------------------------------------------------------------------
    model_cache: Path = Path(".genq/models")
    """Where converted model folders are cached."""

    device: Literal["cpu", "cuda"] = "cpu"
    """Where the model runs; one GPU per worker process (choose it with CUDA_VISIBLE_DEVICES)."""

    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    """Model dtype; auto is bf16/fp16 on CUDA and fp32 on CPU."""

    max_batch_size: int = Field(16, ge=1, le=512)
    """Most sequences decoded together in one engine step."""

    max_batch_tokens: int = Field(8192, ge=64)
    """Most tokens (prompts and outputs of all running sequences) held in the KV cache at once."""

    torch_threads: int | None = Field(None, ge=1)
    """torch intra-op threads in a worker; default torch's own choice."""

    placeholder_step_s: float = Field(0.01, ge=0)
    """Seconds per step of the placeholder-echo model (it has no weights to take time); tests
    use it to hold jobs running for a known while."""

    fault_engine_fatal_file: Path | None = None
    """TEST-ONLY fault hook (the chaos benchmark): when this file exists, the worker's engine
    deletes it and fails fatally at its next step. Unset in any real deployment."""

    # --- Webhooks -----------------------------------------------------------------------------------
    webhook_secret: SecretStr | None = None
    """Signing secrets `whsec_<base64>`, space-separated while rotating (every delivery carries a
    signature per secret). Unset: deliveries are sent unsigned and a warning is logged."""

    webhook_timeout_s: float = Field(10.0, gt=0, le=60)
    """Seconds one delivery attempt may take (connect, send, first bytes of the answer)."""

    webhook_retry_delays_s: CommaList = ["5", "300", "1800", "7200", "18000", "36000"]
    """Delays before each retry of a failed delivery (jitter is added); after the last, the
    delivery is marked failed. The default spans about a day."""

    webhook_allow_private: bool = False
    """Allow webhook targets on loopback/private/link-local addresses and any port (local
    development and tests only; logged at start-up)."""

    webhook_allowed_ports: str = "80,443,8000-9999"
    """Ports a webhook target may use (comma-separated ports and ranges)."""

    # --- Operators ----------------------------------------------------------------------------------
    flower_port: int = Field(5555, ge=1, le=65535)
    """Port of `genq flower`."""

    flower_basic_auth: SecretStr | None = None
    """`user:password` for Flower. Required unless Flower binds loopback."""

    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    """Least severity logged."""

    log_prompts: bool = False
    """Log prompts and outputs (off: logs carry job ids and sizes only)."""

    # --- Client (`genq submit`, `genq jobs`) ------------------------------------------------------
    api_url: str = "http://127.0.0.1:8000"
    """The API that `genq submit` and `genq jobs` talk to."""

    api_key: SecretStr | None = None
    """The key `genq submit` and `genq jobs` send (`--api-key` overrides it)."""

    _split = field_validator("api_keys", "models", "webhook_retry_delays_s", mode="before")(_split_commas)

    @field_validator("webhook_retry_delays_s")
    @classmethod
    def _delays_are_numbers(cls, delays: list[str]) -> list[str]:
        for delay in delays:
            try:
                if float(delay) < 0:
                    raise ValueError
            except ValueError:
                raise ValueError(
                    f"GENQ_WEBHOOK_RETRY_DELAYS_S: {delay!r} is not a number of seconds >= 0"
                ) from None
        return delays

    @field_validator("webhook_secret")
    @classmethod
    def _secret_is_whsec(cls, secret: SecretStr | None) -> SecretStr | None:
        if secret is not None:
            parse_secrets(secret.get_secret_value())  # raises a ValueError that names the setting
        return secret

    @model_validator(mode="after")
    def _check_cross_fields(self) -> Settings:
        if self.visibility_timeout_s <= self.job_timeout_s:
            raise ValueError(
                f"GENQ_VISIBILITY_TIMEOUT_S ({self.visibility_timeout_s}) must exceed "
                f"GENQ_JOB_TIMEOUT_S ({self.job_timeout_s}), or long jobs are delivered twice"
            )
        if self.default_max_tokens > self.max_tokens_cap:
            raise ValueError(
                f"GENQ_DEFAULT_MAX_TOKENS ({self.default_max_tokens}) exceeds "
                f"GENQ_MAX_TOKENS_CAP ({self.max_tokens_cap})"
            )
        if self.lease_ttl_s <= self.heartbeat_interval_s:
            raise ValueError(
                f"GENQ_LEASE_TTL_S ({self.lease_ttl_s}) must exceed "
                f"GENQ_HEARTBEAT_INTERVAL_S ({self.heartbeat_interval_s}), or leases lapse between renewals"
            )
        if self.heartbeat_ttl_s <= self.heartbeat_interval_s:
            raise ValueError(
                f"GENQ_HEARTBEAT_TTL_S ({self.heartbeat_ttl_s}) must exceed "
                f"GENQ_HEARTBEAT_INTERVAL_S ({self.heartbeat_interval_s})"
            )
        return self

    @cached_property
    def api_key_digests(self) -> tuple[bytes, ...]:
        return tuple(hashlib.sha256(key.encode()).digest() for key in self.api_keys)

    @cached_property
    def webhook_policy(self) -> TargetPolicy:
        return TargetPolicy(self.webhook_allow_private, parse_ports(self.webhook_allowed_ports))

    @cached_property
    def served_models(self) -> tuple[str, ...]:
        fallback = [self.fallback_model] if self.fallback_model else []
        return tuple(dict.fromkeys([self.model, *self.models, *fallback]))

    @property
    def concurrency(self) -> int:
        return self.worker_concurrency or self.max_batch_size

    def require_redis_url(self) -> str:
        if not self.redis_url:
            raise SystemExit("GENQ_REDIS_URL is not set (only `genq up` starts an embedded server)")
        return self.redis_url


def get_settings() -> Settings:
    return Settings()
