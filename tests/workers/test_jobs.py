"""The worker's side of job records (workers/jobs.py) beyond the scripts' state machines
(tests/shared/jobqueue/test_job_scripts.py): a worker's heartbeat enters it in its registry with its
job slots, leaving takes both out, and the model revision it serves is published for the API."""

from __future__ import annotations

import redis

from shared import keys
from workers.jobs import WorkerJobs


def test_a_heartbeat_registers_the_worker_and_its_slots_and_leaving_removes_both(
    redis_client: redis.Redis,
) -> None:
    jobs = WorkerJobs(redis_client, lease_s=30, max_attempts=3, job_timeout_s=60)
    jobs.heartbeat("w1", slots=16)
    jobs.heartbeat("hooks", keys.WEBHOOK_WORKERS)  # a webhook-only worker publishes no slots
    assert redis_client.zscore(keys.WORKERS, "w1") is not None
    assert redis_client.zscore(keys.WEBHOOK_WORKERS, "hooks") is not None
    assert redis_client.hgetall(keys.WORKER_SLOTS) == {"w1": "16"}
    jobs.leave("w1")
    jobs.leave("hooks", keys.WEBHOOK_WORKERS)
    assert redis_client.zcard(keys.WORKERS) == 0 and redis_client.zcard(keys.WEBHOOK_WORKERS) == 0
    assert redis_client.hgetall(keys.WORKER_SLOTS) == {}


def test_the_model_revision_served_is_published(redis_client: redis.Redis) -> None:
    WorkerJobs(redis_client, lease_s=30, max_attempts=3, job_timeout_s=60).publish_model("m", "rev-1")
    assert redis_client.hget(keys.MODELS, "m") == "rev-1"
