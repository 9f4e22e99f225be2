"""Every Redis key and channel genq uses, with its lifetime. Nothing else builds key names.

Queue keys belong to Celery's Redis transport (kombu): their layout (a list per queue and
priority step, the unacked hash and index) is known in shared/jobqueue/kombu_layout.py alone, and named
here from there.
"""

from __future__ import annotations

import hashlib

from shared.jobqueue import kombu_layout

PREFIX = "genq"

#: Hash of one job's record. TTL: Settings.job_ttl_s, set when created.
JOB = PREFIX + ":job:{job_id}"

#: Sorted set of one owner's job ids, scored by creation time in microseconds (the list
#: endpoint pages through it). TTL: job_ttl_s, renewed on each submission; stale members
#: (records that expired) are trimmed on submit.
OWNER_JOBS = PREFIX + ":owner:{owner}:jobs"

#: String "<job id> <request digest>" for an Idempotency-Key. TTL: Settings.idempotency_ttl_s.
IDEMPOTENCY = PREFIX + ":idem:{owner}:{key_digest}"

#: Redis Stream of one job's output deltas (fields: delta, tokens; index and logprobs when the job
#: asked for several completions or log-probabilities: api/jobs/streams.py), written by the worker
#: while it generates and read by any API replica's SSE endpoint. Capped at JOB_STREAM_MAXLEN entries
#: (approximately); TTL: the job's.
JOB_STREAM = PREFIX + ":job:{job_id}:stream"
JOB_STREAM_MAXLEN = 4096

#: Set of the ids of a queue's running jobs, kept by the job store's scripts (claim adds; finish,
#: cancel and hand-back remove). No TTL: members leave when their job ends.
RUNNING = PREFIX + ":running:{queue}"

#: Hash {tokens, ts} of one API key's token bucket of a kind (submit | read). TTL: the time the
#: bucket takes to refill, plus a second (a full bucket needs no key).
RATE_LIMIT = PREFIX + ":ratelimit:{owner}:{kind}"

#: Sorted set of model-worker ids scored by their last heartbeat (Unix seconds). No TTL: readers
#: only count members newer than heartbeat_ttl_s, and workers remove themselves on exit.
#: `/readyz` counts these: only a worker with an engine can run jobs.
WORKERS = PREFIX + ":workers"

#: Hash {worker id: job slots (its Celery concurrency)} of the model workers in WORKERS, written
#: with each heartbeat and removed on exit. No TTL: readers take only the ids WORKERS counts live.
#: The batch feeder sizes batch capacity from it (docs/batches.md).
WORKER_SLOTS = PREFIX + ":workers:slots"

#: Sorted set of webhook-only worker ids scored by their last heartbeat, as WORKERS.
WEBHOOK_WORKERS = PREFIX + ":workers:webhooks"

#: Sorted set of running job ids scored by their lease's end (Unix seconds). A worker renews the
#: leases of the jobs it runs with each heartbeat; the reaper hands back a job whose lease lapsed.
#: Claim adds; renewals update; the scripts that end or hand back a job remove. No TTL.
LEASES = PREFIX + ":leases"

#: Sorted set of one queue's jobs that wait for a worker with a message in the broker (followers
#: excluded), scored by when they were (re)queued. ZCARD is genq_queue_length: O(1), where
#: counting the messages workers reserved meant scanning kombu's whole unacked hash. The scripts
#: that enqueue add; claim and the end of a job remove. No TTL.
QUEUED = PREFIX + ":queued:{queue}"

#: Sorted set of queued job ids (followers included) scored by their queue deadline: the reaper
#: fails those still queued past it. Submit and hand-back add; claim and the end of a job remove.
DEADLINES = PREFIX + ":deadlines"

#: Sorted set of queued job ids scored by when the reaper next checks that the job's message is
#: somewhere a worker will find it (a queue list or kombu's unacked hash), or that a follower's
#: leader is still alive. Same life as DEADLINES.
ORPHAN_CHECKS = PREFIX + ":orphan-checks"

#: Hash of one owner's live (queued or running) jobs: job id -> its rows (max(n, best_of): the
#: sequences the engine runs for it), and OWNER_LIVE_TOTAL -> their sum, which the per-key
#: live-job bound counts. The scripts that accept a job add; every script that ends one removes.
#: One key for both, so they expire together. TTL: job_ttl_s.
OWNER_LIVE = PREFIX + ":owner:{owner}:live-rows"
#: OWNER_LIVE's field holding the sum of its jobs' rows (no job id starts with "+").
OWNER_LIVE_TOTAL = "+rows"

#: Integer: bytes of job input one owner submitted on one UTC day (days since the epoch). The
#: per-key stored-bytes bound sums the days a record lives. TTL: job_ttl_s plus a day.
OWNER_BYTES = PREFIX + ":owner:{owner}:bytes:{day}"

#: String: the id of the process running the reaper this period (SET NX PX: one at a time).
REAPER_LOCK = PREFIX + ":reaper:lock"

#: Hash of one uploaded or generated file's record (id, owner, bytes, created_at, filename,
#: purpose, expires_at); its content lives in the file storage (api/batches/filestore.py) under the id.
#: No TTL: a file lives until deleted, or, for batch outputs created with output_expires_after,
#: until the file sweep after its expires_at (FILES_EXPIRING) deletes it with its content; reads
#: treat a record past its expires_at as gone.
FILE = PREFIX + ":file:{file_id}"

#: Sorted set of one owner's file ids scored by creation time (Unix seconds). No TTL; DELETE
#: removes members, and lists skip (and drop) ids whose record expired.
OWNER_FILES = PREFIX + ":owner:{owner}:files"

#: Integer: bytes of file content one owner holds in the file storage (uploads, and its batches'
#: output and error files); the per-key file quota counts it. The scripts that add a file record
#: add; the one that forgets a file (delete, expiry) subtracts. No TTL.
OWNER_FILE_BYTES = PREFIX + ":owner:{owner}:file-bytes"

#: Sorted set of the ids of files that expire, scored by their expires_at: the file sweep (run by
#: the batch feeder) deletes the content and the record of each one due. No TTL.
FILES_EXPIRING = PREFIX + ":files:expiring"

#: Hash of one batch: its OpenAI fields, and the feeder's durable progress (cursor_offset and
#: cursor_line into the input file, part_seq, ending). TTL: job_ttl_s, set when created.
BATCH = PREFIX + ":batch:{batch_id}"

#: Sorted set of one owner's batch ids scored by creation time in microseconds (the list pages
#: through it). TTL: job_ttl_s, renewed on each creation.
OWNER_BATCHES = PREFIX + ":owner:{owner}:batches"

#: Sorted set of the ids of batches not yet ended, scored by creation time: what the feeder
#: works on. Create adds; the script that ends a batch removes. No TTL.
BATCHES_ACTIVE = PREFIX + ":batches:active"

#: Hash line number -> JSON of one batch's lines in flight: {"job", "custom_id", "echo"} for a
#: line queued as a job, {"custom_id", "error"} for a line whose error is not yet written. At most
#: Settings.batch_window entries. Deleted when the batch ends; TTL: the batch's.
BATCH_WINDOW = PREFIX + ":batch:{batch_id}:window"

#: Sorted set of one owner's batches not yet ended, scored by the time their record lapses (the
#: bound on a key's active batches counts it; a member past its score lapsed without an end and
#: no longer counts). Create adds; the script that ends a batch removes. TTL: job_ttl_s, renewed
#: on each creation.
OWNER_ACTIVE_BATCHES = PREFIX + ":owner:{owner}:batches:active"

#: List of the storage names of one batch's committed result parts, in order (each commit of
#: finished lines writes one `.out` and one `.err` object). The end of the batch joins them into
#: its output and error files and deletes them. TTL: the batch's.
BATCH_PARTS = PREFIX + ":batch:{batch_id}:parts"

#: String: the id of the API process feeding batches this period (SET NX PX: one at a time).
BATCH_FEEDER_LOCK = PREFIX + ":batches:feeder-lock"

#: Integer the feeder increments each period: where its round-robin over keys starts. No TTL.
BATCH_ROTATION = PREFIX + ":batches:rotation"

#: Pub/sub channel: a job id each time a job reaches a terminal state (long-pollers wake on it).
JOB_EVENTS_CHANNEL = PREFIX + ":events:jobs"

#: Pub/sub channel: a job id each time its output stream gets an entry (the API's stream followers
#: wake on it; workers/publish.py sends it in the XADD's pipeline).
JOB_OUTPUT_CHANNEL = PREFIX + ":events:output"

#: Pub/sub channel: a job id each time a client cancels a job (workers holding it stop it).
CANCEL_CHANNEL = PREFIX + ":events:cancel"

#: Hash model id -> fingerprint (digest of weights + chat template) of the model that workers
#: serve, written by each worker at start-up; the API reads it to compute cache keys. No TTL: a new
#: revision overwrites its entry, and an entry for a model no longer served is never used.
MODELS = PREFIX + ":models"

#: Hash of one cached response (fields: output, model_label), keyed by the request's cache key.
#: Written by the worker that produced it. TTL: Settings.cache_ttl_s; the cache Redis's
#: maxmemory policy caps the total (see docs/cache.md).
CACHE_ENTRY = PREFIX + ":cache:{cache_key}"

#: String: the id of the job generating the answer to a cache key (the coalescing leader).
#: Set by the submit script with the leader's record, deleted by the script that ends the leader.
#: TTL: job_ttl_s, a backstop only (a leader that is missing or terminal is replaced on submit).
INFLIGHT = PREFIX + ":inflight:{cache_key}"

#: List of the job ids following a leader (identical submissions waiting for its result), in
#: arrival order. Resolved and deleted by the script that ends the leader. TTL: the job's.
FOLLOWERS = PREFIX + ":job:{job_id}:followers"

#: Celery's Redis transport keeps delivered, unacknowledged messages here (kombu's names). No TTL:
#: kombu's ack removes an entry, its visibility-timeout sweep restores a stale one.
KOMBU_UNACKED = kombu_layout.UNACKED
KOMBU_UNACKED_INDEX = kombu_layout.UNACKED_INDEX

#: Job hash fields holding pre-built webhook delivery messages; the Lua script that moves the job
#: to running (start) or to a terminal state (completed) pushes the message onto WEBHOOK_QUEUE and
#: deletes the field, in the same atomic step: an event is never lost and never sent twice.
WEBHOOK_MESSAGE_FIELD = "webhook_message:{event}"

#: List of one job's webhook delivery attempts (JSON each). TTL: the job's.
WEBHOOK_LOG = PREFIX + ":job:{job_id}:webhooks"

#: Hash of one webhook delivery's state (fields: url, body, owner, webhook_id, attempts, outcome, next_at,
#: generation, lease, waiting_since, and `message`: the last message published for it, until it
#: has its outcome). TTL: the job record's remaining TTL.
WEBHOOK_DELIVERY = PREFIX + ":job:{job_id}:webhook:{delivery}"

#: Sorted set of the webhook deliveries still pending (members: their WEBHOOK_DELIVERY keys), scored
#: by when the reaper next checks that the broker still holds the delivery's message (its list, or
#: kombu's unacked hash) or that a live claim holds the delivery. A message found nowhere twice is
#: pushed again (shared/jobqueue/lua/reap_delivery.lua): a message popped by a worker killed before kombu
#: recorded it, or lost across a Redis restart, would otherwise end the delivery silently.
WEBHOOK_PENDING = PREFIX + ":webhook-pending"

#: A key's own webhook signing secret (`whsec_<base64>`, made by POST /v1/webhook-secret). No TTL:
#: it lives until rotated. The HMAC needs the secret itself, so it is stored as is (Redis is
#: as sensitive as GENQ_WEBHOOK_SECRET's Kubernetes Secret).
WEBHOOK_KEY_SECRET = PREFIX + ":webhook-secret:{owner}"
#: The secret a rotation replaced; it keeps signing (alongside the new one) for
#: WEBHOOK_SECRET_GRACE_S, so receivers can switch without missing an event. TTL: that grace.
WEBHOOK_KEY_SECRET_PREVIOUS = PREFIX + ":webhook-secret:{owner}:previous"
WEBHOOK_SECRET_GRACE_S = 86_400

#: Hash of one batch webhook delivery's state (as WEBHOOK_DELIVERY, for batch.<status> events).
#: TTL: the batch record's remaining TTL, set at the first claim.
BATCH_WEBHOOK_DELIVERY = PREFIX + ":batch:{batch_id}:webhook:{event}"

#: List of one batch's webhook delivery attempts (JSON each). TTL: the batch's.
BATCH_WEBHOOK_LOG = PREFIX + ":batch:{batch_id}:webhooks"

#: Celery task that delivers one batch event: args [batch_id, event] (event: batch.completed, ...).
BATCH_WEBHOOK_TASK = "genq.webhook.deliver_batch"

#: Celery queue of webhook deliveries: its own workers, never a GPU worker's.
WEBHOOK_QUEUE = "webhooks"

#: Celery task that delivers one webhook event: args [job_id, event].
WEBHOOK_TASK = "genq.webhook.deliver"

#: Celery task that runs one generation job; its id is the job id.
GENERATE_TASK = "genq.generate"


def job(job_id: str) -> str:
    return JOB.format(job_id=job_id)


def owner_jobs(owner: str) -> str:
    return OWNER_JOBS.format(owner=owner)


def idempotency(owner: str, key: str) -> str:
    digest = hashlib.sha256(key.encode()).hexdigest()
    return IDEMPOTENCY.format(owner=owner, key_digest=digest)


def rate_limit(owner: str, kind: str) -> str:
    return RATE_LIMIT.format(owner=owner, kind=kind)


def owner_live(owner: str) -> str:
    return OWNER_LIVE.format(owner=owner)


def queued(queue: str) -> str:
    return QUEUED.format(queue=queue)


def running(queue: str) -> str:
    return RUNNING.format(queue=queue)


def job_stream(job_id: str) -> str:
    return JOB_STREAM.format(job_id=job_id)


def webhook_log(job_id: str) -> str:
    return WEBHOOK_LOG.format(job_id=job_id)


def webhook_key_secrets(owner: str) -> tuple[str, str]:
    """The current and previous signing-secret keys of an owner."""
    return WEBHOOK_KEY_SECRET.format(owner=owner), WEBHOOK_KEY_SECRET_PREVIOUS.format(owner=owner)


def webhook_message_field(event: str) -> str:
    return WEBHOOK_MESSAGE_FIELD.format(event=event)


def cache_entry(cache_key: str) -> str:
    return CACHE_ENTRY.format(cache_key=cache_key)


def inflight(cache_key: str) -> str:
    return INFLIGHT.format(cache_key=cache_key)


def followers(job_id: str) -> str:
    return FOLLOWERS.format(job_id=job_id)


def queue_for_model(model: str) -> str:
    """The Celery queue that the workers of one model consume."""
    return f"{PREFIX}.{model}"


#: The Redis list holding a queue's messages of a kombu priority step (0 is served first).
queue_key = kombu_layout.queue_key


def file(file_id: str) -> str:
    return FILE.format(file_id=file_id)


def owner_files(owner: str) -> str:
    return OWNER_FILES.format(owner=owner)


def owner_file_bytes(owner: str) -> str:
    return OWNER_FILE_BYTES.format(owner=owner)


def batch(batch_id: str) -> str:
    return BATCH.format(batch_id=batch_id)


def owner_batches(owner: str) -> str:
    return OWNER_BATCHES.format(owner=owner)


def batch_window(batch_id: str) -> str:
    return BATCH_WINDOW.format(batch_id=batch_id)


def owner_active_batches(owner: str) -> str:
    return OWNER_ACTIVE_BATCHES.format(owner=owner)


def batch_parts(batch_id: str) -> str:
    return BATCH_PARTS.format(batch_id=batch_id)


def batch_webhook_log(batch_id: str) -> str:
    return BATCH_WEBHOOK_LOG.format(batch_id=batch_id)
