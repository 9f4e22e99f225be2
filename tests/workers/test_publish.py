"""workers/publish.py: a running job's output reaches its Redis Stream as deltas that add up to
the text, with the stream's expiry; each completion (OpenAI's n) has its own deltas; log-probability
entries are sent once each; pending() hands the task thread what is unpublished when the job's
result is in, for the pipeline that ends the job, and waits for a publish the background thread
has under way; a Redis that went away costs a log line, never the job (real Redis)."""

from __future__ import annotations

import contextlib
import json
import logging
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import cast

import pytest
import redis
import redis.client

from cli.redis_server import EmbeddedRedis
from shared import keys
from workers.engine.types import OutputUpdate, TokenLogprob
from workers.publish import OutputListener, OutputPublisher, token_entry

TTL_S = 600


@pytest.fixture
def published(redis_client: redis.Redis) -> Iterator[tuple[OutputPublisher, list[str]]]:
    heard: list[str] = []
    publisher = OutputPublisher(redis_client, TTL_S, listener=heard.append)
    yield publisher, heard
    publisher.stop()


class HeldPublisher(OutputPublisher):
    """A publisher whose background thread stops between taking an update out of the pending
    ones and sending it to Redis, until `release` is set: the window a pending() must not slip
    through."""

    def __init__(self, client: redis.Redis, listener: OutputListener | None = None) -> None:
        self.taken = threading.Event()
        self.release = threading.Event()
        super().__init__(client, TTL_S, listener)

    def _publish(self, key: tuple[str, int], update: OutputUpdate) -> None:
        if threading.current_thread().name == "genq-output":
            self.taken.set()
            self.release.wait(10)
        super()._publish(key, update)


def _flush(publisher: OutputPublisher, client: redis.Redis, job_id: str) -> None:
    """What the step that ends a job does with its output: WorkerJobs.finish sends the deltas in
    the pipeline of its script (tests/shared/jobqueue/test_job_scripts.py checks that part)."""
    deltas = publisher.pending(job_id)
    pipe = client.pipeline(transaction=False)
    publisher.write(deltas, pipe)
    pipe.execute()
    publisher.announce(deltas)


def _entries(client: redis.Redis, job_id: str) -> list[dict[str, str]]:
    stream = cast(list[tuple[str, dict[str, str]]], client.xrange(keys.job_stream(job_id)))
    return [entry for _, entry in stream]


def test_flushed_deltas_add_up_to_the_text(
    published: tuple[OutputPublisher, list[str]], redis_client: redis.Redis
) -> None:
    publisher, heard = published
    for text, tokens in [("Hel", 1), ("Hello", 2), ("Hello", 2), ("Hello world", 3)]:
        publisher.offer("j1", OutputUpdate(text, tokens))
        _flush(publisher, redis_client, "j1")
    entries = _entries(redis_client, "j1")
    assert "".join(e["delta"] for e in entries) == "Hello world"
    assert [e["tokens"] for e in entries] == ["1", "2", "3"]  # an update with nothing new is skipped
    assert "index" not in entries[0] and "logprobs" not in entries[0]
    assert 0 < redis_client.ttl(keys.job_stream("j1")) <= TTL_S
    assert heard == ["j1", "j1", "j1"]


def test_each_entry_names_its_job_on_the_output_channel_after_it_is_readable(
    published: tuple[OutputPublisher, list[str]], redis_client: redis.Redis
) -> None:
    """What wakes the API's stream followers (api/jobs/stream_hub.py): one message per entry,
    sent after the entry, so a follower woken by it reads it."""
    publisher, _ = published
    pubsub = redis_client.pubsub()  # type: ignore[no-untyped-call]
    pubsub.subscribe(keys.JOB_OUTPUT_CHANNEL)
    try:
        confirmed = pubsub.get_message(timeout=2)
        assert confirmed is not None and confirmed["type"] == "subscribe"
        heard = []
        for job_id, text in [("j1", "a"), ("j2", "b"), ("j1", "a c"), ("j1", "a c")]:
            publisher.offer(job_id, OutputUpdate(text, len(text)))
            _flush(publisher, redis_client, job_id)
            message = pubsub.get_message(timeout=0.5)
            if message is not None:
                heard.append(message["data"])
                assert text in "".join(e["delta"] for e in _entries(redis_client, job_id))
        assert heard == ["j1", "j2", "j1"]  # the repeated update published nothing, so no message
    finally:
        pubsub.close()


def test_the_background_thread_publishes_the_latest_update(
    published: tuple[OutputPublisher, list[str]], redis_client: redis.Redis
) -> None:
    publisher, _ = published
    publisher.offer("j1", OutputUpdate("a b", 2))
    deadline = time.monotonic() + 5
    while not _entries(redis_client, "j1") and time.monotonic() < deadline:
        time.sleep(0.01)
    assert "".join(e["delta"] for e in _entries(redis_client, "j1")) == "a b"


def test_pending_waits_for_the_background_threads_publish_of_the_job(redis_client: redis.Redis) -> None:
    """A pending() that finds nothing because the background thread has just taken the job's last
    update returns only once that update is in the stream: the job's end, written next, never
    comes before its last delta."""
    publisher = HeldPublisher(redis_client)
    try:
        publisher.offer("j1", OutputUpdate("last words", 4))
        assert publisher.taken.wait(5)  # taken out of the pending ones, not yet in Redis
        threading.Timer(0.3, publisher.release.set).start()
        _flush(publisher, redis_client, "j1")
        in_stream = [e["delta"] for e in _entries(redis_client, "j1")]
    finally:
        publisher.release.set()
        publisher.stop()
    assert in_stream == ["last words"]


def test_a_failed_background_publish_does_not_hold_pending(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    gone = EmbeddedRedis(tmp_path, appendonly=False)  # never started
    publisher = HeldPublisher(redis.Redis.from_url(gone.url, socket_connect_timeout=0.2))
    try:
        publisher.offer("j1", OutputUpdate("text", 1))
        assert publisher.taken.wait(5)
        with caplog.at_level(logging.WARNING, logger="genq.worker"):
            publisher.release.set()
            assert publisher.pending("j1") == []  # returns once the background thread's attempt failed
            messages = [r.getMessage() for r in caplog.records]
    finally:
        publisher.stop()
    assert "output_publish_failed" in messages


@contextlib.contextmanager
def aof_client(tmp_path: Path) -> Iterator[tuple[EmbeddedRedis, redis.Redis]]:
    """A private Redis that keeps its data across a restart, and a client of it."""
    server = EmbeddedRedis(tmp_path / "aof", appendonly=True)
    server.start()
    client = redis.Redis.from_url(server.url, decode_responses=True, socket_connect_timeout=0.2)
    try:
        yield server, client
    finally:
        client.close()
        server.stop()


def offered_while_down(
    publisher: OutputPublisher, server: EmbeddedRedis, caplog: pytest.LogCaptureFixture, update: OutputUpdate
) -> None:
    """Offer `update` for job j1 while Redis is down; returns once its publish failed and Redis is
    back."""
    server.stop()
    try:
        with caplog.at_level(logging.WARNING, logger="genq.worker"):
            publisher.offer("j1", update)
            deadline = time.monotonic() + 5
            while "output_publish_failed" not in [r.getMessage() for r in caplog.records]:
                assert time.monotonic() < deadline, "the publish never failed"
                time.sleep(0.01)
    finally:
        server.start()


def test_a_delta_redis_did_not_take_goes_with_the_next_one(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Redis restarts (its data kept) while a running job's update is published: that update's
    text is not lost from the stream, the next publish carries it, so the stream's deltas still
    add up to the text (it had a hole there before, and stopped being a prefix of it)."""
    deltas = deltas_through_an_outage(OutputPublisher, tmp_path, caplog, OutputUpdate("one two three", 3))
    assert deltas == ["one", " two three"]


def deltas_through_an_outage(
    kind: type[OutputPublisher], tmp_path: Path, caplog: pytest.LogCaptureFixture, then: OutputUpdate
) -> list[str]:
    """Job j1's stream after "one" is published, "one two" is offered while Redis is down, and
    `then` once it is back."""
    with aof_client(tmp_path) as (server, client):
        publisher = kind(client, TTL_S)
        try:
            publisher.offer("j1", OutputUpdate("one", 1))
            _flush(publisher, client, "j1")
            offered_while_down(publisher, server, caplog, OutputUpdate("one two", 2))
            publisher.offer("j1", then)
            _flush(publisher, client, "j1")
        finally:
            publisher.stop()
        return [e["delta"] for e in _entries(client, "j1")]


class ForgettingPublisher(OutputPublisher):
    """A publisher whose job is forgotten (handed back, to run again) while its background
    thread's publish is under way."""

    def write(
        self, deltas: list[tuple[str, dict[str, str | int | bytes]]], pipe: redis.client.Pipeline
    ) -> None:
        if threading.current_thread().name == "genq-output":
            self.forget("j1")
        super().write(deltas, pipe)


def test_a_failed_publish_of_a_job_forgotten_meanwhile_leaves_its_new_run_alone(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A publish that fails after forget() started its job over does not put back what it had
    counted: the job's new run streams from its first character."""
    deltas = deltas_through_an_outage(ForgettingPublisher, tmp_path, caplog, OutputUpdate("re", 1))  # new run
    assert deltas == ["one", "re"]


def test_each_completion_has_its_own_deltas_and_logprobs_go_once(
    published: tuple[OutputPublisher, list[str]], redis_client: redis.Redis
) -> None:
    publisher, _ = published
    first = TokenLogprob(5, "Hi", "Hi", -0.5, ((5, "Hi", -0.5), (6, "Yo", -1.5)))
    second = TokenLogprob(7, "!", "!", float("-inf"))
    publisher.offer("j1", OutputUpdate("Hi", 1, (first,), index=1))
    _flush(publisher, redis_client, "j1")
    publisher.offer("j1", OutputUpdate("Hi!", 2, (first, second), index=1))
    publisher.offer("j1", OutputUpdate("Other", 1, (), index=0))
    _flush(publisher, redis_client, "j1")
    entries = _entries(redis_client, "j1")
    second_completion = [e for e in entries if e.get("index") == "1"]
    assert "".join(e["delta"] for e in second_completion) == "Hi!"
    logged = [entry for e in second_completion for entry in json.loads(e["logprobs"])]
    assert logged == [token_entry(first), token_entry(second)]
    assert logged[1]["logprob"] == -9999.0  # a banned token's -inf, as JSON can carry it (vLLM's)
    assert [e["delta"] for e in entries if "index" not in e] == ["Other"]


def test_forget_starts_a_job_over(
    published: tuple[OutputPublisher, list[str]], redis_client: redis.Redis
) -> None:
    """A job handed back and run again streams its new run from its first character."""
    publisher, _ = published
    publisher.offer("j1", OutputUpdate("abc", 1))
    _flush(publisher, redis_client, "j1")
    publisher.forget("j1")
    publisher.offer("j1", OutputUpdate("abc", 1))
    _flush(publisher, redis_client, "j1")
    assert [e["delta"] for e in _entries(redis_client, "j1")] == ["abc", "abc"]


def test_a_redis_error_is_logged_not_raised(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    gone = EmbeddedRedis(tmp_path, appendonly=False)  # never started
    client = redis.Redis.from_url(gone.url, socket_connect_timeout=0.2)
    heard: list[str] = []
    publisher = OutputPublisher(client, TTL_S, listener=heard.append)
    try:
        with caplog.at_level(logging.WARNING, logger="genq.worker"):
            publisher.offer("j1", OutputUpdate("text", 1))
            deadline = time.monotonic() + 5
            while not caplog.records and time.monotonic() < deadline:
                time.sleep(0.01)
    finally:
        publisher.stop()
    assert "output_publish_failed" in [r.getMessage() for r in caplog.records] and heard == []
