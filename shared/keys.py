"""Every Redis key and channel genq uses, with its lifetime. Nothing else builds key names.

Queue keys belong to Celery's Redis transport (kombu): a queue `Q` is a list at key `Q` for
priority 0 and `Q\\x06\\x16<p>` for the other priority steps; workers BRPOP them in priority
order, so priority 0 is served first.
"""

from __future__ import annotations

import hashlib

PREFIX = "genq"

#: Hash of one job's record. TTL: Settings.job_ttl_s, set when created.
JOB = PREFIX + ":job:{job_id}"

#: Sorted set of one owner's job ids, scored by creation time in microseconds (the list
#: endpoint pages through it). TTL: job_ttl_s, renewed on each submission; stale members
#: (records that expired) are trimmed on submit.
OWNER_JOBS = PREFIX + ":owner:{owner}:jobs"

#: String "<job id> <request digest>" for an Idempotency-Key. TTL: Settings.idempotency_ttl_s.
IDEMPOTENCY = PREFIX + ":idem:{owner}:{key_digest}"

#: Sorted set of worker ids scored by their last heartbeat (Unix seconds). No TTL: readers
#: only count members newer than heartbeat_ttl_s, and workers remove themselves on exit.
WORKERS = PREFIX + ":workers"

#: Pub/sub channel: a job id each time a job reaches a terminal state (long-pollers wake on it).
JOB_EVENTS_CHANNEL = PREFIX + ":events:jobs"

#: Pub/sub channel: a job id each time a client cancels a job (workers holding it stop it).
CANCEL_CHANNEL = PREFIX + ":events:cancel"

#: Celery's Redis transport keeps delivered, unacknowledged messages here (kombu's names).
KOMBU_UNACKED = "unacked"
KOMBU_UNACKED_INDEX = "unacked_index"

#: kombu's separator between a queue name and its priority step.
PRIORITY_SEPARATOR = "\x06\x16"

#: Celery task that runs one generation job; its id is the job id.
GENERATE_TASK = "genq.generate"


def job(job_id: str) -> str:
    return JOB.format(job_id=job_id)


def owner_jobs(owner: str) -> str:
    return OWNER_JOBS.format(owner=owner)


def idempotency(owner: str, key: str) -> str:
    digest = hashlib.sha256(key.encode()).hexdigest()
    return IDEMPOTENCY.format(owner=owner, key_digest=digest)


def queue_for_model(model: str) -> str:
    """The Celery queue that the workers of one model consume."""
    return f"{PREFIX}.{model}"


def queue_key(queue: str, priority: int) -> str:
    """The Redis list holding `queue`'s messages of a kombu priority step (0 is served first)."""
    return f"{queue}{PRIORITY_SEPARATOR}{priority}" if priority else queue
