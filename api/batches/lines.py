"""A batch's lines: each input line in OpenAI's request format becomes a genq job (through the
same translation as /v1/chat/completions and /v1/completions), or an error; each finished line
becomes one result line in OpenAI's output or error file format.

Input:  {"custom_id": "...", "method": "POST", "url": "/v1/chat/completions", "body": {...}}
Output: {"id": "batch_req_...", "custom_id": "...", "response": {"status_code": 200,
         "request_id": "<job id>", "body": <chat.completion>}, "error": null}
Error:  {"id": ..., "custom_id": ..., "response": null, "error": {"code": ..., "message": ...}}
        (or, for a job that ran and failed, a response with status 500 and OpenAI's error body).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import orjson
import pydantic

from api.batches.splitter import Line, TooLong
from api.openai.kind import Kind
from api.openai.requests import ChatCompletionRequest, CompletionRequest, echoes, job_create
from api.openai.responses import completion, failure_of
from shared.batches import BatchStatus
from shared.errors import GenqError
from shared.schemas import JobCreate, JobStatus, JobView, Priority

#: The translation each endpoint a batch may name uses.
KIND_OF_ENDPOINT = {"/v1/chat/completions": Kind.CHAT, "/v1/completions": Kind.TEXT}

#: Longest custom_id (it goes into the job's metadata, whose values are at most 512 characters).
CUSTOM_ID_MAX = 512
#: Longest message of a refused line's error, and longest part of the line (its url) a message
#: echoes: a refusal costs a bounded amount wherever it is kept, whatever the line held.
MESSAGE_MAX = 300
ECHO_MAX = 100


def echo(value: object) -> str:
    """A value of the line as an error message shows it: its repr, cut to ECHO_MAX characters."""
    text = repr(value)
    return text if len(text) <= ECHO_MAX else text[: ECHO_MAX - 3] + "..."


@dataclass(frozen=True, slots=True)
class LineRequest:
    custom_id: str
    create: JobCreate
    echo: bool


@dataclass(frozen=True, slots=True)
class LineError:
    custom_id: str | None
    code: str
    message: str

    def entry(self) -> dict[str, Any]:
        """The line's window entry (its error is written with the next part); the message is cut
        to MESSAGE_MAX characters."""
        message = (
            self.message if len(self.message) <= MESSAGE_MAX else self.message[: MESSAGE_MAX - 3] + "..."
        )
        return {"custom_id": self.custom_id, "error": {"code": self.code, "message": message}}


def _custom_id(line: dict[str, Any], number: int) -> str | LineError:
    custom_id = line.get("custom_id")
    if not isinstance(custom_id, str) or not custom_id:
        return LineError(None, "missing_custom_id", f"line {number}: custom_id must be a non-empty string")
    if len(custom_id) > CUSTOM_ID_MAX:
        return LineError(
            None, "invalid_custom_id", f"line {number}: custom_id is over {CUSTOM_ID_MAX} characters"
        )
    return custom_id


def parse_line(raw: Line, number: int, endpoint: str, batch_id: str) -> LineRequest | LineError:
    """One input line (1-based `number`) as the job it asks for, or why it cannot be one; a line
    over the cap (TooLong: its bytes were never held) is refused unparsed."""
    if isinstance(raw, TooLong):
        message = f"line {number} is {raw.size} bytes, longer than a line may be (GENQ_BATCH_LINE_MAX_BYTES)"
        return LineError(None, "line_too_long", message)
    try:
        line = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return LineError(None, "invalid_json_line", f"line {number} is not valid JSON")
    if not isinstance(line, dict):
        return LineError(None, "invalid_json_line", f"line {number} is not a JSON object")
    custom_id = _custom_id(line, number)
    if isinstance(custom_id, LineError):
        return custom_id
    refused = _envelope_error(line, custom_id, number, endpoint)
    if refused is not None:
        return refused
    return _request(custom_id, line["body"], number, endpoint, batch_id)


def _envelope_error(line: dict[str, Any], custom_id: str, number: int, endpoint: str) -> LineError | None:
    """What is wrong with the line's method, url or body, if anything."""
    if line.get("method") != "POST":
        return LineError(custom_id, "invalid_method", f"line {number}: method must be POST")
    if line.get("url") != endpoint:
        message = f"line {number}: url {echo(line.get('url'))} is not this batch's endpoint {endpoint!r}"
        return LineError(custom_id, "invalid_url", message)
    if not isinstance(line.get("body"), dict):
        return LineError(custom_id, "invalid_request", f"line {number}: body must be a JSON object")
    return None


def _request(
    custom_id: str, body: dict[str, Any], number: int, endpoint: str, batch_id: str
) -> LineRequest | LineError:
    if body.get("stream"):
        return LineError(custom_id, "invalid_request", f"line {number}: stream is not supported in a batch")
    model = ChatCompletionRequest if KIND_OF_ENDPOINT[endpoint] is Kind.CHAT else CompletionRequest
    try:
        request = model.model_validate(body)
        create = job_create(request)
    except pydantic.ValidationError as exc:
        first = exc.errors()[0]
        field = ".".join(str(p) for p in first.get("loc", ())) or "body"
        return LineError(custom_id, "invalid_request", f"line {number}: body.{field}: {first.get('msg')}")
    except GenqError as exc:
        return LineError(custom_id, "invalid_request", f"line {number}: {exc.message}")
    metadata = create.metadata | {"batch_id": batch_id, "custom_id": custom_id}
    create = create.model_copy(update={"priority": Priority.BATCH, "metadata": metadata})
    return LineRequest(custom_id, create, echoes(request))


#: Whether a line's response-format schema can be enforced: its refusal, or None
#: (api/batches/line_schemas.py's BatchSchemas.check).
SchemaCheck = Callable[[LineRequest, int], LineError | None]


@dataclass(frozen=True, slots=True)
class Validation:
    """A pass over an input file: its request count, how many lines it refused, the numbers of
    the lines refused for repeating a custom_id, or a whole-file error.

    Only the repeats are kept: every other refusal follows from the line alone, so the feeder
    finds it again when it reads the line, and a refused line is copied nowhere."""

    total: int
    refused: int = 0
    duplicates: list[int] = field(default_factory=list)
    problem: dict[str, Any] | None = None


def validate(
    lines: Iterable[Line], endpoint: str, batch_id: str, max_lines: int, schemas: SchemaCheck | None = None
) -> Validation:
    """Check every line (blank ones are skipped); the second and later lines with a custom_id
    already seen are refused as duplicate_custom_id. With `schemas`, a line whose response-format
    schema cannot be enforced is refused too; without, the lines' format alone is checked."""
    seen: set[str] = set()
    duplicates: list[int] = []
    total = refused = 0
    for number, raw in enumerate(lines, start=1):
        if isinstance(raw, bytes) and not raw.strip():
            continue
        total += 1
        if total > max_lines:
            message = f"the file holds more than {max_lines} requests (GENQ_BATCH_MAX_LINES)"
            return Validation(0, problem=input_problem("too_many_lines", message, number))
        parsed = parse_line(raw, number, endpoint, batch_id)
        if isinstance(parsed, LineRequest) and schemas is not None and parsed.custom_id not in seen:
            parsed = schemas(parsed, number) or parsed
        if isinstance(parsed, LineError):
            refused += 1
        elif parsed.custom_id in seen:
            refused += 1
            duplicates.append(number)
        else:
            seen.add(parsed.custom_id)
    if total == 0:
        return Validation(0, problem=input_problem("empty_file", "the file holds no requests", None))
    return Validation(total, refused, duplicates)


def duplicate(custom_id: str, number: int) -> LineError:
    """The refusal of a line whose custom_id an earlier line used."""
    message = f"line {number}: custom_id {echo(custom_id)} was used by an earlier line"
    return LineError(custom_id, "duplicate_custom_id", message)


def input_problem(code: str, message: str, line: int | None) -> dict[str, Any]:
    """A whole-file error of a batch (its errors list): what is wrong with its input file."""
    return {"code": code, "message": message, "param": "input_file_id", "line": line}


# --- results -------------------------------------------------------------------------------------

#: The error of a line a batch never ran, by how the batch ended (OpenAI's codes).
NOT_RUN = {
    BatchStatus.CANCELLED: ("batch_cancelled", "the batch was cancelled before this request ran"),
    BatchStatus.EXPIRED: (
        "batch_expired",
        "this request could not be executed before the completion window expired",
    ),
}


def request_id(batch_id: str, line: int) -> str:
    """A line's result id: the same on every write, so a part rewritten after a crash is too."""
    return "batch_req_" + hashlib.sha256(f"{batch_id}:{line}".encode()).hexdigest()[:32]


def _line(batch_id: str, line: int, custom_id: str | None, response: Any, error: Any) -> bytes:
    result = {"id": request_id(batch_id, line), "custom_id": custom_id, "response": response, "error": error}
    return orjson.dumps(result) + b"\n"


def error_result(batch_id: str, line: int, custom_id: str | None, code: str, message: str) -> bytes:
    return _line(batch_id, line, custom_id, None, {"code": code, "message": message})


def job_result(batch_id: str, line: int, entry: dict[str, Any], kind: Kind, job: JobView) -> bytes:
    """A terminal job's result line: its completion, or OpenAI's error body for a failed one."""
    custom_id = entry["custom_id"]
    if job["status"] is JobStatus.SUCCEEDED:
        body = completion(kind, job, bool(entry.get("echo")))
        return _line(
            batch_id, line, custom_id, {"status_code": 200, "request_id": job["id"], "body": body}, None
        )
    code, message = failure_of(job)
    body = {"error": {"message": message, "type": "server_error", "param": None, "code": code}}
    return _line(batch_id, line, custom_id, {"status_code": 500, "request_id": job["id"], "body": body}, None)
