"""The reaper: what rescues a job nobody holds any more, independent of whoever held it.

Each period it runs the store's reaper scripts (shared/jobqueue/lua/reap_*.lua) over what is due:
- running jobs whose lease lapsed (their worker died, hung, or dropped them): handed back to the
  queue with a fresh deadline, or failed (`worker_lost`) once started GENQ_MAX_ATTEMPTS times;
- queued jobs past their deadline: failed (`timeout`) at once, not when a worker next looks;
- queued jobs whose message the broker lost (kombu moves a message out of its list before it
  records it as unacknowledged; a worker killed in between loses it): pushed again;
- followers whose leader vanished: promoted to run on their own;
- pending webhook deliveries whose message the broker lost (the same two-step window, or a
  Redis restart): their message pushed again, under the same generation.

It runs in every API process and every model worker; a Redis lock (SET NX PX) lets one of them
work per period, and each script checks its job's state itself, so two reapers at once are safe
anyway. Every action is counted (genq_reaper_actions_total) and logged with the job id.
"""

from __future__ import annotations

import logging
import math
import threading
import time
import uuid
from typing import cast

import redis
import redis.exceptions

from shared import keys, metrics
from shared.config import Settings
from shared.jobqueue import scripts
from shared.jobqueue.kombu_layout import delivery_tag_of, retagged
from shared.jobqueue.records import TIMEOUT_ERROR, WORKER_LOST_ERROR, as_text, job_message
from shared.logging import fields

log = logging.getLogger("genq.reaper")

#: Most jobs of each kind handled per period (a backlog is worked off over several periods).
BATCH = 200
#: Messages read per LRANGE when the reaper lists a queue's delivery tags.
LIST_CHUNK = 1000
#: Messages each such LRANGE shares with the one before it (see _read_tags()).
LIST_OVERLAP = 100
#: Outcomes of the scripts that are actions (the others: 'held', 'suspect', 'stale').
ACTIONS = frozenset(metrics.REAPER_ACTION_NAMES)


class Reaper:
    def __init__(
        self, client: redis.Redis, max_attempts: int, job_timeout_s: float, interval_s: float
    ) -> None:
        self._redis = client
        self._max_attempts = max_attempts
        self._job_timeout_s = job_timeout_s
        self._interval_s = interval_s
        self._id = uuid.uuid4().hex
        self._lease = scripts.Script(client, "reap_lease")
        self._deadline = scripts.Script(client, "reap_deadline")
        self._orphan = scripts.Script(client, "reap_orphan")
        self._delivery = scripts.Script(client, "reap_delivery")
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None
        #: Each queue list's delivery tags, and when they were read (see _in_list()).
        self._listed_tags: dict[str, tuple[float, frozenset[str]]] = {}

    @classmethod
    def from_settings(cls, client: redis.Redis, settings: Settings) -> Reaper:
        return cls(client, settings.max_attempts, settings.job_timeout_s, settings.reaper_interval_s)

    def run_once(self, now: float | None = None) -> dict[str, int]:
        """One period's work, if this process holds the lock; the actions taken, by kind."""
        now = time.time() if now is None else now
        lock_ms = max(1, int(self._interval_s * 900))  # released by expiry, a little before the next period
        if not self._redis.set(keys.REAPER_LOCK, self._id, nx=True, px=lock_ms):
            return {}
        done: dict[str, int] = {}
        for job_id in self._due(keys.LEASES, now):
            self._act(done, job_id, self._reap_lease(job_id, now))
        for job_id in self._due(keys.DEADLINES, now):
            outcome = self._deadline(keys=[keys.job(job_id)], args=[job_id, repr(now), TIMEOUT_ERROR],
                                     labels=[scripts.label("followers_key", job_id)])  # fmt: skip
            self._act(done, job_id, as_text(outcome))
        for job_id in self._due(keys.ORPHAN_CHECKS, now):
            self._act(done, job_id, self._reap_orphan(job_id, now))
        for delivery in self._due(keys.WEBHOOK_PENDING, now):
            self._act(done, delivery, self._reap_delivery(delivery, now), subject="delivery")
        return done

    def run_forever(self) -> None:
        """Run a period every interval_s until stop(); a Redis error skips one period."""
        while not self._stopped.wait(self._interval_s):
            try:
                self.run_once()
            except redis.exceptions.RedisError as exc:
                log.warning("reaper_skipped", extra=fields(error=type(exc).__name__))

    def start(self) -> threading.Thread:
        thread = threading.Thread(target=self.run_forever, name="genq-reaper", daemon=True)
        thread.start()
        self._thread = thread
        return thread

    def stop(self, timeout_s: float = 10.0) -> None:
        """End the periods and wait for one in progress to finish, so that whoever stops the
        reaper can close the client it uses."""
        self._stopped.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout_s)

    def _due(self, index: str, now: float) -> list[str]:
        due = cast(list[str | bytes], self._redis.zrangebyscore(index, "-inf", now, start=0, num=BATCH))
        return [as_text(job_id) for job_id in due]

    def _reap_lease(self, job_id: str, now: float) -> str:
        queue, priority = cast(list[str | None], self._redis.hmget(keys.job(job_id), "queue", "priority"))
        message, queue_list = job_message(job_id, as_text(queue or ""), int(priority or 0))
        outcome = self._lease(
            keys=[keys.job(job_id)],
            args=[job_id, repr(now), self._max_attempts, message, queue_list,
                  repr(now + self._job_timeout_s), WORKER_LOST_ERROR],
            labels=[*_queue_labels(as_text(queue or "")), scripts.label(scripts.RAW, queue_list)],
        )  # fmt: skip
        return as_text(outcome)

    def _reap_orphan(self, job_id: str, now: float) -> str:
        queue, priority, stored, queue_key = self._redis.hmget(
            keys.job(job_id), "queue", "priority", "message", "queue_key"
        )  # one read for both: the fresh copy the script may push, and whether the list holds the job's
        message, _ = job_message(job_id, as_text(queue or ""), int(priority or 0))
        tag = delivery_tag_of(stored) if stored else None
        listed = tag is not None and queue_key is not None and self._in_list(as_text(queue_key), tag, now)
        labels = _queue_labels(as_text(queue or ""))
        if queue_key is not None:
            labels.append(scripts.label(scripts.RAW, as_text(queue_key)))
        return as_text(
            self._orphan(
                keys=[keys.job(job_id)],
                args=[job_id, repr(now), message, "1" if listed else ""],
                labels=labels,
            )
        )

    def _in_list(self, queue_key: str, tag: str, now: float) -> bool:
        """Whether a message of delivery tag `tag` was in the list when the reaper last read its tags.

        A list is read once per ORPHAN_CHECK_S, in one pass, so checking N queued messages costs
        Redis O(N) a period; a scan of the list per message (the scripts' LPOS) made it O(N^2)
        (bench/orphan_checks.py). Only "found" is trusted: a message found then may have been taken
        and lost since, and its next check (on a fresh read, ORPHAN_CHECK_S later) finds that; one
        not found is looked for again by the script itself, in the list as it is now."""
        read_at, tags = self._listed_tags.get(queue_key, (-math.inf, frozenset()))
        if not 0 <= now - read_at < scripts.ORPHAN_CHECK_S:
            tags = self._read_tags(queue_key)
            self._listed_tags[queue_key] = (now, tags)
        return tag in tags

    def _read_tags(self, queue_key: str) -> frozenset[str]:
        """The delivery tags of the messages in the list, read in chunks from its tail (the oldest
        first: kombu pushes at the head and takes from the tail), counted from the tail. A message
        pushed meanwhile moves no other's place counted from the tail; counted from the head, as
        this read once was, each push moved the oldest message past the read's end, so a read
        during a burst missed as many of the oldest messages as were pushed during it, the very
        ones whose checks come due first, and each then cost its script a scan of the whole list
        (a gateway run with ~10^5 jobs queued: a core of Redis). A message taken meanwhile moves
        the rest one place towards the tail: consecutive chunks share LIST_OVERLAP messages, so
        fewer takes than that between two reads miss none (a miss costs only that scan)."""
        tags: set[str] = set()
        step = LIST_CHUNK - LIST_OVERLAP
        for offset in range(0, int(self._redis.llen(queue_key)), step):
            chunk = self._redis.lrange(queue_key, -offset - LIST_CHUNK, -offset - 1)
            tags.update(tag for message in chunk if (tag := delivery_tag_of(message)) is not None)
        return frozenset(tags)

    def _reap_delivery(self, delivery: str, now: float) -> str:
        message: bytes | str | None = self._redis.hget(delivery, "message")
        if message is None:  # ended, or expired with its job: the script drops it from the index
            return as_text(self._delivery(keys=[delivery], args=[repr(now), "", ""]))
        tag, copy = retagged(message)
        listed = "1" if self._in_list(keys.queue_key(keys.WEBHOOK_QUEUE, 0), tag, now) else ""
        return as_text(self._delivery(keys=[delivery], args=[repr(now), tag, copy, listed]))

    @staticmethod
    def _act(done: dict[str, int], job_id: str, outcome: str, subject: str = "job_id") -> None:
        """Count and log an action; `subject` names what job_id is (a job, or a delivery key)."""
        if outcome not in ACTIONS:
            return
        done[outcome] = done.get(outcome, 0) + 1
        metrics.REAPER_ACTIONS.labels(outcome).inc()
        log.warning("reaper_action", extra=fields(action=outcome, **{subject: job_id}))


def _queue_labels(queue: str) -> list[str]:
    return [scripts.label("queued_key", queue), scripts.label("running_key", queue)]
