"""The CLI's side of the REST API: one authenticated httpx client, the job calls, the job's SSE
stream as typed events (resumed with Last-Event-ID when the connection drops), and the exit code
each outcome maps to."""

from __future__ import annotations

import enum
import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from shared.schemas import JobStatus

#: Statuses after which a job never changes.
TERMINAL = frozenset(status.value for status in JobStatus if status.is_terminal())
#: The API sends a `: ping` after 15 s without events (api/jobs/follow.py); a read silent for longer
#: than this means the connection is dead, so reconnect.
STREAM_READ_TIMEOUT_S = 30.0
#: Reconnections in a row without an event in between before the stream is given up.
MAX_RECONNECTS = 5


class ExitCode(enum.IntEnum):
    """What `genq submit` and `genq jobs ...` exit with (README, "The CLI")."""

    OK = 0
    FAILED = 1
    USAGE = 2  # also Click's own code for a bad option or argument
    CANCELED = 3
    TIMED_OUT = 4
    API_ERROR = 5


def exit_code_for(job: dict[str, Any]) -> ExitCode:
    """The exit code of a command that waited for `job` to end."""
    return {"succeeded": ExitCode.OK, "failed": ExitCode.FAILED, "canceled": ExitCode.CANCELED}.get(
        job["status"], ExitCode.TIMED_OUT
    )


class ApiError(Exception):
    """The API refused the request or could not be reached; `type` is its error type."""

    def __init__(self, type_: str, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.type = type_
        self.message = message
        self.status = status


@dataclass(frozen=True, slots=True)
class Delta:
    """New output text; `tokens` completion tokens so far."""

    text: str
    tokens: int


@dataclass(frozen=True, slots=True)
class Finished:
    """The job ended (or the deadline passed: then `job` is its last known state)."""

    job: dict[str, Any]


StreamEvent = Delta | Finished


class JobsClient:
    """The job endpoints of one genq API, with the caller's key."""

    def __init__(self, api_url: str, api_key: str | None) -> None:
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._http = httpx.Client(base_url=api_url, headers=headers, timeout=30.0)

    def __enter__(self) -> JobsClient:
        return self

    def __exit__(self, *_: object) -> None:
        self._http.close()

    def submit(self, body: dict[str, Any]) -> dict[str, Any]:
        return self._call("POST", "/v1/jobs", json=body)

    def get(self, job_id: str) -> dict[str, Any]:
        return self._call("GET", f"/v1/jobs/{job_id}")

    def cancel(self, job_id: str) -> dict[str, Any]:
        return self._call("POST", f"/v1/jobs/{job_id}/cancel")

    def list(self, status: str | None, limit: int, cursor: str | None) -> dict[str, Any]:
        params = {k: v for k, v in {"status": status, "limit": limit, "cursor": cursor}.items() if v}
        return self._call("GET", "/v1/jobs", params=params)

    # --- batches (the OpenAI Batch API) ---------------------------------------------------------
    def upload(self, path: Path) -> dict[str, Any]:
        """Upload a JSONL file of batch requests (streamed from disk)."""
        with path.open("rb") as source:
            files = {"file": (path.name, source)}
            return self._call("POST", "/v1/files", files=files, data={"purpose": "batch"}, timeout=None)

    def create_batch(self, file_id: str, endpoint: str) -> dict[str, Any]:
        body = {"input_file_id": file_id, "endpoint": endpoint, "completion_window": "24h"}
        return self._call("POST", "/v1/batches", json=body)

    def get_batch(self, batch_id: str) -> dict[str, Any]:
        return self._call("GET", f"/v1/batches/{batch_id}")

    def cancel_batch(self, batch_id: str) -> dict[str, Any]:
        return self._call("POST", f"/v1/batches/{batch_id}/cancel")

    def download(self, file_id: str, path: Path) -> None:
        """A file's content, streamed to `path`."""
        with self._http.stream("GET", f"/v1/files/{file_id}/content", timeout=None) as reply:
            if reply.is_error:
                reply.read()
                raise _api_error(reply)
            with path.open("wb") as out:
                for chunk in reply.iter_bytes():
                    out.write(chunk)

    def follow(self, job_id: str, timeout_s: float) -> Iterator[StreamEvent]:
        """The job's output as it is generated, then `Finished` with the final job, or with its
        current state once `timeout_s` has passed. A dropped connection is resumed where it
        stopped (Last-Event-ID), so no text is lost or repeated."""
        deadline = time.monotonic() + timeout_s
        last_id: str | None = None
        failures = 0
        while True:
            problem = "the stream ended early"
            try:
                for event_id, event in self._stream_once(job_id, last_id, deadline):
                    failures = 0
                    last_id = event_id or last_id
                    yield event
                    if isinstance(event, Finished):
                        return
            except httpx.TransportError as exc:
                problem = str(exc) or type(exc).__name__
            if time.monotonic() >= deadline:
                yield Finished(self.get(job_id))
                return
            failures += 1
            if failures > MAX_RECONNECTS:
                raise ApiError("unreachable", f"the job's stream kept failing: {problem}")
            time.sleep(min(0.2 * 2**failures, 2.0))

    def _stream_once(
        self, job_id: str, last_id: str | None, deadline: float
    ) -> Iterator[tuple[str | None, StreamEvent]]:
        """One connection to the stream: its events until it ends or the deadline passes."""
        headers = {"Last-Event-ID": last_id} if last_id else {}
        read_timeout = max(0.1, min(STREAM_READ_TIMEOUT_S, deadline - time.monotonic()))
        timeout = httpx.Timeout(10.0, read=read_timeout)
        with self._http.stream("GET", f"/v1/jobs/{job_id}/stream", headers=headers, timeout=timeout) as reply:
            if reply.is_error:
                reply.read()
                raise _api_error(reply)
            for frame in sse_frames(reply.iter_lines()):
                yield frame.id, _stream_event(frame)
                if time.monotonic() >= deadline:
                    return

    def _call(self, method: str, path: str, **kwargs: Any) -> dict[str, Any]:
        try:
            reply = self._http.request(method, path, **kwargs)
        except httpx.TransportError as exc:
            raise ApiError(
                "unreachable", f"cannot reach the genq API at {self._http.base_url}: {exc}"
            ) from exc
        if reply.is_error:
            raise _api_error(reply)
        body: dict[str, Any] = reply.json()
        return body


@dataclass(frozen=True, slots=True)
class SseFrame:
    event: str
    data: str
    id: str | None


def sse_frames(lines: Iterator[str]) -> Iterator[SseFrame]:
    """Server-Sent Events frames from the stream's lines (comments, i.e. pings, are skipped)."""
    event = "message"
    event_id: str | None = None
    data: list[str] = []
    for line in lines:
        if not line:
            if data:
                yield SseFrame(event, "\n".join(data), event_id)
            event, data, event_id = "message", [], None
            continue
        field, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if field == "event":
            event = value
        elif field == "data":
            data.append(value)
        elif field == "id":
            event_id = value


def _stream_event(frame: SseFrame) -> StreamEvent:
    body = json.loads(frame.data)
    if frame.event == "output":
        return Delta(body["delta"], body["tokens"])
    if frame.event == "done":
        return Finished(body)
    error = body.get("error", {})
    raise ApiError(error.get("type", "stream_error"), error.get("message", frame.data))


def _api_error(reply: httpx.Response) -> ApiError:
    try:
        error = reply.json()["error"]
        return ApiError(error["type"], error["message"], reply.status_code)
    except (ValueError, KeyError, TypeError):
        return ApiError("http_error", f"HTTP {reply.status_code}: {reply.text[:200]}", reply.status_code)
