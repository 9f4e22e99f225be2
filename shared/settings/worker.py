"""Settings of a worker process: its Celery threads and prefetch, heartbeat, readiness, drain,
metrics port and its pod in Kubernetes."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, Field


class WorkerSettings(BaseModel):
    """The worker process."""

    worker_concurrency: int | None = Field(None, ge=1)
    """Celery task threads per worker; default max_batch_size (each running job holds one)."""

    worker_prefetch_multiplier: int = Field(1, ge=1, le=64)
    """Messages a worker reserves per task thread. 1 keeps jobs in the shared queue where any free
    worker can take them; more only hides them from other workers."""

    worker_take_queued: bool = True
    """A task thread whose job ended gets the next job from the queue's Redis lists itself, with no
    broker delivery of its own: a waiting message is popped and its job claimed in one atomic
    step, and with none waiting the thread waits worker_take_wait_s for one: a worker spends about
    a third of the CPU per job that a broker delivery costs (bench/machinery.py).
    The order (priority steps, oldest first) and the bound (one job per thread) are the delivery's,
    and a taken job is covered by its lease as a delivered one is. Off: every job is a Celery task
    of its own, as Flower's task view then shows them. A webhook worker's threads do the same with
    deliveries (workers/webhooks/intake.py): a waiting first-hand delivery message is popped and
    its delivery claimed in one step (a retry's, which carries an eta, is left to Celery, which
    holds it until due)."""

    worker_take_wait_s: float = Field(0.5, ge=0.0, le=5.0)
    """How long a task thread whose job (or delivery) ended waits on the empty queue for the next
    one before it goes back to Celery (worker_take_queued). A thread that waits keeps its task
    running (and its message unacknowledged) that long; 0: it only takes one already waiting. A
    worker that runs a model never waits on the webhook queue (its threads are the jobs')."""

    worker_task_events: bool = False
    """Send Celery's task events (received, started, succeeded) for Flower's live task view. Off
    by default: three PUBLISHes per job on the worker's consumer thread, a large share of its CPU
    at high job rates, and nothing in genq reads them (its metrics and job records
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
