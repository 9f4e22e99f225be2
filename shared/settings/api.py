"""Settings of the API tier: where it binds, who it serves (API keys, hosts), its connections and
requests' bounds, its fast paths, idempotency."""

from __future__ import annotations

import hashlib
from functools import cached_property

from pydantic import BaseModel, Field, SecretStr, field_validator

from shared.settings.types import CommaList, split_commas


class ApiSettings(BaseModel):
    """The API tier."""

    api_host: str = "127.0.0.1"
    """Address `genq api` binds. Anything but loopback requires API keys (or allow_anonymous)."""

    api_port: int = Field(8000, ge=1, le=65535)
    """Port `genq api` binds."""

    api_workers: int = Field(1, ge=1, le=64)
    """Uvicorn worker processes of `genq api`."""

    api_replicas: int = Field(1, ge=1)
    """How many API replicas (hosts or pods) serve this deployment, as the deployment declares it
    (the k8s overlays copy their Deployment's replica count here). More than one requires
    file_storage s3: a local folder is one host's, so replicas would not see each other's files."""

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

    api_linger_max_bytes: int = Field(64 << 20, ge=0)
    """Most bytes of a request body left unread by an early answer (no key, over the rate limit,
    413) the API still reads, and drops, before it closes the connection: a client that reads its
    answer only after sending its whole body (httpx, so the OpenAI SDK) gets the answer instead of
    a connection reset. Dropped bytes cost no memory or disk, and no more CPU than receiving them;
    a body longer than this is cut off by a reset. About what a 100 Mbit/s client sends in
    api_linger_s."""

    api_linger_s: float = Field(5.0, ge=0, le=60)
    """Longest the API reads and drops an early-answered request's body (api_linger_max_bytes)
    before it closes the connection: a client sending slowly holds its connection no longer."""

    metrics_token: SecretStr | None = None
    """Bearer token `GET /metrics` requires (Prometheus: `authorization: {credentials: ...}`).
    Required when `genq api` binds anything but loopback (it refuses to start without it); unset
    on loopback: /metrics is open to local processes."""

    api_hot_paths: bool = True
    """Serve `POST /v1/jobs`, `GET /v1/jobs/{id}` (plain, or a long-poll `?wait=N`) and
    `GET /v1/jobs/{id}/stream` of the common shape through a raw-ASGI path that skips FastAPI's
    per-request machinery (api/routes/hotpath.py); the answers are the same. Turn it off only to
    compare the two."""

    api_autopipeline: bool = True
    """Send the Redis commands that concurrent requests issue in one event-loop turn together, in
    one write (api/redis_io/batching.py). Off: each command goes to Redis on its own, through
    redis-py's connection pool. Turn it off only to compare the two."""

    api_redis_wire: bool = True
    """Write those batches on one connection the API reads itself (api/redis_io/wire.py, which
    reads private names of the pinned redis-py; should they change, it logs `redis_wire_off` at
    start-up and the API serves through redis-py's pipelines). Off: redis-py's pipelines, its
    public API. Turn it off only to compare the two (`python -m bench.redis_io`)."""

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

    schema_compile_timeout_s: float = Field(2.0, gt=0, le=60)
    """Longest a `response_format` JSON schema may take to compile (checked once the caller is
    authenticated, in a compile process, off the event loop); a schema that takes longer is refused
    with 422 naming response_format and its process is replaced."""

    schema_compile_memory_mb: int = Field(512, ge=64)
    """Address space (RLIMIT_AS) of each schema compile process; a schema whose compile needs more
    is refused with 422 naming response_format and its process is replaced."""

    schema_compile_workers: int = Field(1, ge=1, le=16)
    """Schema compile processes per API process: schemas compiled at once (others wait their turn,
    off the event loop)."""

    schema_compile_nice: int = Field(10, ge=0, le=19)
    """Niceness each schema compile process adds to the API process's at its start: a lower CPU
    priority, so the event loop, the workers and Redis win the CPU over a tenant's costly
    schemas. 0: the API's own priority."""

    schema_compiles_per_key: int = Field(1, ge=0)
    """Most schema compiles (not answered from the verdict cache) one API key may have queued or
    running at once in one API process; past it 429 naming response_format, with Retry-After, so
    one key cannot occupy the compile pool. 0: no bound."""

    schema_compile_cpu_s_per_key_minute: float = Field(15.0, ge=0)
    """CPU seconds of schema compiling (schemas not answered from the verdict cache) one API key
    may spend per minute in one API process, refilled evenly and held up to a minute's worth; a
    key past it gets 429 naming response_format, with Retry-After, until it refills, so schemas
    made to miss the cache cannot hold a core. 0: no bound."""

    schema_cache_entries: int = Field(4096, ge=0)
    """Verdicts on JSON schemas (compiles, or why not) kept per API process, by the SHA-256 of the
    schema's canonical JSON, so a repeated schema is not compiled again. 0: none kept."""

    _split_hosts = field_validator("allowed_hosts", mode="before")(split_commas)

    @field_validator("api_keys", mode="before")
    @classmethod
    def _keys_as_text(cls, keys: object) -> object:
        return ",".join(str(key) for key in keys) if isinstance(keys, list | tuple) else keys

    @cached_property
    def api_key_digests(self) -> tuple[bytes, ...]:
        keys = (key.strip() for key in self.api_keys.get_secret_value().split(","))
        return tuple(hashlib.sha256(key.encode()).digest() for key in keys if key)
