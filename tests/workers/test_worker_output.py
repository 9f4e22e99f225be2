"""What a newcomer's terminal shows when a worker starts with the default model: no warnings
about the installed packages they cannot act on (workers/engine/quiet.py), and what the worker
sends to Redis per job: no Celery task events unless asked for (GENQ_WORKER_TASK_EVENTS)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import pytest
import redis

from shared.config import Settings
from tests.conftest import WorkerProcess, api_client

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

#: What used to come on every start (torchao's CUDA-only kernels and Triton, torch's deprecation).
UNACTIONABLE = ("Failed to load", "Detected no triton", "is an Enum subclass", "deprecated")


def test_a_default_model_worker_starts_without_unactionable_warnings(
    make_settings: Callable[..., Settings], start_worker: Callable[..., WorkerProcess]
) -> None:
    worker = start_worker(make_settings(model="smollm2-135m-instruct"))
    log = worker.log_path.read_text()
    assert '"event": "worker_ready"' in log  # the output checked is a whole start-up
    assert not [line for line in log.splitlines() if any(text in line for text in UNACTIONABLE)], log
    assert "Traceback" not in log


def _celery_events(client: redis.Redis, seen: list[str], stop: threading.Event) -> None:
    pubsub = client.pubsub(ignore_subscribe_messages=True)  # type: ignore[no-untyped-call]  # unannotated in redis-py
    pubsub.psubscribe("*celeryev*")
    while not stop.is_set():
        message = pubsub.get_message(timeout=0.2)
        if message is not None:
            seen.append(str(message["channel"]))
    pubsub.close()


@pytest.mark.parametrize("task_events", [False, True])
async def test_task_events_are_sent_only_when_asked_for(
    make_settings: Callable[..., Settings],
    redis_client: redis.Redis,
    start_worker: Callable[..., WorkerProcess],
    task_events: bool,
) -> None:
    settings = make_settings(worker_task_events=task_events)
    seen: list[str] = []
    stop = threading.Event()
    listener = threading.Thread(target=_celery_events, args=(redis_client, seen, stop), daemon=True)
    listener.start()
    try:
        start_worker(settings)
        async with api_client(settings) as api:
            job = (await api.post("/v1/jobs", json={"prompt": "events?", "max_tokens": 2},
                                  headers={"Prefer": "wait=30"})).json()  # fmt: skip
        assert job["status"] == "succeeded"
        time.sleep(1.0)  # events are flushed from the worker's loop soon after the task
    finally:
        stop.set()
        listener.join(5)
    task_events_seen = [channel for channel in seen if "task." in channel]
    assert bool(task_events_seen) == task_events, seen
