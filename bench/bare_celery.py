"""The baseline for bench.end_to_end: stock Celery running a task that does nothing.

    python -m celery -A bench.bare_celery worker --pool=threads --queues=bench.bare ...

The app is genq's Celery app (shared/celery_app.py: the same broker transport options, acks_late,
prefetch multiplier) with one task, so the difference to genq is genq's own work: the HTTP API,
the job records, the engine. The task signals its end by pushing to a key the client BLPOPs,
which costs one Redis command, less than any result backend.
"""

from __future__ import annotations

import os

import redis

from shared.celery_app import create_celery_app
from shared.config import Settings

QUEUE = "bench.bare"
TASK = "bench.noop"
#: List the task pushes to when it has run; the client BLPOPs it.
DONE_KEY = "bench:done:{task_id}"

app = create_celery_app(Settings(_env_file=None, redis_url=os.environ.get("GENQ_REDIS_URL", "redis://")))
_done = redis.Redis.from_url(os.environ.get("GENQ_REDIS_URL", "redis://"))


@app.task(name=TASK)  # type: ignore[untyped-decorator]
def noop(task_id: str) -> None:
    _done.lpush(DONE_KEY.format(task_id=task_id), 1)
