"""Publishes a running job's new output to its Redis Stream without slowing the engine loop.

The engine calls `offer()` from its loop thread with the job's latest OutputUpdate, which is only
recorded; a background thread turns it into a delta and XADDs it (`{delta, tokens}`, plus `index`
for a completion other than the first and `logprobs` when asked for), naming the job on
JOB_OUTPUT_CHANNEL in the same pipeline to wake the API's followers. A delta Redis did not take
goes out again with the next one. When a job's result is in, `pending()` hands what is still
unpublished to the task thread, which writes it ahead of the finish script in the same round
trip (WorkerJobs.finish): a reader that sees the job terminal can drain its stream and miss
nothing the engine offered."""

from __future__ import annotations

import collections
import logging
import threading
from collections.abc import Callable

import orjson
import redis
import redis.client
import redis.exceptions

from shared import keys
from shared.logging import fields
from shared.schemas import TokenLogprob as PublicTokenLogprob
from workers.engine.sampling.logprobs import finite
from workers.engine.types import OutputUpdate, TokenLogprob

log = logging.getLogger("genq.worker")

#: Called after each published delta with the job id (e.g. the `output` webhook).
OutputListener = Callable[[str], None]
#: A job's completion: (job id, OutputUpdate.index).
Completion = tuple[str, int]
#: New output of a job, ready to write: (job id, the stream entry's fields).
Delta = tuple[str, dict[str, str | int | bytes]]


def token_entry(entry: TokenLogprob) -> PublicTokenLogprob:
    """A token's log-probability as the job's output and its stream store it."""
    return {
        "id": entry.token_id,
        "token": entry.token,
        "text": entry.text,
        "logprob": None if entry.logprob is None else finite(entry.logprob),
        "top_logprobs": [{"id": i, "token": t, "logprob": finite(v)} for i, t, v in entry.top],
    }


class OutputPublisher:
    def __init__(self, client: redis.Redis, ttl_s: int, listener: OutputListener | None = None) -> None:
        self._redis = client
        self._ttl_s = ttl_s
        self._listener = listener
        self._latest: dict[Completion, OutputUpdate] = {}
        #: Characters and log-probability entries published so far, per completion.
        self._published: dict[Completion, tuple[int, int]] = {}
        lock = threading.Lock()
        #: Wakes the background thread: an offer, or stop().
        self._wake = threading.Condition(lock)
        #: Wakes flush(): the background thread is done with a job it had taken out of _latest.
        self._settled = threading.Condition(lock)
        #: Updates the background thread took out of _latest and has not published yet, per job.
        self._in_flight: collections.Counter[str] = collections.Counter()
        self._stopped = False
        self._thread = threading.Thread(target=self._loop, name="genq-output", daemon=True)
        self._thread.start()

    def offer(self, job_id: str, update: OutputUpdate) -> None:
        """From the engine thread: one completion's output so far. Never blocks on Redis."""
        with self._wake:
            self._latest[(job_id, update.index)] = update
            self._wake.notify()

    def pending(self, job_id: str) -> list[Delta]:
        """From a job's task thread, once its result is in (no update comes after it): what of the
        job's output is not in its stream yet, as deltas for write(). Waits for the background
        thread's publish of the job, if one is under way, so none is written out of order."""
        with self._wake:
            # The background thread may hold this job's latest update, taken but not yet sent.
            self._settled.wait_for(lambda: job_id not in self._in_flight)
            pending = sorted((key, update) for key, update in self._latest.items() if key[0] == job_id)
            for key, _ in pending:
                del self._latest[key]
        return [delta for key, update in pending if (delta := self._delta(key, update)) is not None]

    def write(self, deltas: list[Delta], pipe: redis.client.Pipeline) -> None:
        """Add the commands that write these deltas to a pipeline: each entry, its stream's expiry,
        and the job's name on the output channel, which wakes its followers
        (api/jobs/stream_hub.py), after the entry."""
        for job_id, entry_fields in deltas:
            stream = keys.job_stream(job_id)
            pipe.xadd(stream, entry_fields, maxlen=keys.JOB_STREAM_MAXLEN)  # type: ignore[arg-type]
            pipe.expire(stream, self._ttl_s)
            pipe.publish(keys.JOB_OUTPUT_CHANNEL, job_id)

    def announce(self, deltas: list[Delta]) -> None:
        """Tell the listener of deltas that were written (once per job)."""
        if self._listener is not None:
            for job_id in dict.fromkeys(job_id for job_id, _ in deltas):
                self._listener(job_id)

    def forget(self, job_id: str) -> None:
        with self._wake:
            for table in (self._latest, self._published):
                for key in [key for key in table if key[0] == job_id]:
                    del table[key]

    def stop(self) -> None:
        with self._wake:
            self._stopped = True
            self._wake.notify()

    def _loop(self) -> None:
        while True:
            with self._wake:
                while not self._latest and not self._stopped:
                    self._wake.wait()
                if self._stopped:
                    return
                batch, self._latest = self._latest, {}
                self._in_flight.update(job_id for job_id, _ in batch)
            for key, update in batch.items():
                try:
                    self._publish(key, update)
                except Exception:  # a bug must neither end this thread nor hold a flush() forever
                    log.exception("output_publish_failed", extra=fields(job_id=key[0]))
                self._settle(key[0])

    def _settle(self, job_id: str) -> None:
        with self._wake:
            self._in_flight[job_id] -= 1
            if self._in_flight[job_id] <= 0:
                del self._in_flight[job_id]
                self._settled.notify_all()

    def _publish(self, key: Completion, update: OutputUpdate) -> None:
        before = self._published.get(key)
        delta = self._delta(key, update)
        if delta is None:
            return
        after = self._published[key]
        try:
            pipe = self._redis.pipeline(transaction=False)
            self.write([delta], pipe)
            pipe.execute()
        except redis.exceptions.RedisError as exc:  # streaming is best effort; the job is not
            log.warning("output_publish_failed", extra=fields(job_id=key[0], error=str(exc)))
            self._unpublished(key, before, after)
            return
        self.announce([delta])

    def _unpublished(self, key: Completion, before: tuple[int, int] | None, after: tuple[int, int]) -> None:
        """A delta Redis did not take is counted as unpublished again, so the next one (or the
        job's end, through pending()) carries its text: a stream that lost it mid-way would stop
        being a prefix of the job's text (a Redis restart, tests/faults/test_redis_restart.py).
        Unless forget() started the job over meanwhile (the count is no longer the one this
        delta set)."""
        with self._wake:
            if self._published.get(key) is not after:
                return
            if before is None:
                del self._published[key]
            else:
                self._published[key] = before

    def _delta(self, key: Completion, update: OutputUpdate) -> Delta | None:
        """What the update adds to what was published of its completion (None: nothing), counted
        as published from now on."""
        chars, entries = self._published.get(key, (0, 0))
        new = update.logprobs[entries:] if update.logprobs is not None else ()
        if len(update.text) <= chars and not new:
            return None
        self._published[key] = (max(chars, len(update.text)), entries + len(new))
        entry_fields: dict[str, str | int | bytes] = {"delta": update.text[chars:], "tokens": update.tokens}
        if update.index:
            entry_fields["index"] = update.index
        if update.logprobs is not None:
            entry_fields["logprobs"] = orjson.dumps([token_entry(entry) for entry in new])
        return key[0], entry_fields
