"""Every setting of genq, in one place. Each field is the environment variable GENQ_<NAME>.

Values come from the environment, then an optional `.env` file, then the defaults here,
which are the embedded local stack's. Cross-field rules fail fast at start-up with a
message naming both values.
"""

from __future__ import annotations

import hashlib
import json
from functools import cached_property
from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, PositiveInt, SecretStr, ValidationInfo, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from shared.signing import parse_secrets
from shared.ssrf import TargetPolicy, parse_ports

CommaList = Annotated[list[str], NoDecode]


def _split_commas(value: object) -> object:
    if isinstance(value, str):
        return [item.strip() for item in value.split(",") if item.strip()]
    return value


class Settings(BaseSettings):
    # hide_input_in_errors: a refused value may be an API key or a password, and start-up errors
    # end up in logs; the message names the variable and the rule, never the value.
    model_config = SettingsConfigDict(
        env_prefix="GENQ_", env_file=".env", extra="ignore", frozen=True, validate_default=True,
        hide_input_in_errors=True,
    )  # fmt: skip

    dev: bool = False
    """Development mode: accept placeholder secrets (values containing `CHANGE-ME`, as the
    templates in k8s/components/placeholder-secrets hold). Off: genq refuses to start on them."""

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

    api_keys: SecretStr = SecretStr("")
    """Comma-separated API keys. Only their SHA-256 digests are used (compared in constant time),
    and the value never appears in a repr, log or error. Empty: the API serves anonymously, on
    loopback only unless allow_anonymous."""

    allow_anonymous: bool = False
    """Serve without API keys even on a non-loopback address (trusted networks only)."""

    allowed_hosts: CommaList = ["localhost", "127.0.0.1", "[::1]"]
    """Host header values an anonymous API answers (with or without a port; `*`: any); anything
    else gets 403, so a page on another origin that rebinds its DNS name to this address reads
    nothing. The probes answer under any name. With API keys every Host is served (a Bearer key
    is the protection)."""

    api_limit_concurrency: int = Field(10_000, ge=1)
    """Most connections and requests one `genq api` process holds at once (uvicorn's
    limit_concurrency); past it uvicorn answers 503. A safety net above the per-key limits."""

    api_header_timeout_s: float = Field(10.0, gt=0)
    """A connection that has not sent a request's headers this long after starting it (or after
    connecting) is closed (slow-header clients)."""

    api_keep_alive_s: int = Field(5, ge=1)
    """An idle keep-alive connection is closed after this long."""

    metrics_token: SecretStr | None = None
    """Bearer token `GET /metrics` requires (Prometheus: `authorization: {credentials: ...}`).
    Unset: /metrics is open to whoever reaches the API port."""

    api_hot_paths: bool = True
    """Serve `POST /v1/jobs` and `GET /v1/jobs/{id}` (plain, or a long-poll `?wait=N`) of the
    common shape through a raw-ASGI path that skips FastAPI's per-request machinery
    (api/edge/hotpath.py); the answers are the same. Turn it off only to compare the two."""

    api_autopipeline: bool = True
    """Send the Redis commands that concurrent requests issue in one event-loop turn as one write
    on one connection (shared/autopipeline.py). Off, or should its start-up check fail (logged as
    `autopipeline_off`): each command goes through redis-py's own connection pool."""

    max_body_bytes: int = Field(1 << 20, ge=1024)
    """Largest request body accepted; larger ones get 413."""

    max_wait_s: float = Field(60.0, ge=0, le=300)
    """Longest long-poll (`?wait=`) or `Prefer: wait=` hold."""

    max_streams_per_key: int = Field(100, ge=1)
    """Most event streams (`/v1/jobs/{id}/stream`, OpenAI `stream: true`,
    `/v1/batches/{id}/events`) one API key holds open at once in one API process; past it 429
    naming the limit. Per-key override: `streams` in rate_limit_overrides."""

    max_long_polls_per_key: int = Field(100, ge=1)
    """Most waiting requests (`?wait=`, `Prefer: wait=`, non-streaming OpenAI calls) one API key
    holds at once in one API process; past it 429 naming the limit. Per-key override:
    `long_polls` in rate_limit_overrides."""

    list_max_bytes: int = Field(256 << 10, ge=4096)
    """Most bytes of job summaries one `GET /v1/jobs` page carries; a page that would pass it ends
    early with a next_cursor (lists never carry inputs or outputs)."""

    idempotency_ttl_s: int = Field(86_400, ge=60)
    """How long an Idempotency-Key maps to its job."""

    # --- Response cache ------------------------------------------------------------------------
    cache_enabled: bool = True
    """Answer identical deterministic requests (temperature 0 or a fixed seed) from the response
    cache, and coalesce identical ones in flight into one generation (docs/cache.md)."""

    cache_shared_across_keys: bool = False
    """With API keys, each key has its own cache and coalescing (one tenant never learns, from
    `cached: true`, what another asked). Set it for a single-tenant install whose keys trust each
    other, to share hits across them. Without keys there is one scope anyway."""

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
    `quota_exceeded` (param `live_jobs`). 0: no bound. Per-key override: `live_jobs` in
    rate_limit_overrides."""

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

    rate_limit_overrides: dict[str, dict[str, str]] = {}
    """Per-key limits as JSON: {"<owner id>": {"submit": "600/100", "read": "6000/1000", "streams":
    "500", "long_polls": "500"}}. The owner id of a key is `key-` + the first 16 hex digits of its
    SHA-256."""

    rate_limit_fail_open_reads: bool = True
    """While Redis cannot be asked, let reads through (they fail anyway without Redis)."""

    rate_limit_fail_open_submits: bool = False
    """While Redis cannot be asked, let submissions through (default: refuse with 503)."""

    # --- Files and batches (the OpenAI Batch API, docs/batches.md) --------------------------------
    file_max_bytes: int = Field(200 << 20, ge=1024)
    """Largest file `POST /v1/files` accepts (the upload is streamed to storage, never held in
    memory); larger ones get 413."""

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

    batch_window: int = Field(64, ge=1)
    """Most lines of one batch queued or running as jobs at a time; the feeder tops the window up
    as they finish, so a 50,000-line batch costs Redis a bounded amount."""

    batch_max_inflight: int = Field(256, ge=1)
    """Most lines of all batches queued or running at a time (also bounded by the fleet's slots
    less batch_interactive_reserve). The feeder shares this capacity between the API keys with
    active batches (by batch_key_weights), then round-robin between each key's batches."""

    batch_interactive_reserve: float = Field(0.25, ge=0, lt=1)
    """Share of the live model workers' job slots (their concurrency, published with their
    heartbeats) that batch lines leave free, so an interactive job starts at once instead of
    waiting for a line to finish. 0 lets batches fill every slot; a fleet's batch capacity is
    at least one line."""

    batch_key_weights: dict[str, PositiveInt] = {}
    """Fair-share weights of API keys' batches as JSON {"<owner id>": weight}; a key not named
    weighs 1. Each round of the fair share gives a key as many lines as its weight."""

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

    # --- Worker -----------------------------------------------------------------------------------
    worker_concurrency: int | None = Field(None, ge=1)
    """Celery task threads per worker; default max_batch_size (each running job holds one)."""

    worker_prefetch_multiplier: int = Field(1, ge=1, le=64)
    """Messages a worker reserves per task thread. 1 keeps jobs in the shared queue where any free
    worker can take them; more only hides them from other workers."""

    worker_task_events: bool = False
    """Send Celery's task events (received, started, succeeded) for Flower's live task view. Off
    by default: three PUBLISHes per job on the worker's consumer thread, about 15% of its CPU at
    150 jobs/s (bench/machinery.py), and nothing in genq reads them (its metrics and job records
    say the same); Flower still shows the workers and the broker's queues without them."""

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
    """Engine threads in a worker: torch's intra-op threads, and llama.cpp's n_threads and
    n_threads_batch under that backend; default torch's own choice (the physical cores)."""

    engine_backend: Literal["auto", "torch", "llamacpp"] = "auto"
    """Kernels that run the model: `llamacpp` (llama.cpp via llama-cpp-python; GGUF models on cpu
    only), `torch` (transformers), or `auto`: llamacpp for a GGUF model (the default model) on cpu
    when llama-cpp-python is installed, torch for safetensors/AWQ checkpoints and GPUs."""

    llamacpp_sequence_tokens: int = Field(2048, ge=64)
    """Under llama.cpp: the most tokens (prompt + completion) one job holds, the KV cells of each
    row's own stream; max_batch_size streams are allocated at start (16 x 2048 cells take 360 MiB
    for the default model)."""

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

    webhook_key_secrets: SecretStr | None = None
    """Per-key signing secrets as JSON: {"<owner id>": "whsec_<base64>"}. A key's jobs are signed
    with its own secret (from here, or one made with `POST /v1/webhook-secret`), never with
    webhook_secret, so one tenant's receiver cannot verify, and cannot be sent, another's events."""

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

    _split = field_validator("models", "webhook_retry_delays_s", "allowed_hosts", mode="before")(
        _split_commas
    )

    @field_validator("api_keys", mode="before")
    @classmethod
    def _keys_as_text(cls, keys: object) -> object:
        return ",".join(str(key) for key in keys) if isinstance(keys, list | tuple) else keys

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

    @field_validator("webhook_key_secrets")
    @classmethod
    def _key_secrets_parse(cls, secrets: SecretStr | None) -> SecretStr | None:
        if secrets is not None:
            parse_key_secrets(secrets.get_secret_value())
        return secrets

    @field_validator("webhook_secret")
    @classmethod
    def _secret_is_whsec(cls, secret: SecretStr | None) -> SecretStr | None:
        if secret is not None:
            parse_secrets(secret.get_secret_value())  # raises a ValueError that names the setting
        return secret

    @model_validator(mode="after")
    def _no_placeholders(self) -> Settings:
        if self.dev:
            return self
        for name in placeholder_fields(self):
            raise ValueError(
                f"GENQ_{name.upper()} holds a placeholder value ({PLACEHOLDER}): set a real one, "
                "or GENQ_DEV=1 for a development stack"
            )
        return self

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
        if self.file_storage == "s3" and not self.s3_bucket:
            raise ValueError("GENQ_FILE_STORAGE is s3 but GENQ_S3_BUCKET is unset")
        if self.heartbeat_ttl_s <= self.heartbeat_interval_s:
            raise ValueError(
                f"GENQ_HEARTBEAT_TTL_S ({self.heartbeat_ttl_s}) must exceed "
                f"GENQ_HEARTBEAT_INTERVAL_S ({self.heartbeat_interval_s})"
            )
        return self

    @cached_property
    def api_key_digests(self) -> tuple[bytes, ...]:
        keys = (key.strip() for key in self.api_keys.get_secret_value().split(","))
        return tuple(hashlib.sha256(key.encode()).digest() for key in keys if key)

    @cached_property
    def key_secrets(self) -> dict[str, tuple[bytes, ...]]:
        """Per-owner signing keys from webhook_key_secrets."""
        if self.webhook_key_secrets is None:
            return {}
        return parse_key_secrets(self.webhook_key_secrets.get_secret_value())

    @property
    def cache_scoped_per_key(self) -> bool:
        return bool(self.api_key_digests) and not self.cache_shared_across_keys

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

    def owner_bound(self, owner: str, kind: Literal["live_jobs", "stored_bytes"]) -> int:
        """A key's bound on what it keeps in the store: its override, else the setting."""
        override = self.rate_limit_overrides.get(owner, {}).get(kind)
        if override is not None:
            return int(override)
        return self.max_live_jobs_per_key if kind == "live_jobs" else self.max_stored_bytes_per_key

    def require_redis_url(self) -> str:
        if not self.redis_url:
            raise SystemExit("GENQ_REDIS_URL is not set (only `genq up` starts an embedded server)")
        return self.redis_url


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


def parse_key_secrets(text: str) -> dict[str, tuple[bytes, ...]]:
    """GENQ_WEBHOOK_KEY_SECRETS as {owner id: HMAC keys}; errors name the setting, not values."""
    try:
        raw = json.loads(text)
    except ValueError:
        raise ValueError(
            "GENQ_WEBHOOK_KEY_SECRETS must be a JSON object of owner id -> whsec_ secret"
        ) from None
    if not isinstance(raw, dict) or not all(isinstance(v, str) for v in raw.values()):
        raise ValueError("GENQ_WEBHOOK_KEY_SECRETS must be a JSON object of owner id -> whsec_ secret")
    parsed = {}
    for owner, secret in raw.items():
        try:
            parsed[str(owner)] = parse_secrets(secret)
        except ValueError:
            raise ValueError(
                f"GENQ_WEBHOOK_KEY_SECRETS[{owner!r}] must be whsec_<non-empty base64>"
            ) from None
    return parsed


#: What the shipped secret templates hold instead of a secret.
PLACEHOLDER = "CHANGE-ME"


def placeholder_fields(settings: Settings) -> list[str]:
    """The secret-bearing settings that hold a placeholder (a webhook secret is checked decoded:
    the template's is base64 of a CHANGE-ME text)."""
    found = []
    for name in ("api_keys", "api_key", "flower_basic_auth", "redis_url", "cache_redis_url"):
        value = getattr(settings, name)
        text = value.get_secret_value() if isinstance(value, SecretStr) else value
        if text and PLACEHOLDER in text:
            found.append(name)
    secret = settings.webhook_secret
    signing_keys = list(parse_secrets(secret.get_secret_value())) if secret is not None else []
    if any(PLACEHOLDER.encode() in key for key in signing_keys):
        found.append("webhook_secret")
    if any(PLACEHOLDER.encode() in key for keys in settings.key_secrets.values() for key in keys):
        found.append("webhook_key_secrets")
    return found
