"""Worker start-up: build the engine, warm it up, then consume; drain on SIGTERM.

The engine loads and warms up before Celery connects to the broker, so a worker takes no job
it is not ready to run; the ready file (readiness probes, `genq health worker`) appears only
once Celery is consuming.
"""

from __future__ import annotations

import errno
import gc
import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import prometheus_client
from celery import signals
from celery.utils.nodenames import default_nodename

from shared import keys, metrics
from shared.celery_app import create_celery_app, queue_lists
from shared.config import Settings
from shared.logging import configure_logging, fields
from workers import context
from workers.consuming import consumer_stopper
from workers.engine import EngineConfig, FatalEngineError, StepStats, build_engine
from workers.runtime import WorkerRuntime

log = logging.getLogger("genq.worker")

#: Ports tried after a taken GENQ_WORKER_METRICS_PORT (several workers on one host).
METRICS_PORT_TRIES = 16


def engine_config(
    settings: Settings, on_fatal: Callable[[FatalEngineError], None] | None = None
) -> EngineConfig:
    return EngineConfig(
        model=settings.model,
        model_cache=settings.model_cache,
        device=settings.device,
        dtype=settings.dtype,
        max_batch_size=settings.max_batch_size,
        max_batch_tokens=settings.max_batch_tokens,
        torch_threads=settings.torch_threads,
        backend=settings.engine_backend,
        llamacpp_sequence_tokens=settings.llamacpp_sequence_tokens,
        llamacpp_kv_cells=settings.llamacpp_kv_cells,
        llamacpp_prefix_cache=settings.llamacpp_prefix_cache,
        llamacpp_cache_tokens=settings.llamacpp_cache_tokens,
        llamacpp_batch_invariant=settings.llamacpp_batch_invariant,
        placeholder_step_s=settings.placeholder_step_s,
        on_step=_observe_step(settings.model),
        on_fatal=on_fatal,
        fault_file=settings.fault_engine_fatal_file,
    )


def _observe_step(model: str) -> Callable[[StepStats], None]:
    batch_size = metrics.BATCH_SIZE.labels(model)
    tokens = metrics.GENERATED_TOKENS.labels(model)
    prompt, cached = metrics.PROMPT_TOKENS.labels(model), metrics.PROMPT_TOKENS_CACHED.labels(model)
    evictions, kept = metrics.PREFIX_CACHE_EVICTIONS.labels(model), metrics.PREFIX_CACHE_TOKENS.labels(model)

    def observe(step: StepStats) -> None:
        if step.batch_size:
            batch_size.observe(step.batch_size)
        tokens.inc(step.tokens)
        if step.prefill_tokens:  # most steps only decode: no prompt, nothing new in the cache
            prompt.inc(step.prefill_tokens)
            cached.inc(step.cache.cached_prompt_tokens)
        if step.cache.evictions:
            evictions.inc(step.cache.evictions)
        kept.set(step.cache.kept_tokens)

    return observe


def serve_metrics(port: int) -> int | None:
    """Serve this worker's /metrics on `port`, or on the next free one when another process on
    this host holds it (said in one log line); None when none of them is free."""
    for candidate in range(port, port + METRICS_PORT_TRIES):
        try:
            prometheus_client.start_http_server(candidate, addr="0.0.0.0")  # noqa: S104
        except OSError as exc:
            if exc.errno != errno.EADDRINUSE:
                raise
            continue
        if candidate != port:
            message = (
                f"GENQ_WORKER_METRICS_PORT {port} is taken (another worker here?); /metrics on {candidate}"
            )
            log.warning("metrics_port_taken", extra=fields(port=candidate, message=message))
        return candidate
    last = port + METRICS_PORT_TRIES - 1
    message = f"GENQ_WORKER_METRICS_PORT {port} to {last} are all taken: this worker serves no /metrics"
    log.warning("metrics_off", extra=fields(message=message))
    return None


def _pidfile(settings: Settings, serves_model: bool) -> Path:
    """Where `genq drain` finds the model worker; a webhook-only worker beside it keeps its own."""
    if settings.worker_pidfile is not None:
        return settings.worker_pidfile
    return settings.data_dir / ("worker.pid" if serves_model else "webhook-worker.pid")


def run_worker(settings: Settings, queues: list[str] | None = None, concurrency: int | None = None) -> None:
    """Start a worker in this process (blocks until it is shut down)."""
    configure_logging(settings.log_level)
    queues = queues or [keys.queue_for_model(settings.model)]
    serves_model = keys.queue_for_model(settings.model) in queues
    runtime = WorkerRuntime(settings)
    runtime.slots = concurrency or settings.concurrency
    if serves_model:
        runtime.attach_engine(build_engine(engine_config(settings, on_fatal=runtime.on_engine_fatal)))
        if settings.worker_take_queued:
            runtime.take_from(queue_lists(keys.queue_for_model(settings.model)))
    context.install(runtime)
    runtime.start()
    if settings.worker_metrics_port:
        _export_readiness(queues)
        serve_metrics(settings.worker_metrics_port)
    pidfile = _pidfile(settings, serves_model)
    pidfile.parent.mkdir(parents=True, exist_ok=True)
    pidfile.write_text(str(os.getpid()))
    app = create_celery_app(settings)
    app.conf.broker_transport = "workers.broker:Transport"  # retries writes a full Redis refuses
    hostname = f"genq-{runtime.worker_id}"
    runtime.stop_consuming = consumer_stopper(app, default_nodename(hostname), queues)
    import workers.tasks  # noqa: F401  (registers the tasks on the app)
    from workers.webhooks import tasks as webhook_tasks  # noqa: F401  (registers the webhook delivery tasks)

    argv = [
        "worker", "--pool=threads", f"--concurrency={runtime.slots}",
        f"--queues={','.join(queues)}", "--without-gossip", "--without-mingle",
        f"--hostname={hostname}", f"--loglevel={settings.log_level}",
        *(["--task-events"] if settings.worker_task_events else []),
    ]  # fmt: skip
    try:
        app.worker_main(argv)
    finally:
        runtime.stop()
        pidfile.unlink(missing_ok=True)


def _export_readiness(queues: list[str]) -> None:
    """genq_worker_ready{queue}: 0 while loading, 1 once Celery consumes, 0 again from the drain
    on. Summed per queue, it is how many workers serve it (the "no ready worker" alert)."""
    gauges = [metrics.WORKER_READY.labels(queue) for queue in queues]

    def mark(value: int) -> Callable[..., None]:
        def handler(**_: Any) -> None:
            for gauge in gauges:
                gauge.set(value)

        return handler

    mark(0)()
    # weak=False: Celery keeps only weak references by default, and these closures have no other.
    signals.worker_ready.connect(mark(1), weak=False)
    signals.worker_shutting_down.connect(mark(0), weak=False)


@signals.worker_ready.connect
def _on_ready(**_: Any) -> None:
    # The model, torch, transformers and Celery are loaded for good. Freezing them keeps the cyclic
    # GC from traversing them: otherwise a full collection is a long pause in the middle of a batch.
    gc.freeze()
    context.runtime().mark_ready()


@signals.worker_shutting_down.connect
def _on_shutdown(sig: str = "", how: str = "", **_: Any) -> None:
    runtime = context.runtime()
    log.info("worker_draining", extra=fields(signal=sig, how=how, inflight=runtime.inflight))
    runtime.drain(runtime.settings.drain_timeout_s)
