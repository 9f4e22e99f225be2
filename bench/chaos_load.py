"""The chaos soak's traffic: the client that submits and cancels jobs, and the flapping webhook
receiver. Neither imports genq: they speak HTTP as a user's code would, and they keep their own
records (what was accepted, every answer, every delivery) for the invariant checker.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import json
import random
import threading
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx

#: The cacheable requests: every submission of one of these is byte-identical (temperature 0,
#: "cache": true), so the API answers repeats from its cache or coalesces them in flight.
CACHEABLE = (
    ("the chaos soak asks for rivers", 12),
    ("name three mountains please", 8),
    ("count to five slowly", 16),
    ("echo this cached prompt back", 10),
)
WORDS = ("alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india", "juliet")


@dataclass(frozen=True)
class Mix:
    """What fraction of submissions carry each feature."""

    rate_per_s: float
    interactive: float = 0.7
    webhook: float = 0.4
    #: Of the jobs with a webhook, those that also ask for the `start` event.
    webhook_start: float = 0.3
    cacheable: float = 0.3
    cancel: float = 0.12


@dataclass
class Job:
    """One accepted job, as the client saw it."""

    id: str
    api: int
    submitted_at: float
    accepted_at: float
    status_code: int
    prompt: str
    max_tokens: int
    priority: str
    webhook: bool
    events: list[str]
    cacheable: bool
    cancel_requested_at: float | None = None


@dataclass
class Answers:
    """Every answer the API gave, by kind, and what could not be an answer."""

    by_status: Counter[str] = field(default_factory=Counter)
    #: 5xx answers without the JSON error body, and any 500: each is an invariant violation.
    bare_5xx: list[dict[str, Any]] = field(default_factory=list)
    #: Connections refused (that API process was down): no answer at all, retried on the other.
    refused: int = 0
    #: The connection broke mid-request (the process was killed) or timed out: outcome unknown.
    transport_errors: Counter[str] = field(default_factory=Counter)

    def record(self, endpoint: str, response: httpx.Response, at: float) -> bool:
        """Count one answer; True when it is one of the allowed shapes."""
        self.by_status[f"{endpoint} {response.status_code}"] += 1
        if response.status_code < 500 or (response.status_code == 503 and _is_json_error(response)):
            return True
        body = response.content[:300].decode(errors="replace")
        self.bare_5xx.append({"at": at, "endpoint": endpoint, "status": response.status_code, "body": body})
        return False


def _is_json_error(response: httpx.Response) -> bool:
    try:
        body = response.json()
    except ValueError:
        return False
    error = body.get("error") if isinstance(body, dict) else None
    return (
        isinstance(error, dict)
        and isinstance(error.get("type"), str)
        and isinstance(error.get("message"), str)
    )


def echo_text(prompt: str, max_tokens: int) -> str:
    """What the placeholder engine must answer: the prompt's words, cycled, max_tokens of them."""
    words = prompt.split() or ["..."]
    return " ".join(words[i % len(words)] for i in range(max_tokens))


class Client:
    """Submits a seeded mix at a Poisson rate to the API processes, and cancels some jobs."""

    def __init__(self, api_ports: list[int], webhook_url: str, mix: Mix, seed: int) -> None:
        self._urls = [f"http://127.0.0.1:{port}" for port in api_ports]
        self._webhook_url = webhook_url
        self._mix = mix
        self._rng = random.Random(seed)
        self._sequence = 0
        self.jobs: list[Job] = []
        self.answers = Answers()
        self._http = httpx.AsyncClient(timeout=httpx.Timeout(20.0), limits=httpx.Limits(max_connections=256))

    async def run(self, until: float) -> None:
        """Submit until wall time `until`; returns once every request it started has ended."""
        async with asyncio.TaskGroup() as group:
            while time.time() < until:
                await asyncio.sleep(min(self._rng.expovariate(self._mix.rate_per_s), 2.0))
                group.create_task(self._submit(*self._next_body()))

    async def close(self) -> None:
        await self._http.aclose()

    def _next_body(self) -> tuple[dict[str, Any], int]:
        rng, mix = self._rng, self._mix
        self._sequence += 1
        if rng.random() < mix.cacheable:
            prompt, max_tokens = rng.choice(CACHEABLE)
            body: dict[str, Any] = {"prompt": prompt, "max_tokens": max_tokens, "cache": True}
        else:
            words = " ".join(rng.choices(WORDS, k=rng.randint(3, 8)))
            prompt, max_tokens = f"job {self._sequence} {words}", rng.randint(4, 24)
            body = {"prompt": prompt, "max_tokens": max_tokens, "cache": False}
        body |= {"temperature": 0, "priority": "interactive" if rng.random() < mix.interactive else "batch"}
        if rng.random() < mix.webhook:
            body["webhook"] = self._webhook_url
            with_start = rng.random() < mix.webhook_start
            body["webhook_events_filter"] = ["start", "completed"] if with_start else ["completed"]
        return body, rng.randrange(len(self._urls))

    async def _post(
        self, path: str, body: dict[str, Any] | None, api: int
    ) -> tuple[httpx.Response, int] | None:
        """POST to one API, or to the next when the first refuses the connection (as a Service
        routes around a pod that is down: nothing was sent, so a retry cannot duplicate)."""
        for attempt in range(len(self._urls)):
            index = (api + attempt) % len(self._urls)
            try:
                return await self._http.post(self._urls[index] + path, json=body), index
            except httpx.ConnectError:
                self.answers.refused += 1
            except httpx.TransportError as exc:
                self.answers.transport_errors[type(exc).__name__] += 1
                return None
        return None

    async def _submit(self, body: dict[str, Any], api: int) -> None:
        submitted_at = time.time()
        answer = await self._post("/v1/jobs", body, api)
        if answer is None:
            return
        response, index = answer
        self.answers.record("POST /v1/jobs", response, time.time())
        if response.status_code not in (200, 201, 202):
            return
        job = Job(
            id=response.json()["id"], api=index, submitted_at=submitted_at, accepted_at=time.time(),
            status_code=response.status_code, prompt=body["prompt"], max_tokens=body["max_tokens"],
            priority=body["priority"], webhook="webhook" in body,
            events=body.get("webhook_events_filter", []), cacheable=body["cache"],
        )  # fmt: skip
        self.jobs.append(job)
        if self._rng.random() < self._mix.cancel:
            await asyncio.sleep(self._rng.uniform(0.0, 0.5))
            job.cancel_requested_at = time.time()
            cancel = await self._post(f"/v1/jobs/{job.id}/cancel", None, self._rng.randrange(len(self._urls)))
            if cancel is not None:
                self.answers.record("POST /v1/jobs/{id}/cancel", cancel[0], time.time())

    def report(self) -> dict[str, Any]:
        return {
            "submissions_by_status": dict(sorted(self.answers.by_status.items())),
            "bare_5xx": len(self.answers.bare_5xx),
            "bare_5xx_examples": self.answers.bare_5xx[:10],
            "connections_refused": self.answers.refused,
            "transport_errors": dict(self.answers.transport_errors),
        }

    def jobs_json(self) -> list[dict[str, Any]]:
        return [asdict(job) for job in self.jobs]


# --- The flapping receiver ------------------------------------------------------------------------


@dataclass(frozen=True)
class Flapping:
    """How the receiver misbehaves: answers 500 or hangs up without answering, at random, but never
    more than max_failures times in a row for one webhook-id, so a sender that retries as promised
    always gets a delivery through (the retry schedule allows more attempts than that)."""

    error_p: float = 0.2
    hang_p: float = 0.08
    #: How long a hang holds the connection before closing it: past the sender's attempt timeout.
    hang_s: float = 4.0
    max_failures: int = 2


class Receiver:
    """A webhook endpoint on loopback (a thread per request) that logs every request to JSONL:
    when, its webhook-id, the event type and job id of its body, the job status it carries, whether
    its signature verifies with the secret, and what it answered (null: it hung up)."""

    def __init__(self, log_path: Path, secret: bytes, flapping: Flapping, seed: int) -> None:
        self.log_path = log_path
        self._secret = secret
        self._flapping = flapping
        self._rng = random.Random(seed)
        self._failures: Counter[str] = Counter()
        self._lock = threading.Lock()
        self._log = log_path.open("a")
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="chaos-receiver", daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}/hook"

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        with self._lock:
            self._log.close()

    def _decide(self, webhook_id: str) -> str:
        with self._lock:
            roll = self._rng.random()
            if self._failures[webhook_id] >= self._flapping.max_failures or roll >= (
                self._flapping.error_p + self._flapping.hang_p
            ):
                self._failures[webhook_id] = 0
                return "ok"
            self._failures[webhook_id] += 1
            return "error" if roll < self._flapping.error_p else "hang"

    def _write(self, entry: dict[str, Any]) -> None:
        with self._lock:
            self._log.write(json.dumps(entry) + "\n")
            self._log.flush()

    def _verified(self, headers: Any, body: bytes) -> bool:
        signed = f"{headers.get('webhook-id')}.{headers.get('webhook-timestamp')}.".encode() + body
        expected = base64.b64encode(hmac.new(self._secret, signed, hashlib.sha256).digest()).decode()
        offered = [part.removeprefix("v1,") for part in (headers.get("webhook-signature") or "").split()]
        return any(hmac.compare_digest(expected, sig) for sig in offered)

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length") or 0))
                receiver.handle(self, body)

            def log_message(self, *_: Any) -> None:  # quiet: the JSONL log is the record
                pass

        return Handler

    def handle(self, request: BaseHTTPRequestHandler, body: bytes) -> None:
        webhook_id = request.headers.get("webhook-id") or ""
        try:
            payload = json.loads(body)
            event, data = payload.get("type"), payload.get("data") or {}
        except (ValueError, AttributeError):
            event, data = None, {}
        decision = self._decide(webhook_id)
        answered = {"ok": 200, "error": 500, "hang": None}[decision]
        # Logged before answering: a 200 in the log may not have reached the sender (it then
        # retries under the same webhook-id, an allowed duplicate), never the other way round.
        self._write({
            "at": time.time(), "webhook_id": webhook_id, "type": event, "job_id": data.get("id"),
            "status": data.get("status"), "signature_ok": self._verified(request.headers, body),
            "answered": answered,
        })  # fmt: skip
        if decision == "hang":
            time.sleep(self._flapping.hang_s)
            request.close_connection = True
            return
        request.send_response(answered or 500)
        request.send_header("content-length", "0")
        request.end_headers()
