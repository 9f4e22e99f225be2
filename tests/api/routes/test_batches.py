"""The Batch API through the official `openai` client over real HTTP (a live uvicorn server with
its batch feeder, a real worker running the placeholder model): files.create, batches.create,
retrieve, list, cancel, files.content on the output and error files."""

from __future__ import annotations

import io
import itertools
import time
from collections.abc import Callable, Iterator
from typing import Any, Final, cast

import httpx
import openai
import orjson
import pytest
import redis
from openai.types import Batch

from shared import keys
from shared.config import Settings
from tests.api.live_server import live_server
from tests.api.routes.test_openai import client_for
from tests.conftest import TEST_MODEL, WorkerProcess

CHAT: Final = "/v1/chat/completions"


def chat_line(custom_id: str, text: str, **body: Any) -> bytes:
    request = {"model": TEST_MODEL, "messages": [{"role": "user", "content": text}], "max_tokens": 4} | body
    line = {"custom_id": custom_id, "method": "POST", "url": CHAT, "body": request}
    return orjson.dumps(line) + b"\n"


def upload(client: openai.OpenAI, content: bytes) -> str:
    return client.files.create(file=("input.jsonl", io.BytesIO(content)), purpose="batch").id


def start_batch(client: openai.OpenAI, content: bytes) -> Batch:
    """Upload `content` and start a chat-completions batch of it."""
    return client.batches.create(
        input_file_id=upload(client, content), endpoint=CHAT, completion_window="24h"
    )


def wait_for(client: openai.OpenAI, batch_id: str, statuses: set[str], timeout_s: float = 60) -> Any:
    deadline = time.monotonic() + timeout_s
    while (batch := client.batches.retrieve(batch_id)).status not in statuses:
        assert time.monotonic() < deadline, f"batch still {batch.status}: {batch}"
        time.sleep(0.1)
    return batch


def completed(client: openai.OpenAI, batch_id: str) -> int:
    """The batch's lines finished so far (genq always sends request_counts; the SDK types it optional)."""
    counts = client.batches.retrieve(batch_id).request_counts
    assert counts is not None
    return counts.completed


def results(client: openai.OpenAI, file_id: str | None) -> dict[str, dict[str, Any]]:
    """A result file's lines by custom_id (each custom_id once: asserted)."""
    if file_id is None:
        return {}
    lines = [orjson.loads(line) for line in client.files.content(file_id).content.splitlines()]
    by_id = {line["custom_id"]: line for line in lines}
    assert len(by_id) == len(lines), "a custom_id appears twice"
    return by_id


def metric(base_url: str, name: str) -> float:
    """One sample of the API's /metrics (0 when absent)."""
    for line in httpx.get(f"{base_url}/metrics").text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[-1])
    return 0.0


@pytest.fixture
def base_url(settings: Settings) -> Iterator[str]:
    with live_server(settings) as url:
        yield url


@pytest.fixture
def client(base_url: str) -> openai.OpenAI:
    return client_for(base_url)


def test_a_batch_runs_to_its_output_file(
    client: openai.OpenAI, worker: WorkerProcess, redis_client: redis.Redis
) -> None:
    content = b"".join(chat_line(f"req-{i}", f"hello {i}", temperature=0) for i in range(20))
    file_id = upload(client, content)
    batch = client.batches.create(input_file_id=file_id, endpoint=CHAT, completion_window="24h",
                                  metadata={"purpose": "test"})  # fmt: skip
    assert batch.status == "validating" and batch.id.startswith("batch_")
    assert batch.metadata == {"purpose": "test"} and batch.expires_at == batch.created_at + 86_400
    done = wait_for(client, batch.id, {"completed", "failed"})
    assert done.status == "completed", done
    assert (
        done.request_counts.total == 20
        and done.request_counts.completed == 20
        and done.request_counts.failed == 0
    )
    assert done.in_progress_at and done.finalizing_at and done.completed_at
    assert done.error_file_id is None
    output = results(client, done.output_file_id)
    assert set(output) == {f"req-{i}" for i in range(20)}
    line = output["req-3"]
    assert line["id"].startswith("batch_req_") and line["error"] is None
    assert line["response"]["status_code"] == 200
    body = line["response"]["body"]
    assert body["object"] == "chat.completion" and body["choices"][0]["message"]["role"] == "assistant"
    job = redis_client.hgetall(keys.job(line["response"]["request_id"]))
    assert orjson.loads(job["metadata"])["batch_id"] == batch.id and job["priority"] == "9"
    output_file = client.files.retrieve(done.output_file_id)
    assert output_file.purpose == "batch_output"
    assert [b.id for b in client.batches.list()] == [batch.id]
    # Redis keeps the window, not the history: the lines' records lapse soon, out of the job
    # list, their idempotency keys gone; nothing of the batch's bookkeeping is left but its record.
    assert 0 < redis_client.ttl(keys.job(line["response"]["request_id"])) <= 10
    assert redis_client.keys("genq:idem:*") == []
    assert sum(redis_client.zcard(index) for index in redis_client.keys("genq:owner:*:jobs")) == 0
    assert redis_client.zcard(keys.BATCHES_ACTIVE) == 0
    assert not redis_client.exists(keys.batch_window(batch.id), keys.batch_parts(batch.id))


def test_bad_lines_are_reported_in_the_error_file(client: openai.OpenAI, worker: WorkerProcess) -> None:
    lines = [
        chat_line("ok-1", "one"),
        b"{not json\n",
        b"\n",  # blank lines are not requests
        orjson.dumps({"method": "POST", "url": CHAT, "body": {}}) + b"\n",
        orjson.dumps(
            {
                "custom_id": "wrong-url",
                "method": "POST",
                "url": "/v1/completions",
                "body": {"model": TEST_MODEL, "prompt": "x"},
            }
        )
        + b"\n",
        chat_line("ok-1", "the same custom_id again"),
        orjson.dumps(
            {"custom_id": "no-messages", "method": "POST", "url": CHAT, "body": {"model": TEST_MODEL}}
        )
        + b"\n",
        chat_line("unknown-model", "x", model="no-such-model"),
        chat_line("streamed", "x", stream=True),
        chat_line("tools", "x", tools=[{"type": "function"}]),
        chat_line("get", "x").replace(b'"POST"', b'"GET"'),
        chat_line("x" * 513, "x"),
        chat_line("ok-2", "two"),
    ]
    batch = start_batch(client, b"".join(lines))
    done = wait_for(client, batch.id, {"completed", "failed"})
    assert done.status == "completed"
    counts = done.request_counts
    assert (counts.total, counts.completed, counts.failed) == (12, 2, 10)
    output = results(client, done.output_file_id)
    assert set(output) == {"ok-1", "ok-2"}
    assert output["ok-1"]["response"]["body"]["choices"][0]["message"]["content"]
    errors = [orjson.loads(line) for line in client.files.content(done.error_file_id).content.splitlines()]
    codes = [(line["custom_id"], line["error"]["code"]) for line in errors]
    assert codes == [
        (None, "invalid_json_line"),
        (None, "missing_custom_id"),
        ("wrong-url", "invalid_url"),
        ("ok-1", "duplicate_custom_id"),
        ("no-messages", "invalid_request"),
        ("unknown-model", "invalid_request"),
        ("streamed", "invalid_request"),
        ("tools", "invalid_request"),
        ("get", "invalid_method"),
        (None, "invalid_custom_id"),
    ]
    assert all(line["response"] is None for line in errors)
    assert "line 2" in errors[0]["error"]["message"] and "no-such-model" in errors[5]["error"]["message"]
    assert "messages" in errors[4]["error"]["message"]


def test_a_completions_batch_and_a_line_whose_job_fails(client: openai.OpenAI, worker: WorkerProcess) -> None:
    def line(custom_id: str, **body: Any) -> bytes:
        request = {"model": TEST_MODEL, "prompt": "Once upon", "max_tokens": 3} | body
        return orjson.dumps(
            {"custom_id": custom_id, "method": "POST", "url": "/v1/completions", "body": request}
        )

    # echo scores the prompt: the placeholder model has no logits, so that job fails when it runs.
    content = line("plain") + b"\n" + line("echo", echo=True)
    batch = client.batches.create(input_file_id=upload(client, content), endpoint="/v1/completions",
                                  completion_window="24h",
                                  output_expires_after={"anchor": "created_at", "seconds": 3600})  # fmt: skip
    done = wait_for(client, batch.id, {"completed", "failed"})
    body = results(client, done.output_file_id)["plain"]["response"]["body"]
    assert body["object"] == "text_completion" and body["choices"][0]["text"]
    output_file = client.files.retrieve(done.output_file_id)  # expires as asked
    assert output_file.expires_at == output_file.created_at + 3600
    failed = results(client, done.error_file_id)["echo"]
    assert failed["error"] is None and failed["response"]["status_code"] == 500
    assert failed["response"]["request_id"] and failed["response"]["body"]["error"]["message"]


def test_whole_file_problems_fail_the_batch(
    make_settings: Callable[..., Settings], redis_client: redis.Redis
) -> None:
    with live_server(make_settings(batch_max_lines=3)) as url:
        client = client_for(url)
        too_many = b"".join(chat_line(f"r{i}", "x") for i in range(4))
        cases = {"too_many_lines": too_many, "empty_file": b"\n  \n"}
        for code, content in cases.items():
            batch = start_batch(client, content)
            failed = wait_for(client, batch.id, {"failed", "completed"})
            assert failed.status == "failed" and failed.failed_at
            assert [e.code for e in failed.errors.data] == [code]
            assert failed.output_file_id is None and failed.error_file_id is None


def test_bad_batch_requests_are_refused_naming_the_field(
    make_settings: Callable[..., Settings], redis_client: redis.Redis
) -> None:
    with live_server(make_settings(api_keys=["alice-key", "bob-key"])) as url:
        alice, bob = client_for(url, "alice-key"), client_for(url, "bob-key")
        file_id = upload(alice, chat_line("a", "x"))
        cases: list[tuple[dict[str, Any], str]] = [
            (
                {"input_file_id": file_id, "endpoint": "/v1/embeddings", "completion_window": "24h"},
                "endpoint",
            ),
            ({"input_file_id": file_id, "endpoint": CHAT, "completion_window": "1h"}, "completion_window"),
            ({"input_file_id": "file-nope", "endpoint": CHAT, "completion_window": "24h"}, "input_file_id"),
        ]
        for body, param in cases:
            with pytest.raises(openai.BadRequestError) as refused:
                alice.batches.create(**body)
            assert cast(dict[str, Any], refused.value.body)["param"] == param
        with pytest.raises(openai.BadRequestError) as other_key:
            bob.batches.create(input_file_id=file_id, endpoint=CHAT, completion_window="24h")
        assert cast(dict[str, Any], other_key.value.body)["param"] == "input_file_id"
        assert list(alice.batches.list()) == []
        batch = alice.batches.create(input_file_id=file_id, endpoint=CHAT, completion_window="24h")
        with pytest.raises(openai.NotFoundError):
            bob.batches.retrieve(batch.id)
        with pytest.raises(openai.NotFoundError):
            bob.batches.cancel(batch.id)
        assert list(bob.batches.list()) == []


def test_list_pages_newest_first(client: openai.OpenAI) -> None:
    file_id = upload(client, chat_line("a", "x"))
    ids = [client.batches.create(input_file_id=file_id, endpoint=CHAT, completion_window="24h").id
           for _ in range(3)]  # fmt: skip
    page = client.batches.list(limit=2)
    assert [b.id for b in page.data] == ids[::-1][:2] and page.has_more
    assert [b.id for b in client.batches.list(limit=2, after=ids[1]).data] == ids[:1]


def slow_settings(make_settings: Callable[..., Settings], **overrides: Any) -> Settings:
    """Each placeholder job takes about a second (20 steps of 0.05 s); two lines in flight."""
    return make_settings(placeholder_step_s=0.05, batch_window=2, **overrides)


def slow_lines(count: int) -> bytes:
    return b"".join(chat_line(f"req-{i}", f"line {i}", max_tokens=20, temperature=0) for i in range(count))


def assert_each_line_once(
    client: openai.OpenAI, batch: Any, count: int
) -> tuple[dict[str, Any], dict[str, Any]]:
    output, errors = results(client, batch.output_file_id), results(client, batch.error_file_id)
    assert not set(output) & set(errors)
    assert set(output) | set(errors) == {f"req-{i}" for i in range(count)}
    assert batch.request_counts.completed == len(output) and batch.request_counts.failed == len(errors)
    return output, errors


def test_cancel_mid_run_keeps_partial_results(
    make_settings: Callable[..., Settings],
    redis_client: redis.Redis,
    start_worker: Callable[..., WorkerProcess],
) -> None:
    settings = slow_settings(make_settings)
    start_worker(settings)
    with live_server(settings) as url:
        client = client_for(url)
        batch = start_batch(client, slow_lines(10))
        deadline = time.monotonic() + 60
        while completed(client, batch.id) < 2:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        # Operators see it: one batch active, its window (2 lines) in flight.
        assert metric(url, "genq_batches_active") == 1
        inflight = [metric(url, "genq_batch_lines_inflight") for _ in range(10)]
        assert max(inflight) <= 2 and max(inflight) >= 1, inflight  # between two periods it can be 0
        cancelled_before = metric(url, 'genq_batches_total{status="cancelled"}')
        with pytest.raises(openai.ConflictError):  # its input file is being read
            client.files.delete(batch.input_file_id)
        cancelling = client.batches.cancel(batch.id)
        assert cancelling.status == "cancelling" and cancelling.cancelling_at
        cancelled = wait_for(client, batch.id, {"cancelled"})
        assert cancelled.cancelled_at and cancelled.completed_at is None
        output, errors = assert_each_line_once(client, cancelled, 10)
        assert len(output) >= 2 and len(errors) >= 4
        assert {line["error"]["code"] for line in errors.values()} == {"batch_cancelled"}
        assert client.batches.cancel(batch.id).status == "cancelled"  # an ended batch stays as it is
        assert metric(url, 'genq_batches_total{status="cancelled"}') == cancelled_before + 1
        assert metric(url, "genq_batches_active") == 0
        assert client.files.delete(batch.input_file_id).deleted  # the batch ended: the file may go
        # Its jobs in flight were canceled: none is left queued or running.
        assert redis_client.zcard(keys.queued(keys.queue_for_model(TEST_MODEL))) == 0


def test_a_batch_past_its_window_expires_with_what_finished(
    make_settings: Callable[..., Settings],
    redis_client: redis.Redis,
    start_worker: Callable[..., WorkerProcess],
) -> None:
    settings = slow_settings(make_settings, batch_completion_window_s=2.5)
    start_worker(settings)
    with live_server(settings) as url:
        client = client_for(url)
        batch = start_batch(client, slow_lines(12))
        expired = wait_for(client, batch.id, {"expired", "completed"})
        assert expired.status == "expired" and expired.expired_at
        output, errors = assert_each_line_once(client, expired, 12)
        assert len(output) >= 1 and len(errors) >= 1
        assert {line["error"]["code"] for line in errors.values()} == {"batch_expired"}


def test_input_content_lost_mid_run_fails_the_batch_keeping_what_finished(
    make_settings: Callable[..., Settings],
    redis_client: redis.Redis,
    start_worker: Callable[..., WorkerProcess],
) -> None:
    settings = slow_settings(make_settings)
    start_worker(settings)
    with live_server(settings) as url:
        client = client_for(url)
        batch = start_batch(client, slow_lines(10))
        deadline = time.monotonic() + 60
        while completed(client, batch.id) < 2:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        (settings.data_dir / "files" / batch.input_file_id).unlink()  # storage lost it
        failed = wait_for(client, batch.id, {"failed", "completed"})
        assert failed.status == "failed" and [e.code for e in failed.errors.data] == ["file_not_found"]
        assert len(results(client, failed.output_file_id)) >= 2


def test_lines_refused_for_now_wait_instead_of_failing(
    make_settings: Callable[..., Settings],
    redis_client: redis.Redis,
    start_worker: Callable[..., WorkerProcess],
) -> None:
    """The key may hold only 3 live jobs: most submissions of the window are refused (429 for a
    client); the batch's lines wait for room and all complete."""
    settings = make_settings(max_live_jobs_per_key=3)
    start_worker(settings)
    with live_server(settings) as url:
        client = client_for(url)
        content = b"".join(chat_line(f"req-{i}", f"x {i}", max_tokens=20) for i in range(20))
        batch = client.batches.create(
            input_file_id=upload(client, content), endpoint=CHAT, completion_window="24h"
        )
        done = wait_for(client, batch.id, {"completed", "failed"})
        assert (done.request_counts.completed, done.request_counts.failed) == (20, 0)
        assert len(results(client, done.output_file_id)) == 20


def batch_events(base_url: str, batch_id: str) -> list[dict[str, Any]]:
    """Every `batch` event of GET /v1/batches/{id}/events, read until the server ends the stream."""
    events = []
    with httpx.stream("GET", f"{base_url}/v1/batches/{batch_id}/events", timeout=60) as got:
        assert got.status_code == 200 and got.headers["content-type"].startswith("text/event-stream")
        for line in got.iter_lines():
            if line.startswith("data: "):
                events.append(orjson.loads(line[len("data: ") :]))
    return events


def test_a_batch_streams_its_progress_until_it_ends(
    make_settings: Callable[..., Settings],
    redis_client: redis.Redis,  # a flushed store: no batch of an earlier test is fed beside this one
    start_worker: Callable[..., WorkerProcess],
) -> None:
    settings = slow_settings(make_settings)
    start_worker(settings)
    with live_server(settings) as url:
        client = client_for(url)
        batch = start_batch(client, slow_lines(6))
        events = batch_events(url, batch.id)
        # The stream ended by itself, on the batch as GET shows it: completed, every line counted.
        assert events[-1] == client.batches.retrieve(batch.id).model_dump(exclude_unset=True)
        assert events[-1]["status"] == "completed" and events[-1]["request_counts"]["completed"] == 6
        # Progress shows: counts only grow, and lines finished between the first and last event.
        completed = [event["request_counts"]["completed"] for event in events]
        assert completed == sorted(completed) and completed[0] < 6
        assert len(set(completed)) >= 3, completed
        # An event is sent for a change, not for each read.
        assert all(a != b for a, b in itertools.pairwise(events))
        # An ended batch's stream is its final state at once.
        assert batch_events(url, batch.id) == [events[-1]]
        missing = httpx.get(
            f"{url}/v1/batches/batch_{'0' * 32}/events", headers={"Authorization": "Bearer test-key"}
        )
        assert missing.status_code == 404 and missing.json()["error"]["param"] == "batch_id"
