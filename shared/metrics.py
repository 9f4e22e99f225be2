"""Prometheus metrics: their names (shared with the deployment files), the worker's and the
API's instruments, and the queue statistics that drive autoscaling.

`genq_queue_length{queue}` counts jobs accepted and not yet running wherever their message
sits: in the broker's lists (every priority step of the queue) or delivered to a worker that
has not started them (kombu's `unacked` hash holds those, together with the running jobs' own
messages, since acknowledgement is late). So: waiting + (unacked - running). Raw LLEN misses
the prefetched ones, and a fleet scaled on it never grows while workers hoard messages.
"""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

#: Jobs accepted and not yet running, wherever their message sits (the autoscaling signal).
QUEUE_LENGTH_METRIC = "genq_queue_length"

# --- API ------------------------------------------------------------------------------------------
REQUESTS_INFLIGHT = Gauge(
    "genq_gateway_requests_inflight", "HTTP requests being served.", multiprocess_mode="livesum"
)
HTTP_REQUESTS = Counter("genq_http_requests_total", "HTTP requests answered.", ["route", "method", "status"])
REDIS_BATCH = Histogram(
    "genq_api_redis_batch_commands",
    "Commands the API sent to Redis per pipeline (automatic pipelining, api/redis_io/batching.py).",
    buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256),
)
HTTP_DURATION = Histogram(
    "genq_http_request_duration_seconds",
    "Time to answer an HTTP request (long-polls included).",
    ["route"],
    buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
)
JOBS = Counter("genq_jobs_total", "Jobs by how they ended (or were accepted).", ["status"])
REAPER_ACTIONS = Counter(
    "genq_reaper_actions_total",
    "Jobs the reaper rescued or ended, by action: requeued (lease lapsed), failed (lease lapsed "
    "past GENQ_MAX_ATTEMPTS), expired (queued past its deadline), repushed (its message was lost), "
    "promoted (a follower whose leader vanished), webhook_repushed (a pending webhook delivery's "
    "message was lost).",
    ["action"],
)
#: What the reaper does to a job (shared/jobqueue/reaper.py), the `action` label of REAPER_ACTIONS.
REAPER_ACTION_NAMES = ("requeued", "failed", "expired", "repushed", "promoted", "webhook_repushed")
# Every series exists from the start (at 0), so rate() and the dashboard see a quiet system as 0.
for _action in REAPER_ACTION_NAMES:
    REAPER_ACTIONS.labels(_action)
HANDED_BACK = Counter(
    "genq_jobs_handed_back_total", "Jobs a worker handed back to the queue, by why.", ["reason"]
)
STORAGE_REFUSED = Counter(
    "genq_storage_refused_total", "Writes the job store refused (maxmemory, read-only, snapshot).", ["tier"]
)
for _tier in ("api", "worker", "broker"):
    STORAGE_REFUSED.labels(_tier)
RATE_LIMITED = Counter("genq_rate_limited_total", "Requests refused by a rate limit.", ["kind"])
SHED = Counter("genq_shed_total", "Submissions refused or rerouted by admission control.", ["reason"])

# --- Batches (the batch feeder, in the API) ---------------------------------------------------------
BATCHES = Counter("genq_batches_total", "Batches ended, by final status.", ["status"])
for _status in ("completed", "failed", "expired", "cancelled"):
    BATCHES.labels(_status)
BATCH_LINES = Counter(
    "genq_batch_lines_total",
    "Batch lines whose result was written: completed (output file) or failed (error file).",
    ["result"],
)
for _result in ("completed", "failed"):
    BATCH_LINES.labels(_result)

# --- Webhooks (the webhook worker) ------------------------------------------------------------------
WEBHOOK_ATTEMPTS = Counter(
    "genq_webhook_attempts_total",
    "Webhook delivery attempts by event and outcome (delivered, retrying, failed, gone, refused).",
    ["event", "outcome"],
)
WEBHOOK_DURATION = Histogram(
    "genq_webhook_attempt_duration_seconds",
    "Time one webhook delivery attempt took.",
    buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
)

# --- Worker ---------------------------------------------------------------------------------------
_LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)
INFERENCE_DURATION = Histogram(
    "genq_model_inference_duration_seconds",
    "Time a job spent in the engine.",
    ["model"],
    buckets=_LATENCY_BUCKETS,
)
JOB_LATENCY = Histogram(
    "genq_job_latency_seconds",
    "From a job's acceptance to its success: what its client waited (queue, hand-backs, inference).",
    ["queue"],
    buckets=_LATENCY_BUCKETS,
)
BATCH_SIZE = Histogram(
    "genq_batch_size_distribution",
    "Sequences in each engine step.",
    ["model"],
    buckets=(1, 2, 4, 8, 12, 16, 24, 32, 48, 64, 128, 256),
)
GENERATED_TOKENS = Counter("genq_generated_tokens_total", "Tokens generated.", ["model"])
PROMPT_TOKENS = Counter(
    "genq_prompt_tokens_total", "Prompt tokens prefilled, those the prefix cache held included.", ["model"]
)
PROMPT_TOKENS_CACHED = Counter(
    "genq_prompt_tokens_cached_total",
    "Prompt tokens whose KV cells the prefix cache held: not computed again.",
    ["model"],
)
PREFIX_CACHE_EVICTIONS = Counter(
    "genq_prefix_cache_evictions_total",
    "Rows whose kept KV cells were dropped to keep the prefix cache within GENQ_LLAMACPP_CACHE_TOKENS.",
    ["model"],
)
PREFIX_CACHE_TOKENS = Gauge("genq_prefix_cache_tokens", "Tokens the prefix cache keeps now.", ["model"])
TIME_TO_FIRST_TOKEN = Histogram(
    "genq_time_to_first_token_seconds",
    "From admission to the first token.",
    ["model"],
    buckets=_LATENCY_BUCKETS,
)
QUEUE_WAIT = Histogram(
    "genq_queue_wait_seconds", "From acceptance to the start of a run.", ["queue"], buckets=_LATENCY_BUCKETS
)
WORKER_READY = Gauge(
    "genq_worker_ready",
    "1 while this worker consumes the queue (warmed up, not draining), else 0.",
    ["queue"],
)


@dataclass(frozen=True, slots=True)
class QueueStats:
    queue: str
    #: Accepted and not running: waiting in the queue's lists, or reserved by a worker and not
    #: yet started (the job store's index of the queue's queued jobs, keys.QUEUED). For the
    #: webhooks queue: the deliveries waiting in its list.
    length: int
    running: int


@dataclass(frozen=True, slots=True)
class RedisMemory:
    """What Redis's INFO memory reports: used_memory, and maxmemory (0: no limit)."""

    used_bytes: int
    max_bytes: int

    def fraction(self) -> float:
        """Share of maxmemory in use (0 without a limit)."""
        return self.used_bytes / self.max_bytes if self.max_bytes else 0.0


@dataclass(frozen=True, slots=True)
class QueueSnapshot:
    """One read of the queues and of the job store's Redis, for /metrics and admission."""

    stats: list[QueueStats]
    unacked_total: int
    memory: RedisMemory


class QueueStatsCollector(Collector):
    """Exposes the last computed queue statistics (computed async by the /metrics route)."""

    def __init__(self, snapshot: QueueSnapshot) -> None:
        self._stats = snapshot.stats
        self._unacked_total = snapshot.unacked_total
        self._memory = snapshot.memory

    def collect(self) -> list[Metric]:
        return [*self._queue_families(), *self._memory_families()]

    def _queue_families(self) -> list[Metric]:
        length = GaugeMetricFamily(
            QUEUE_LENGTH_METRIC,
            "Jobs accepted and not yet running, wherever their message sits.",
            labels=["queue"],
        )
        running = GaugeMetricFamily("genq_jobs_running", "Jobs running now.", labels=["queue"])
        for item in self._stats:
            length.add_metric([item.queue], item.length)
            running.add_metric([item.queue], item.running)
        unacked = GaugeMetricFamily(
            "genq_queue_unacked", "Messages delivered to workers and not yet acknowledged (all queues)."
        )
        unacked.add_metric([], self._unacked_total)
        return [length, running, unacked]

    def _memory_families(self) -> list[Metric]:
        # The names of redis_exporter's redis_memory_used_bytes / redis_memory_max_bytes, prefixed:
        # alerts and the dashboard work without running redis_exporter (docs/operations.md).
        used = GaugeMetricFamily(
            "genq_redis_memory_used_bytes", "Memory the job store's Redis uses (INFO used_memory)."
        )
        used.add_metric([], self._memory.used_bytes)
        limit = GaugeMetricFamily(
            "genq_redis_memory_max_bytes", "The job store's Redis maxmemory (0: no limit set)."
        )
        limit.add_metric([], self._memory.max_bytes)
        return [used, limit]


@dataclass(frozen=True, slots=True)
class BatchSnapshot:
    """The batch feeder's load, read from Redis at scrape time (any API process answers)."""

    #: Batches not yet ended.
    active: int
    #: Their lines queued or running as jobs (or with a result not yet written).
    lines_inflight: int


class BatchStatsCollector(Collector):
    def __init__(self, snapshot: BatchSnapshot) -> None:
        self._snapshot = snapshot

    def collect(self) -> list[Metric]:
        active = GaugeMetricFamily("genq_batches_active", "Batches not yet ended (validating to finalizing).")
        active.add_metric([], self._snapshot.active)
        inflight = GaugeMetricFamily(
            "genq_batch_lines_inflight", "Lines of active batches in their windows (queued or running)."
        )
        inflight.add_metric([], self._snapshot.lines_inflight)
        return [active, inflight]
