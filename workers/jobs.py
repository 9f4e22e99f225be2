"""The worker's side of job records (blocking; called from Celery task threads): claiming a
delivered job or taking one straight from the queue, renewing the leases of the jobs it runs,
finishing one, handing one back (drain, engine death), and the worker's heartbeat in the fleet
registry. Each move is one script of shared/jobqueue/lua/; the record codec both tiers share is
shared/jobqueue/records.py."""

from __future__ import annotations

import enum
import functools
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import cast

import redis
import redis.client
import redis.exceptions

from shared import keys
from shared.jobqueue import kombu_layout, scripts
from shared.jobqueue.records import TIMEOUT_ERROR, WORKER_LOST_ERROR, as_text, flat_record, job_message
from shared.logging import fields as log_fields
from workers.webhooks.bodies import completed_body

log = logging.getLogger("genq.worker")

#: Most messages one take looks at: messages of jobs that cannot run (canceled, taken over) are
#: dropped on the way, and a long run of them must not make one long script.
TAKE_LOOKS = 16

#: Messages at the list's end whose jobs' keys a take names for the next takes to declare, by
#: default: a worker's task threads whose jobs end in one engine step all take at once with the
#: latest take's names, each the message after the one before's, so a worker names as many as it
#: runs jobs at once (WorkerJobs' `hints`).
TAKE_HINTS = 16
#: The most a take names, whatever the worker's concurrency: each is a message the take reads.
MAX_TAKE_HINTS = 64

#: A job claimed without a delivery: its id and its record as the claim left it.
ClaimedJob = tuple[str, dict[str, str]]


class ClaimOutcome(enum.StrEnum):
    """What the claim script decided about a delivered job."""

    CLAIMED = "claimed"
    SKIP = "skip"
    EXPIRED = "expired"
    EXHAUSTED = "exhausted"
    MISSING = "missing"


@dataclass(frozen=True, slots=True)
class Claim:
    outcome: ClaimOutcome
    status: str
    #: The job's record as the claim left it (CLAIMED only; empty otherwise).
    record: dict[str, str] = field(default_factory=dict)


@dataclass(slots=True)
class NextTake:
    """A task thread's take of its next job (WorkerJobs.take), sent in the round trip of its
    finish, right after the finish script: a thread that goes on to its next job then spends one
    round trip between two jobs where it spent two. Its reply is kept here for the thread's next
    take (workers/intake.py). A take whose reply was an error (a restarted Redis forgot the
    script) counts as not sent: the thread takes as usual."""

    worker_id: str
    queue_lists: list[str]
    #: Whether its reply came; then `taken` is what it took (None: no job was waiting).
    done: bool = False
    taken: ClaimedJob | None = None
    #: Labels of keys to declare in the take: those of the jobs whose messages were next in line
    #: at the thread's last take, or those this take asked for (shared/jobqueue/lua/take.lua).
    labels: list[str] = field(default_factory=list)

    def set_reply(self, reply: object) -> None:
        """Keep the take's reply from the finish's pipeline (an error counts as not sent; one that
        asked for keys is not done either, and keeps them for the thread's next take)."""
        if isinstance(reply, Exception):
            return
        flat = cast(list[bytes | str], reply)
        if flat and as_text(flat[0]) == NEED_REPLY:
            self.labels = [as_text(name) for name in flat[1:]]
            return
        self.done, (self.taken, self.labels) = True, _taken(flat)


#: A take's reply that asks for keys (shared/jobqueue/lua/take.lua).
NEED_REPLY = "!need"


def _taken(flat: list[bytes | str]) -> tuple[ClaimedJob | None, list[str]]:
    """A take script's reply: (job id, the record its claim left), or None when it took nothing;
    and the labels it named for the next take."""
    if not flat:
        return None, []
    hints = as_text(flat[1])
    return (as_text(flat[0]), flat_record(flat[2:])), hints.split("\n") if hints else []


@functools.cache
def _queue_labels(queue: str) -> tuple[str, ...]:
    return scripts.label("queued_key", queue), scripts.label("running_key", queue)


@functools.lru_cache(maxsize=64)
def _lists_labels(queue_lists: tuple[str, ...], queues: frozenset[str]) -> tuple[str, ...]:
    """The labels of the indexes of the queues of `queue_lists` and of `queues`."""
    found = {kombu_layout.queue_of_list(name) for name in queue_lists} | queues
    return tuple(label for queue in sorted(found) for label in _queue_labels(queue))


def _finish_labels(job_id: str, record: dict[str, str] | None) -> list[str]:
    """The keys the finish script touches (shared/jobqueue/lua/finish.lua), from the job's record."""
    if record is None:
        return []
    labels = [
        *_queue_labels(record.get("queue", "")),
        scripts.label("webhook_delivery_key", job_id, "completed"),
    ]
    if owner := record.get("owner"):
        labels.append(scripts.label("owner_live_key", owner))
    if cache_key := record.get("cache_key"):
        labels += [scripts.label("inflight_key", cache_key), scripts.label("followers_key", job_id)]
    return labels


class WorkerJobs:
    """The worker's view of job records (blocking; called from Celery task threads)."""

    def __init__(
        self, client: redis.Redis, lease_s: float, max_attempts: int, job_timeout_s: float,
        hints: int = TAKE_HINTS,
    ) -> None:  # fmt: skip
        self._redis = client
        self._hint_count = min(hints, MAX_TAKE_HINTS)
        self._lease_s = lease_s
        self._max_attempts = max_attempts
        self._job_timeout_s = job_timeout_s
        self._start = scripts.Script(client, "claim")
        self._renew = scripts.Script(client, "renew")
        self._finish = scripts.Script(client, "finish")
        self._hand_back = scripts.Script(client, "hand_back")
        self._take = scripts.Script(client, "take")
        #: The queues of the jobs this worker claimed: a claim declares their indexes' keys.
        self._queues: set[str] = set()
        #: The labels the worker's latest take named for the next (take.lua): the latest of any
        #: task thread, since the messages at the list's end when a thread last took are mostly
        #: gone (the other threads took them) by its next take, and the latest take's are not.
        self._hints: list[str] = []

    @property
    def hints(self) -> list[str]:
        """Labels of the keys the worker's latest take named for the next takes (take.lua)."""
        return self._hints

    def load_scripts(self) -> None:
        """SCRIPT LOAD the scripts jobs run here, at start-up: the first job then pays no NOSCRIPT
        reply, load and retry per script (+2 round trips each). After a Redis restart forgets
        them, redis-py's Script loads them again on NOSCRIPT, as before."""
        for script in (self._start, self._renew, self._finish, self._hand_back, self._take):
            self._redis.script_load(script.text)

    def claim(self, job_id: str, worker_id: str) -> Claim:
        labels = [scripts.label("webhook_delivery_key", job_id, "start")]
        for queue in self._queues:
            labels += _queue_labels(queue)
        outcome, status, *flat = self._start(
            keys=[keys.job(job_id)],
            args=[worker_id, repr(time.time()), self._lease_s, TIMEOUT_ERROR, job_id, self._max_attempts,
                  WORKER_LOST_ERROR],
            labels=labels,
        )  # fmt: skip
        record = flat_record(flat)
        self._queues.add(record.get("queue", ""))
        return Claim(ClaimOutcome(as_text(outcome)), as_text(status), record)

    def take(
        self, worker_id: str, queue_lists: list[str], labels: list[str] | None = None
    ) -> ClaimedJob | None:
        """Take the next queued job off the broker's lists (highest priority first) and claim it, in
        one step: (job id, its record as the claim left it), or None when no message waits (or
        none could be claimed in scripts.ROUNDS takes that each asked for more keys: other
        threads took the messages meanwhile). `labels`: keys to declare (NextTake.labels)."""
        asked = labels or self._hints
        for _ in range(scripts.ROUNDS):
            flat = self._take(keys=queue_lists, args=self._take_args(worker_id),
                              labels=self._take_labels(queue_lists, asked))  # fmt: skip
            if not flat or as_text(flat[0]) != NEED_REPLY:
                taken, self._hints = _taken(flat)
                return taken
            asked = [*asked, *(as_text(name) for name in flat[1:])]
        return None

    def _take_labels(self, queue_lists: list[str], asked: list[str]) -> list[str]:
        return [*asked, *_lists_labels(tuple(queue_lists), frozenset(self._queues))]

    def _take_args(self, worker_id: str) -> list[str | int | float | bytes]:
        return [worker_id, repr(time.time()), self._lease_s, TIMEOUT_ERROR, self._max_attempts,
                WORKER_LOST_ERROR, keys.GENERATE_TASK, TAKE_LOOKS, self._hint_count]  # fmt: skip

    def _take_after(self, pipe: redis.client.Pipeline, then: NextTake) -> None:
        """Add `then`'s take to a finish's pipeline (EVALSHA, as the finish script there)."""
        lists = then.queue_lists
        labels = self._take_labels(lists, then.labels or self._hints)
        pipe.evalsha(*self._take.evalsha(lists, self._take_args(then.worker_id), labels))

    def renew(self, worker_id: str, job_ids: list[str]) -> list[str]:
        """Extend the leases of the jobs this worker runs; the ids it no longer holds."""
        if not job_ids:
            return []
        lost = self._renew(
            args=[worker_id, repr(time.time() + self._lease_s), *job_ids],
            labels=[scripts.label("job_key", job_id) for job_id in job_ids],
        )
        return [as_text(job_id) for job_id in lost]

    def finish(
        self,
        job_id: str,
        worker_id: str,
        fields: dict[str, str | bytes],
        cache_entry: tuple[str, int] | None = None,
        record: dict[str, str] | None = None,
        before: Callable[[redis.client.Pipeline], object] | None = None,
        then: NextTake | None = None,
    ) -> bool:
        """End the job this worker holds (False: it ended elsewhere, e.g. canceled). cache_entry is
        (cache key, ttl): on success the response is stored there in the same step. `record`, the
        job as this worker claimed it: when it has a `completed` webhook, its body is built here
        and stored in the same step (workers/webhooks/bodies.py). `before` adds commands that must
        run before the job ends (its last output deltas) to the pipeline that sends the finish
        script, one round trip for all; their failures are logged, never the job's. `then`, the
        thread's next take, goes after the script in the same round trip (NextTake)."""
        fields = {"completed_at": repr(time.time()), **fields}
        hook = completed_body(record, fields) if record else None
        flat = [item for pair in fields.items() for item in pair]
        entry_key, ttl = (keys.cache_entry(cache_entry[0]), cache_entry[1]) if cache_entry else ("", 0)
        script_keys = [keys.job(job_id), entry_key]
        args = [worker_id, job_id, ttl, hook.url if hook else "", hook.body if hook else b"", *flat]
        labels = _finish_labels(job_id, record)
        if before is None and then is None:
            return bool(self._finish(keys=script_keys, args=args, labels=labels))
        pipe = self._redis.pipeline(transaction=False)
        if before is not None:
            before(pipe)
        # EVALSHA itself: a Script in a pipeline costs a SCRIPT EXISTS round trip on every execute.
        pipe.evalsha(*self._finish.evalsha(script_keys, args, labels))
        if then is not None:
            self._take_after(pipe, then)
        replies = pipe.execute(raise_on_error=False)
        if then is not None:
            then.set_reply(replies.pop())
            if then.done:
                self._hints = then.labels
        *ahead, done = replies
        if failed := [reply for reply in ahead if isinstance(reply, Exception)]:
            log.warning("finish_ahead_failed", extra=log_fields(job_id=job_id, error=str(failed[0])))
        if isinstance(done, redis.exceptions.NoScriptError) or scripts.needed(done):
            # A restarted Redis forgot it (the Script loads it again), or it asked for keys (its
            # followers'), before writing anything: sent again alone.
            done = self._finish(keys=script_keys, args=args, labels=labels)
        elif isinstance(done, Exception):
            raise done
        return bool(done)

    def hand_back(self, job_id: str, worker_id: str, record: dict[str, str], *, count_attempt: bool) -> bool:
        """Put a job this worker holds back in the queue with a fresh deadline (drain, engine death)."""
        message, queue_list = job_message(job_id, record["queue"], int(record.get("priority") or 0))
        now = time.time()
        done = self._hand_back(
            keys=[keys.job(job_id)],
            args=[worker_id, job_id, message, queue_list, repr(now), repr(now + self._job_timeout_s),
                  "1" if count_attempt else "0"],
            labels=[*_queue_labels(record["queue"]), scripts.label(scripts.RAW, queue_list)],
        )  # fmt: skip
        return bool(done)

    def publish_model(self, model_id: str, fingerprint: str) -> None:
        """Tell the API tier which revision of the model this worker serves (cache keys use it)."""
        self._redis.hset(keys.MODELS, model_id, fingerprint)

    def heartbeat(self, worker_id: str, registry: str = keys.WORKERS, slots: int | None = None) -> None:
        """Say this worker is alive; a model worker also says how many jobs it runs at once."""
        pipe = self._redis.pipeline(transaction=False)
        pipe.zadd(registry, {worker_id: time.time()})
        if slots is not None:
            pipe.hset(keys.WORKER_SLOTS, worker_id, slots)
        pipe.execute()

    def leave(self, worker_id: str, registry: str = keys.WORKERS) -> None:
        pipe = self._redis.pipeline(transaction=False)
        pipe.zrem(registry, worker_id)
        pipe.hdel(keys.WORKER_SLOTS, worker_id)
        pipe.execute()
