"""The Celery app both tiers share: broker, reliability options and routing.

Reliability choices (each closes a known trap of Celery on Redis):
- acks_late + reject_on_worker_lost: a message is acknowledged only after its job ended, so a
  worker killed mid-job leaves it unacknowledged and the broker hands it to another worker.
- prefetch multiplier 1: a worker reserves no more messages than it has task threads, so jobs
  do not sit hoarded in one worker while others idle.
- visibility_timeout from settings (kombu's default is 3,600 s): how soon a dead worker's
  messages come back; it must exceed the job timeout or long jobs are delivered twice. A
  second delivery of a job still running on a live worker is dropped by the job store's claim.
- priority steps: interactive jobs go to kombu's priority-0 list, batch jobs to step 9;
  workers BRPOP priority 0 first, so an interactive job overtakes any number of batch jobs.
"""

from __future__ import annotations

from celery import Celery

from shared import keys
from shared.config import Settings
from shared.jobqueue import kombu_layout

#: Seconds a synchronous broker command (publish, ack, restore) may wait for its reply.
BROKER_SOCKET_TIMEOUT_S = 10.0
#: Seconds to connect to the broker before the attempt counts as failed (and is retried).
BROKER_CONNECT_TIMEOUT_S = 5.0


def create_celery_app(settings: Settings) -> Celery:
    app = Celery("genq", broker=settings.require_redis_url(), set_as_current=True)
    app.conf.update(
        task_serializer="json",
        accept_content=["json"],
        task_ignore_result=True,
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        task_acks_on_failure_or_timeout=True,
        worker_prefetch_multiplier=settings.worker_prefetch_multiplier,
        worker_send_task_events=settings.worker_task_events,
        task_send_sent_event=False,
        worker_hijack_root_logger=False,
        broker_connection_retry_on_startup=True,
        broker_transport_options={
            "visibility_timeout": settings.visibility_timeout_s,
            # kombu sweeps for expired unacked messages every interval x throttle seconds (100 s
            # by default): sweep often enough that a dead worker's jobs come back soon after the
            # visibility timeout, at the cost of one ZRANGE per sweep.
            "unacked_restore_interval": max(1, min(10, settings.visibility_timeout_s // 4)),
            "unacked_restore_throttle": 1,
            # kombu's layout as genq's scripts read and write it (priority steps, their lists' names).
            **kombu_layout.TRANSPORT_OPTIONS,
            "socket_keepalive": True,
            "health_check_interval": 10,
            # Without these, a synchronous broker command waits forever on a connection that
            # went away without closing (kombu's docs). After a Redis restart, a worker's consumer
            # was seen to stop after its first reconnect attempt and never log again
            # (tests/faults/test_redis_restart.py: once in CI, once in ~16 loaded local runs); a
            # wait without a timeout is the documented way to get there. BRPOP is not affected:
            # the worker's event loop reads it only once its socket is readable.
            "socket_timeout": BROKER_SOCKET_TIMEOUT_S,
            "socket_connect_timeout": BROKER_CONNECT_TIMEOUT_S,
        },
        task_default_queue=keys.queue_for_model(settings.model),
        worker_soft_shutdown_timeout=settings.drain_timeout_s,
        worker_enable_soft_shutdown_on_idle=False,
    )
    return app


#: The Redis lists holding a queue's messages, in the order a worker's BRPOP names them.
queue_lists = kombu_layout.queue_lists
