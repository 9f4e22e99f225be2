"""Worker start-up: build the engine, warm it up, then consume; drain on SIGTERM.

The engine loads and warms up before Celery connects to the broker, so a worker takes no job
it is not ready to run; the ready file (readiness probes, `genq health worker`) appears only
once Celery is consuming.
"""

from __future__ import annotations

import gc
import json
import logging
import os
from collections.abc import Callable
from typing import Any

import prometheus_client
from celery import signals

from shared import keys, metrics
from shared.celery_app import create_celery_app
from shared.config import Settings
from shared.logging import configure_logging
from workers.engine import EngineConfig, StepStats, build_engine
from workers.runtime import FATAL_EXIT, WorkerRuntime

log = logging.getLogger("genq.worker")
_runtime: WorkerRuntime | None = None


def runtime() -> WorkerRuntime:
    if _runtime is None:
        raise RuntimeError("the worker runtime is not started (run the worker with `genq worker`)")
    return _runtime


def engine_config(settings: Settings) -> EngineConfig:
    return EngineConfig(
        model=settings.model,
        model_cache=settings.model_cache,
        device=settings.device,
        dtype=settings.dtype,
        max_batch_size=settings.max_batch_size,
        max_batch_tokens=settings.max_batch_tokens,
        torch_threads=settings.torch_threads,
        placeholder_step_s=settings.placeholder_step_s,
        on_step=_observe_step(settings.model),
        on_fatal=_exit_on_fatal,
    )


def _observe_step(model: str) -> Callable[[StepStats], None]:
    batch_size = metrics.BATCH_SIZE.labels(model)
    tokens = metrics.GENERATED_TOKENS.labels(model)

    def observe(step: StepStats) -> None:
        if step.batch_size:
            batch_size.observe(step.batch_size)
        tokens.inc(step.tokens)

    return observe


def _exit_on_fatal(error: BaseException) -> None:
    """The engine cannot go on: exit non-zero so the supervisor restarts the worker. The jobs this
    worker held stay unacknowledged and come back after the visibility timeout."""
    log.critical(json.dumps({"event": "engine_fatal", "error": repr(error)}))
    logging.shutdown()
    os._exit(FATAL_EXIT)


def run_worker(settings: Settings, queues: list[str] | None = None, concurrency: int | None = None) -> None:
    """Start a worker in this process (blocks until it is shut down)."""
    global _runtime  # noqa: PLW0603  (one runtime per worker process; tasks reach it here)
    configure_logging(settings.log_level)
    queues = queues or [keys.queue_for_model(settings.model)]
    serves_model = keys.queue_for_model(settings.model) in queues
    _runtime = WorkerRuntime(settings, build_engine(engine_config(settings)) if serves_model else None)
    _runtime.start()
    if settings.worker_metrics_port:
        _export_readiness(queues)
        prometheus_client.start_http_server(settings.worker_metrics_port, addr="0.0.0.0")  # noqa: S104
    pidfile = settings.worker_pidfile or settings.data_dir / "worker.pid"
    pidfile.parent.mkdir(parents=True, exist_ok=True)
    pidfile.write_text(str(os.getpid()))
    app = create_celery_app(settings)
    import workers.tasks  # noqa: F401  (registers the tasks on the app)
    from workers import webhooks  # noqa: F401  (registers the webhook delivery task)

    argv = [
        "worker", "--pool=threads", f"--concurrency={concurrency or settings.concurrency}",
        f"--queues={','.join(queues)}", "--without-gossip", "--without-mingle",
        f"--hostname=genq-{_runtime.worker_id}", f"--loglevel={settings.log_level}", "--task-events",
    ]  # fmt: skip
    try:
        app.worker_main(argv)
    finally:
        _runtime.stop()
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
    # The model, torch, transformers and Celery are loaded for good (~410k objects with the default
    # model). Freezing them keeps the cyclic GC from traversing them: a full collection took
    # ~330 ms on this 2-core VM otherwise, a pause in the middle of every batch it hit.
    gc.freeze()
    if _runtime is not None:
        _runtime.mark_ready()


@signals.worker_shutting_down.connect
def _on_shutdown(sig: str = "", how: str = "", **_: Any) -> None:
    if _runtime is not None:
        log.info(json.dumps({"event": "worker_draining", "signal": sig, "how": how,
                             "inflight": _runtime.inflight}))  # fmt: skip
        _runtime.drain(_runtime.settings.drain_timeout_s)
