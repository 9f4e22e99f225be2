"""cli/client.py, the CLI's side of the REST API, against a loopback HTTP server that answers as
the API does (the real API is driven through `genq` in tests/cli/test_jobs.py). A dropped stream
resumes after the last event it saw, and its text is neither lost nor repeated; an error event
or reply becomes an ApiError with the API's type; a deadline ends the stream with the job's
current state; each way a job ends has its exit code."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import ClassVar

import pytest

from cli.client import ApiError, Delta, ExitCode, Finished, JobsClient, SseFrame, exit_code_for, sse_frames
from cli.redis_server import free_port

DONE = {"id": "j1", "status": "succeeded"}


class FakeApi(BaseHTTPRequestHandler):
    """GET /v1/jobs/{id} and its stream. Job `drops` loses its first connection after one event;
    `silent` only pings; `broken` sends an error event; `missing` is a 404; `proxy` a bare 502."""

    last_event_ids: ClassVar[list[str | None]] = []
    authorizations: ClassVar[list[str | None]] = []

    def do_GET(self) -> None:
        FakeApi.authorizations.append(self.headers.get("authorization"))
        parts = self.path.strip("/").split("/")  # v1 jobs <id> [stream]
        job_id = parts[2]
        if job_id == "missing":
            return self._reply(404, json.dumps({"error": {"type": "not_found", "message": "no job missing"}}))
        if job_id == "proxy":
            return self._reply(502, "<html>bad gateway</html>")
        if len(parts) == 3:
            return self._reply(200, json.dumps({"id": job_id, "status": "running"}))
        FakeApi.last_event_ids.append(self.headers.get("last-event-id"))
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.end_headers()
        self.wfile.write(self._events(job_id).encode())
        self.wfile.flush()
        if job_id == "silent":
            time.sleep(1.5)

    def _events(self, job_id: str) -> str:
        if job_id == "broken":
            return 'event: error\ndata: {"error": {"type": "internal_error", "message": "store gone"}}\n\n'
        if job_id == "silent":
            return ": ping\n\n"
        if self.headers.get("last-event-id") is None:  # the first connection: one event, then cut
            return 'id: 1\nevent: output\ndata: {"delta": "Hel", "tokens": 1}\n\n'
        return (": ping\n\nid: 2\nevent: output\ndata: {\"delta\": \"lo\", \"tokens\": 2}\n\n"
                f"event: done\ndata: {json.dumps(DONE)}\n\n")  # fmt: skip

    def _reply(self, status: int, body: str) -> None:
        self.send_response(status)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body.encode())

    def log_message(self, *_: object) -> None:
        return None


@pytest.fixture
def client() -> Iterator[JobsClient]:
    FakeApi.last_event_ids, FakeApi.authorizations = [], []
    server = ThreadingHTTPServer(("127.0.0.1", 0), FakeApi)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    with JobsClient(f"http://127.0.0.1:{server.server_address[1]}", "sk-test") as jobs:
        yield jobs
    server.shutdown()
    server.server_close()


def test_a_dropped_stream_resumes_after_the_last_event(client: JobsClient) -> None:
    events = list(client.follow("drops", timeout_s=30))
    assert events == [Delta("Hel", 1), Delta("lo", 2), Finished(DONE)]
    assert FakeApi.last_event_ids == [None, "1"]
    assert set(FakeApi.authorizations) == {"Bearer sk-test"}


def test_past_the_deadline_the_stream_ends_with_the_jobs_current_state(client: JobsClient) -> None:
    started = time.monotonic()
    assert list(client.follow("silent", timeout_s=0.5)) == [Finished({"id": "silent", "status": "running"})]
    assert time.monotonic() - started < 5


def test_an_error_event_is_an_api_error(client: JobsClient) -> None:
    with pytest.raises(ApiError) as caught:
        list(client.follow("broken", timeout_s=10))
    assert (caught.value.type, caught.value.message) == ("internal_error", "store gone")


def test_error_replies_keep_the_apis_type_or_say_the_status(client: JobsClient) -> None:
    with pytest.raises(ApiError) as caught:
        client.get("missing")
    assert (caught.value.type, caught.value.message, caught.value.status) == (
        "not_found",
        "no job missing",
        404,
    )
    with pytest.raises(ApiError) as caught:
        client.get("proxy")
    assert caught.value.type == "http_error" and caught.value.message.startswith("HTTP 502: <html>")


def test_an_api_nobody_serves_is_unreachable() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    with JobsClient(url, None) as jobs, pytest.raises(ApiError) as caught:
        jobs.get("j1")
    assert caught.value.type == "unreachable" and url in caught.value.message


def test_sse_frames() -> None:
    lines = [": ping", "", "id: 7", "event: output", "data: one", "data: two", "", "data: plain", ""]
    assert list(sse_frames(iter(lines))) == [
        SseFrame("output", "one\ntwo", "7"),
        SseFrame("message", "plain", None),  # event and id do not carry over
    ]
    assert list(sse_frames(iter(["data: unfinished"]))) == []  # no blank line: no frame


@pytest.mark.parametrize(
    ("status", "code"),
    [("succeeded", ExitCode.OK), ("failed", ExitCode.FAILED), ("canceled", ExitCode.CANCELED),
     ("running", ExitCode.TIMED_OUT), ("queued", ExitCode.TIMED_OUT)],
)  # fmt: skip
def test_exit_codes(status: str, code: ExitCode) -> None:
    assert exit_code_for({"status": status}) == code
