"""The worker's side of job records (blocking; called from Celery task threads): claiming a
delivered job or taking one straight from the queue, renewing the leases of the jobs it runs,
finishing one, handing one back (drain, engine death), and the worker's heartbeat in the fleet
registry. Each move is one script of shared/lua/; the record codec both tiers share is
shared/store.py."""

from __future__ import annotations

import enum
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import cast

import redis
import redis.client
import redis.exceptions

from shared import keys, scripts
from shared.logging import fields as log_fields
from shared.store import TIMEOUT_ERROR, WORKER_LOST_ERROR, as_text, flat_record, job_message
from workers.webhooks.bodies import completed_body

log = logging.getLogger("genq.worker")

#: Most messages one take looks at: messages of jobs that cannot run (canceled, taken over) are
#: dropped on the way, and a long run of them must not make one long script.
TAKE_LOOKS = 16

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

    def set_reply(self, reply: object) -> None:
        """Keep the take's reply from the finish's pipeline (an error counts as not sent)."""
        if not isinstance(reply, Exception):
            self.done, self.taken = True, _taken(cast(list[bytes | str], reply))


def _taken(flat: list[bytes | str]) -> ClaimedJob | None:
    """A take script's reply: (job id, the record its claim left), or None when it took nothing."""
    if not flat:
        return None
    return as_text(flat[0]), flat_record(flat[1:])


class WorkerJobs:
    """The worker's view of job records (blocking; called from Celery task threads)."""

    def __init__(self, client: redis.Redis, lease_s: float, max_attempts: int, job_timeout_s: float) -> None:
        self._redis = client
        self._lease_s = lease_s
        self._max_attempts = max_attempts
        self._job_timeout_s = job_timeout_s
        self._start = client.register_script(scripts.source("claim"))
        self._renew = client.register_script(scripts.source("renew"))
        self._finish = client.register_script(scripts.source("finish"))
        self._hand_back = client.register_script(scripts.source("hand_back"))
        self._take = client.register_script(scripts.source("take"))

    def load_scripts(self) -> None:
        """SCRIPT LOAD the scripts jobs run here, at start-up: the first job then pays no NOSCRIPT
        reply, load and retry per script (+2 round trips each). After a Redis restart forgets
        them, redis-py's Script loads them again on NOSCRIPT, as before."""
        for script in (self._start, self._renew, self._finish, self._hand_back, self._take):
            self._redis.script_load(script.script)

    def claim(self, job_id: str, worker_id: str) -> Claim:
        outcome, status, *flat = self._start(
            keys=[keys.job(job_id)],
            args=[worker_id, repr(time.time()), self._lease_s, TIMEOUT_ERROR, job_id, self._max_attempts,
                  WORKER_LOST_ERROR],
        )  # fmt: skip
        return Claim(ClaimOutcome(as_text(outcome)), as_text(status), flat_record(flat))

    def take(self, worker_id: str, queue_lists: list[str]) -> ClaimedJob | None:
        """Take the next queued job off the broker's lists (highest priority first) and claim it, in
        one step: (job id, its record as the claim left it), or None when no message waits."""
        return _taken(self._take(keys=queue_lists, args=self._take_args(worker_id)))

    def _take_args(self, worker_id: str) -> list[str | int | float | bytes]:
        return [worker_id, repr(time.time()), self._lease_s, TIMEOUT_ERROR, self._max_attempts,
                WORKER_LOST_ERROR, keys.GENERATE_TASK, TAKE_LOOKS]  # fmt: skip

    def _take_after(self, pipe: redis.client.Pipeline, then: NextTake) -> None:
        """Add `then`'s take to a finish's pipeline (EVALSHA, as the finish script there)."""
        lists = then.queue_lists
        pipe.evalsha(self._take.sha, len(lists), *lists, *self._take_args(then.worker_id))

    def renew(self, worker_id: str, job_ids: list[str]) -> list[str]:
        """Extend the leases of the jobs this worker runs; the ids it no longer holds."""
        if not job_ids:
            return []
        lost = self._renew(args=[worker_id, repr(time.time() + self._lease_s), *job_ids])
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
        if before is None and then is None:
            return bool(self._finish(keys=script_keys, args=args))
        pipe = self._redis.pipeline(transaction=False)
        if before is not None:
            before(pipe)
        # EVALSHA itself: a Script in a pipeline costs a SCRIPT EXISTS round trip on every execute.
        pipe.evalsha(self._finish.sha, len(script_keys), *script_keys, *args)
        if then is not None:
            self._take_after(pipe, then)
        replies = pipe.execute(raise_on_error=False)
        if then is not None:
            then.set_reply(replies.pop())
        *ahead, done = replies
        if failed := [reply for reply in ahead if isinstance(reply, Exception)]:
            log.warning("finish_ahead_failed", extra=log_fields(job_id=job_id, error=str(failed[0])))
        if isinstance(done, redis.exceptions.NoScriptError):  # a restarted Redis forgot it
            done = self._finish(keys=script_keys, args=args)  # the Script loads it again
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
