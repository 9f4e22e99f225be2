"""api/batches/lines.py: each input line becomes the job it asks for or a named error, a file is
checked whole (blank lines, duplicates, its size), and each finished line becomes one result line
in OpenAI's output or error format. Pure functions, table-driven."""

from __future__ import annotations

import time
from typing import Any

import orjson
import pytest

from api.batches.lines import (
    CUSTOM_ID_MAX,
    MESSAGE_MAX,
    LineError,
    LineRequest,
    error_result,
    job_result,
    parse_line,
    request_id,
    validate,
)
from api.batches.splitter import TooLong
from api.openai.kind import Kind
from shared.jobqueue.records import public_job
from shared.schemas import JobStatus, JobView, Priority

CHAT = "/v1/chat/completions"
TEXT = "/v1/completions"
BATCH = "batch_abc"
MESSAGES = [{"role": "user", "content": "hi"}]


def line(custom_id: Any = "req-1", url: str = CHAT, method: str = "POST", **body: Any) -> bytes:
    return orjson.dumps({"custom_id": custom_id, "method": method, "url": url,
                         "body": body or {"model": "m", "messages": MESSAGES}})  # fmt: skip


@pytest.mark.parametrize(
    ("raw", "custom_id", "code", "says"),
    [
        (b"{not json", None, "invalid_json_line", "line 3 is not valid JSON"),
        (b"[1, 2]", None, "invalid_json_line", "line 3 is not a JSON object"),
        (line(custom_id=""), None, "missing_custom_id", "custom_id must be a non-empty string"),
        (line(custom_id=7), None, "missing_custom_id", "custom_id must be a non-empty string"),
        (line(custom_id="x" * (CUSTOM_ID_MAX + 1)), None, "invalid_custom_id", f"over {CUSTOM_ID_MAX}"),
        (line(method="GET"), "req-1", "invalid_method", "method must be POST"),
        (line(url=TEXT), "req-1", "invalid_url", "is not this batch's endpoint '/v1/chat/completions'"),
        (
            orjson.dumps({"custom_id": "req-1", "method": "POST", "url": CHAT, "body": "x"}),
            "req-1",
            "invalid_request",
            "body must be a JSON object",
        ),
        (
            line(model="m", messages=MESSAGES, stream=True),
            "req-1",
            "invalid_request",
            "stream is not supported",
        ),
        (line(model="m", messages=MESSAGES, max_tokens=-1), "req-1", "invalid_request", "body.max_tokens"),
        (line(model="m"), "req-1", "invalid_request", "body.messages"),
        (TooLong(5 << 20), None, "line_too_long", "5242880 bytes, longer than a line may be"),
    ],
)
def test_a_line_that_cannot_be_a_job_says_why(
    raw: bytes | TooLong, custom_id: str | None, code: str, says: str
) -> None:
    parsed = parse_line(raw, 3, CHAT, BATCH)
    assert isinstance(parsed, LineError)
    assert (parsed.custom_id, parsed.code) == (custom_id, code)
    assert parsed.message.startswith("line 3") and says in parsed.message
    assert parsed.entry() == {"custom_id": custom_id, "error": {"code": code, "message": parsed.message}}


def test_a_good_line_is_a_batch_priority_job_that_names_its_batch_and_line() -> None:
    parsed = parse_line(line(model="m", messages=MESSAGES), 1, CHAT, BATCH)
    assert isinstance(parsed, LineRequest) and parsed.custom_id == "req-1" and not parsed.echo
    assert parsed.create.priority is Priority.BATCH
    assert parsed.create.metadata.items() >= {"batch_id": BATCH, "custom_id": "req-1"}.items()
    assert parsed.create.messages is not None and parsed.create.messages[0].content == "hi"
    text = parse_line(line(url=TEXT, model="m", prompt="say", echo=True), 1, TEXT, BATCH)
    assert isinstance(text, LineRequest) and text.echo and text.create.prompt == "say"


def test_a_file_is_counted_and_its_bad_and_repeated_lines_named() -> None:
    lines: list[bytes | TooLong] = [
        line("a"), b"\n", b"   \n", line("b"), b"{oops", line("a"), TooLong(2 << 20), line("b")
    ]  # fmt: skip
    checked = validate(lines, CHAT, BATCH, max_lines=10)
    assert checked.problem is None and checked.total == 6  # blank lines are not requests
    # Refusals are counted; only the repeats' numbers are kept (the rest follow from the line).
    assert (checked.refused, checked.duplicates) == (4, [6, 8])


def test_what_a_refusal_echoes_is_cut_short() -> None:
    """A refused line costs a bounded amount wherever its error is kept, whatever it held."""
    url = "/v1/" + "u" * 100_000
    refused = parse_line(line(url=url), 2, CHAT, BATCH)
    assert isinstance(refused, LineError) and refused.code == "invalid_url"
    message = refused.entry()["error"]["message"]
    assert len(message) <= MESSAGE_MAX and message.startswith("line 2: url '/v1/uuu") and "..." in message
    long_id = "i" * CUSTOM_ID_MAX
    checked = validate([line(long_id), line(long_id)], CHAT, BATCH, max_lines=10)
    assert checked.duplicates == [2]
    extra = {"custom_id": "c", "method": "POST", "url": CHAT, "body": {"model": "m", "messages": MESSAGES,
             "k" * 50_000: 1}}  # fmt: skip
    for raw in (orjson.dumps(extra), line(model="m", messages=MESSAGES, stop=["s" * 50_000] * 9)):
        entry = parse_line(raw, 1, CHAT, BATCH)
        assert isinstance(entry, LineError) and len(orjson.dumps(entry.entry())) < 1000


def test_a_file_too_long_or_empty_fails_whole() -> None:
    too_long = validate([line(str(i)) for i in range(4)], CHAT, BATCH, max_lines=3)
    message = "the file holds more than 3 requests (GENQ_BATCH_MAX_LINES)"
    assert too_long.problem == {
        "code": "too_many_lines",
        "message": message,
        "param": "input_file_id",
        "line": 4,
    }
    empty = validate([b"\n", b""], CHAT, BATCH, max_lines=3)
    assert empty.problem is not None and empty.problem["code"] == "empty_file" and empty.total == 0


def job(
    status: JobStatus, output: dict[str, Any] | None = None, error: dict[str, Any] | None = None
) -> JobView:
    record = {"id": "6f1c0a2e-8b1d-4c3e-9f00-0123456789ab", "status": status.value, "model": "m",
              "created_at": repr(time.time()), "input": orjson.dumps({"prompt": "hi"}).decode(),
              "output": orjson.dumps(output).decode() if output else "",
              "error": orjson.dumps(error).decode() if error else ""}  # fmt: skip
    return public_job(record)


def test_result_lines_have_openais_shapes_and_stable_ids() -> None:
    assert request_id(BATCH, 1) == request_id(BATCH, 1) != request_id(BATCH, 2) != request_id("batch_x", 1)
    assert request_id(BATCH, 1).startswith("batch_req_")
    done = job(JobStatus.SUCCEEDED, {"text": "hello", "finish_reason": "stop",
                                     "usage": {"prompt_tokens": 1, "completion_tokens": 1}})  # fmt: skip
    result = orjson.loads(job_result(BATCH, 1, {"custom_id": "a"}, Kind.CHAT, done))
    assert result["id"] == request_id(BATCH, 1) and result["custom_id"] == "a" and result["error"] is None
    assert result["response"]["status_code"] == 200 and result["response"]["request_id"] == done["id"]
    assert result["response"]["body"]["object"] == "chat.completion"
    assert result["response"]["body"]["choices"][0]["message"]["content"] == "hello"
    failed = job(JobStatus.FAILED, error={"type": "worker_lost", "message": "the worker died"})
    result = orjson.loads(job_result(BATCH, 2, {"custom_id": "b"}, Kind.CHAT, failed))
    assert result["response"]["status_code"] == 500
    assert result["response"]["body"] == {"error": {"message": "the worker died", "type": "server_error",
                                                    "param": None, "code": "worker_lost"}}  # fmt: skip
    refused = error_result(BATCH, 3, None, "invalid_json_line", "line 3 is not valid JSON")
    assert refused.endswith(b"\n") and orjson.loads(refused) == {
        "id": request_id(BATCH, 3), "custom_id": None, "response": None,
        "error": {"code": "invalid_json_line", "message": "line 3 is not valid JSON"},
    }  # fmt: skip
