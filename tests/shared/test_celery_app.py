"""shared/celery_app.py: the Celery app both tiers share takes its reliability options from the
settings, and publishes a model's jobs onto that model's queue, one Redis list per priority step
(interactive on the bare list that workers pop first, batch on step 9), in the suite's real Redis."""

from __future__ import annotations

import json
from collections.abc import Callable

import redis

from shared import keys
from shared.celery_app import create_celery_app
from shared.config import Settings


def test_settings_reach_the_app(make_settings: Callable[..., Settings]) -> None:
    settings = make_settings(visibility_timeout_s=900, worker_prefetch_multiplier=1, worker_task_events=False)
    app = create_celery_app(settings)
    try:
        options = app.conf.broker_transport_options
        assert options["visibility_timeout"] == 900
        # A dead worker's messages come back within seconds of the visibility timeout.
        assert 1 <= options["unacked_restore_interval"] <= 10
        assert app.conf.task_acks_late and app.conf.task_reject_on_worker_lost
        assert app.conf.worker_prefetch_multiplier == 1 and not app.conf.worker_send_task_events
        assert app.conf.task_default_queue == keys.queue_for_model(settings.model)
    finally:
        app.close()


def test_jobs_go_to_the_models_queue_one_list_per_priority(
    make_settings: Callable[..., Settings], redis_client: redis.Redis
) -> None:
    settings = make_settings()
    queue = keys.queue_for_model(settings.model)
    app = create_celery_app(settings)
    try:
        app.send_task(keys.GENERATE_TASK, args=["interactive"], task_id="interactive", priority=0)
        app.send_task(keys.GENERATE_TASK, args=["batch"], task_id="batch", priority=9)
    finally:
        app.close()
    for task_id, priority in (("interactive", 0), ("batch", 9)):
        waiting = [json.loads(m) for m in redis_client.lrange(keys.queue_key(queue, priority), 0, -1)]
        assert [m["headers"]["id"] for m in waiting] == [task_id]
        assert json.loads(waiting[0]["headers"]["argsrepr"].replace("'", '"')) == [task_id]
