"""Webhook deliveries end to end: the real API, a model worker and a `--queues webhooks` worker
(real processes), and real HTTP receivers on loopback (the SSRF guard is lifted for them, except
where the guard itself is tested). Signatures are checked with the `standardwebhooks` package."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import itertools
import json
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any, cast

import httpx
import pytest
import redis
from standardwebhooks.webhooks import Webhook, WebhookVerificationError

from cli.redis_server import EmbeddedRedis
from shared import keys
from shared.config import Settings
from shared.jobspec import JobSpec
from shared.signing import headers, parse_secrets
from tests.conftest import WorkerProcess, api_client, suite_settings
from tests.workers.webhooks.conftest import QuietServer
from workers.webhooks.delivery import Delivery
from workers.webhooks.output import OutputWebhooks

pytestmark = pytest.mark.anyio

OLD_SECRET = "whsec_" + base64.b64encode(b"the secret being retired, 32 b!").decode()
NEW_SECRET = "whsec_" + base64.b64encode(b"the secret taking over, 32 bytes").decode()
TIMEOUT_S = 1.0
DELAYS = ["0.2", "0.4", "0.8", "1.6"]

#: One receiver answer: an HTTP status, or seconds to hang before answering 200.
Answer = int | float


@dataclass
class Received:
    headers: dict[str, str]
    body: bytes
    at: float

    @property
    def payload(self) -> dict[str, Any]:
        return cast(dict[str, Any], json.loads(self.body))

    @property
    def type(self) -> str:
        return str(self.payload["type"])


class Receiver:
    """An HTTP receiver on loopback that records every request and answers from a script per
    event type (default 200)."""

    def __init__(self, answers: dict[str, list[Answer]] | None = None, port: int = 0) -> None:
        self.answers = {kind: list(script) for kind, script in (answers or {}).items()}
        self.received: list[Received] = []
        self.statuses: list[int] = []
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["content-length"]))
                entry = Received({k.lower(): v for k, v in self.headers.items()}, body, time.monotonic())
                script = receiver.answers.get(entry.type, [])
                answer = script.pop(0) if script else 200
                receiver.received.append(entry)
                if isinstance(answer, float):
                    time.sleep(answer)
                    answer = 200
                receiver.statuses.append(answer)
                self.send_response(answer)
                self.send_header("content-length", "2")
                self.end_headers()
                self.wfile.write(b"ok")

            def log_message(self, *_: Any) -> None:
                pass

        self.server = QuietServer(("127.0.0.1", port), Handler)
        self.server.daemon_threads = True
        self.server.block_on_close = False
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/hooks/genq"

    def of_type(self, kind: str) -> list[Received]:
        return [r for r in self.received if r.type == kind]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receivers() -> Iterator[Callable[..., Receiver]]:
    started: list[Receiver] = []

    def start(answers: dict[str, list[Answer]] | None = None, port: int = 0) -> Receiver:
        started.append(Receiver(answers, port))
        return started[-1]

    yield start
    for receiver in started:
        receiver.close()


def hook_settings(redis_url: str, data_dir: Path, **overrides: Any) -> Settings:
    """The suite's settings, with signed webhooks to loopback receivers and a short schedule."""
    values: dict[str, Any] = {
        "placeholder_step_s": 0.02,
        "webhook_allow_private": True,
        "webhook_secret": f"{NEW_SECRET} {OLD_SECRET}",
        "webhook_timeout_s": TIMEOUT_S,
        "webhook_retry_delays_s": DELAYS,
    }
    return suite_settings(redis_url, data_dir, **(values | overrides))


async def submit_completed_hook(api: httpx.AsyncClient, receiver: Receiver) -> str:
    """A job whose `job.completed` goes to `receiver`; a 503 while Redis comes back is retried,
    as a client does."""
    body = {"prompt": "p", "max_tokens": 2, "webhook": receiver.url, "cache": False,
            "webhook_events_filter": ["completed"]}  # fmt: skip
    for _ in range(50):
        response = await api.post("/v1/jobs", json=body)
        if response.status_code != 503:
            break
        await asyncio.sleep(0.2)
    assert response.status_code == 202, response.text
    return str(response.json()["id"])


@pytest.fixture(scope="module")
def settings(redis_server: EmbeddedRedis, tmp_path_factory: pytest.TempPathFactory) -> Settings:
    return hook_settings(redis_server.url, tmp_path_factory.mktemp("webhooks") / "genq")


@pytest.fixture(scope="module")
def workers(settings: Settings, tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """One model worker and one webhook worker for the whole module (starting processes is the
    slow part); each test uses its own jobs and receivers, so they do not interfere."""
    redis.Redis.from_url(settings.require_redis_url()).flushdb()
    logs = tmp_path_factory.mktemp("worker-logs")
    started = [
        WorkerProcess(settings, logs / "model.log", "--concurrency=4"),
        WorkerProcess(settings, logs / "webhooks.log", "--queues=webhooks"),
    ]
    try:
        for worker in started:
            worker.wait_ready()
        yield
    finally:
        for worker in started:
            worker.close()


async def until(check: Callable[[], Any], timeout_s: float = 15.0, what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout_s
    while not (value := check()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.02)
    return value


async def delivery_log(api: httpx.AsyncClient, job_id: str) -> list[dict[str, Any]]:
    response = await api.get(f"/v1/jobs/{job_id}/webhooks")
    assert response.status_code == 200
    return list(response.json()["data"])


async def log_until(
    api: httpx.AsyncClient, job_id: str, done: Callable[[list[dict[str, Any]]], object]
) -> list[dict[str, Any]]:
    deadline = time.monotonic() + 15
    while not done(entries := await delivery_log(api, job_id)):
        assert time.monotonic() < deadline, f"delivery log never got there: {entries}"
        await asyncio.sleep(0.05)
    return entries


def verify_with_each_secret(received: Received) -> dict[str, Any]:
    """Rotation: a receiver that knows only the old secret, or only the new one, verifies."""
    payloads = [
        Webhook(secret).verify(received.body, received.headers) for secret in (OLD_SECRET, NEW_SECRET)
    ]
    assert payloads[0] == payloads[1]
    return dict(payloads[0])


async def submit(
    api: httpx.AsyncClient, receiver_url: str, events: list[str] | None = None, **extra: Any
) -> str:
    # cache off: a cache hit would answer at once without running the job on the worker
    body: dict[str, Any] = {
        "prompt": "one two three",
        "max_tokens": 4,
        "webhook": receiver_url,
        "cache": False,
    }
    body |= extra
    if events is not None:
        body["webhook_events_filter"] = events
    response = await api.post("/v1/jobs", json=body)
    assert response.status_code == 202, response.text
    return str(response.json()["id"])


# --- events, body, signatures -------------------------------------------------------------------------
async def test_start_and_completed_are_signed_and_carry_the_job(
    settings: Settings, workers: None, receivers: Callable[..., Receiver]
) -> None:
    receiver = receivers()
    async with api_client(settings) as api:
        job_id = await submit(api, receiver.url, ["start", "completed"])
        await until(lambda: len(receiver.received) == 2, what="two deliveries")
        job = (await api.get(f"/v1/jobs/{job_id}")).json()
        entries = await log_until(api, job_id, lambda e: len(e) == 2)
    start, completed = receiver.received
    assert [start.type, completed.type] == ["job.start", "job.completed"]
    for received, event in ((start, "start"), (completed, "completed")):
        payload = verify_with_each_secret(received)
        assert received.headers["webhook-id"] == f"msg_{job_id}_{event}"
        assert abs(int(received.headers["webhook-timestamp"]) - time.time()) < 30
        assert len(received.headers["webhook-signature"].split(" ")) == 2  # one per secret
        assert received.headers["content-type"] == "application/json"
        assert payload["timestamp"].endswith("Z") and payload["data"]["id"] == job_id
    assert verify_with_each_secret(completed)["data"] == job  # exactly what GET returns
    assert job["status"] == "succeeded"
    assert [(e["event"], e["attempt"], e["status_code"], e["outcome"]) for e in entries] == [
        ("start", 1, 200, "delivered"),
        ("completed", 1, 200, "delivered"),
    ]
    assert all(e["at"].endswith("Z") and e["duration_ms"] >= 0 for e in entries)


async def test_the_filter_selects_the_events(
    settings: Settings, workers: None, receivers: Callable[..., Receiver]
) -> None:
    default, start_only = receivers(), receivers()
    async with api_client(settings) as api:
        default_job = await submit(api, default.url)  # the default filter: completed
        start_job = await submit(api, start_only.url, ["start"])
        for job_id in (default_job, start_job):
            await api.get(f"/v1/jobs/{job_id}", params={"wait": 15})
        await until(lambda: default.received and start_only.received, what="deliveries")
        await asyncio.sleep(0.5)  # nothing else comes
    assert [r.type for r in default.received] == ["job.completed"]
    assert [r.type for r in start_only.received] == ["job.start"]


async def test_output_events_reach_the_receiver_while_the_job_runs(
    settings: Settings, workers: None, receivers: Callable[..., Receiver]
) -> None:
    """The model worker's runtime notes each delta it streams for a job whose filter holds
    `output` (end to end: nothing here calls the notifier while the job runs)."""
    receiver = receivers()
    async with api_client(settings) as api:
        job_id = await submit(api, receiver.url, ["output", "completed"], max_tokens=100)  # about 2 s
        await api.get(f"/v1/jobs/{job_id}", params={"wait": 15})
        await until(lambda: receiver.of_type("job.completed"), what="completed")
        # Deliveries run concurrently, so an output notice already on its way when the job ended
        # may land just after `completed` (only completed-after-start is promised). One noted
        # once the job is over is never sent: `completed` carries the final state.
        await asyncio.sleep(1.5)  # past the notifier's once-a-second limit, and past any in flight
        delivered = len(receiver.received)
        notifier = OutputWebhooks(
            redis.Redis.from_url(settings.require_redis_url(), decode_responses=True), settings
        )
        hooked = {
            "prompt": "x",
            "max_tokens": 1,
            "webhook": receiver.url,
            "webhook_events_filter": ["output"],
        }
        notifier.follow(job_id, JobSpec.model_validate(hooked))
        notifier.on_output(job_id)  # what the runtime would do with a late delta
        await asyncio.sleep(1.5)
    notifier.close()
    assert len(receiver.received) == delivered, [r.type for r in receiver.received]
    outputs = receiver.of_type("job.output")
    assert outputs, "no output event"
    for received in outputs:
        payload = verify_with_each_secret(received)
        assert payload["data"]["id"] == job_id and payload["data"]["status"] == "running"
    assert not receiver.of_type("job.start")
    assert len(receiver.of_type("job.completed")) == 1


def socket_free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# --- retries ------------------------------------------------------------------------------------------
async def test_server_errors_are_retried_with_the_same_body_until_success(
    settings: Settings, workers: None, receivers: Callable[..., Receiver]
) -> None:
    receiver = receivers({"job.completed": [500, 503]})
    async with api_client(settings) as api:
        job_id = await submit(api, receiver.url)
        entries = await log_until(api, job_id, lambda e: e and e[-1]["outcome"] == "delivered")
    assert [(e["attempt"], e["status_code"], e["outcome"]) for e in entries] == [
        (1, 500, "retrying"),
        (2, 503, "retrying"),
        (3, 200, "delivered"),
    ]
    assert all("next_attempt_at" in e for e in entries[:2])
    assert len({r.body for r in receiver.received}) == 1  # frozen at the first attempt
    assert len({r.headers["webhook-id"] for r in receiver.received}) == 1
    for received in receiver.received:
        verify_with_each_secret(received)
    gaps = [b.at - a.at for a, b in itertools.pairwise(receiver.received)]
    assert gaps[0] >= 0.2 and gaps[1] >= 0.4  # the schedule: 0.2 s, then 0.4 s (plus jitter)


async def test_gone_stops_for_good(
    settings: Settings, workers: None, receivers: Callable[..., Receiver]
) -> None:
    receiver = receivers({"job.completed": [410]})
    async with api_client(settings) as api:
        job_id = await submit(api, receiver.url)
        entries = await log_until(api, job_id, lambda e: len(e) >= 1)
        await asyncio.sleep(1.0)  # well past the first retry delay
        entries = await delivery_log(api, job_id)
    assert [(e["status_code"], e["outcome"]) for e in entries] == [(410, "gone")]
    assert len(receiver.received) == 1


async def test_a_failing_receiver_is_given_up_after_the_schedule(
    settings: Settings, workers: None, receivers: Callable[..., Receiver]
) -> None:
    receiver = receivers({"job.completed": [500] * 10})
    async with api_client(settings) as api:
        job_id = await submit(api, receiver.url)
        entries = await log_until(api, job_id, lambda e: e and e[-1]["outcome"] == "failed")
    assert [e["outcome"] for e in entries] == ["retrying"] * len(DELAYS) + ["failed"]
    assert len(receiver.received) == len(DELAYS) + 1


async def test_a_receiver_that_is_down_for_a_while_gets_the_delivery(
    settings: Settings, workers: None, receivers: Callable[..., Receiver]
) -> None:
    port = socket_free_port()
    async with api_client(settings) as api:
        job_id = await submit(api, f"http://127.0.0.1:{port}/hooks")
        await log_until(api, job_id, lambda e: len(e) >= 2)  # two attempts refused by the closed port
        receiver = receivers(port=port)
        entries = await log_until(api, job_id, lambda e: e[-1]["outcome"] == "delivered")
    assert len(receiver.received) == 1
    failed = entries[:-1]
    assert len(failed) >= 2 and all(
        e["outcome"] == "retrying" and "ConnectError" in e["error"] for e in failed
    )
    assert [e["attempt"] for e in entries] == list(range(1, len(entries) + 1))


async def test_a_hanging_receiver_is_cut_at_the_timeout(
    settings: Settings, workers: None, receivers: Callable[..., Receiver]
) -> None:
    receiver = receivers({"job.completed": [3.0]})  # hangs 3 s on the first attempt
    async with api_client(settings) as api:
        job_id = await submit(api, receiver.url)
        entries = await log_until(api, job_id, lambda e: e and e[-1]["outcome"] == "delivered")
    first, second = entries
    assert first["outcome"] == "retrying" and first["error"].startswith("timeout")
    assert TIMEOUT_S * 1000 * 0.9 <= first["duration_ms"] < TIMEOUT_S * 1000 * 2.5
    assert second["status_code"] == 200


# --- ordering -----------------------------------------------------------------------------------------
async def test_completed_waits_until_start_was_delivered_or_given_up(
    settings: Settings, workers: None, receivers: Callable[..., Receiver]
) -> None:
    slow_start = receivers({"job.start": [500, 500]})
    gone_start = receivers({"job.start": [410]})
    async with api_client(settings) as api:
        slow_job = await submit(api, slow_start.url, ["start", "completed"])
        gone_job = await submit(api, gone_start.url, ["start", "completed"])
        await until(lambda: slow_start.of_type("job.completed") and gone_start.of_type("job.completed"))
        slow_done = (await api.get(f"/v1/jobs/{slow_job}")).json()["completed_at"]
        # The waits used none of completed's attempts (its body was frozen when the job ended, so
        # each claim counted one: the wait's attempt record set it back).
        entries = await log_until(api, slow_job, lambda e: any(x["event"] == "completed" for x in e))
    # The job was over long before its start got through; completed still came after it.
    assert slow_done is not None
    assert [(r.type, s) for r, s in zip(slow_start.received, slow_start.statuses, strict=True)] == [
        ("job.start", 500),
        ("job.start", 500),
        ("job.start", 200),
        ("job.completed", 200),
    ]
    assert [(r.type, s) for r, s in zip(gone_start.received, gone_start.statuses, strict=True)] == [
        ("job.start", 410),
        ("job.completed", 200),
    ]
    assert [(e["event"], e["attempt"]) for e in entries] == [
        ("start", 1),
        ("start", 2),
        ("start", 3),
        ("completed", 1),
    ]
    assert gone_job


# --- the SSRF guard at delivery time --------------------------------------------------------------------
async def test_the_guard_refuses_at_delivery_time(
    redis_server: EmbeddedRedis,
    tmp_path: Path,
    receivers: Callable[..., Receiver],
    start_worker: Callable[..., WorkerProcess],
) -> None:
    """A target that passed at submit but is forbidden when delivered (as after DNS rebinding):
    refused, not retried, nothing sent. Its own database, so only this guarded worker delivers."""
    receiver = receivers()
    port = int(receiver.url.split(":")[2].split("/")[0])
    url = redis_server.url[:-1] + "1"
    redis.Redis.from_url(url).flushdb()
    lenient = hook_settings(url, tmp_path / "genq")
    guarded = hook_settings(
        url, tmp_path / "genq", webhook_allow_private=False, webhook_allowed_ports=str(port)
    )
    start_worker(guarded, "--queues=webhooks")
    async with api_client(lenient) as api:
        job_id = await submit(api, receiver.url)
        await api.post(f"/v1/jobs/{job_id}/cancel")  # no model worker here: cancel ends it, completed is sent
        entries = await log_until(api, job_id, lambda e: len(e) >= 1)
        await asyncio.sleep(0.5)
        entries = await delivery_log(api, job_id)
    assert [(e["outcome"], e["attempt"]) for e in entries] == [("refused", 1)]
    assert "loopback" in entries[0]["error"] and "status_code" not in entries[0]
    assert receiver.received == []


# --- signing, against the reference verifier -----------------------------------------------------------
def test_signatures_verify_with_either_rotated_secret_and_not_with_another() -> None:
    body = b'{"type":"job.completed"}'
    signed = headers(parse_secrets(f"{NEW_SECRET} {OLD_SECRET}"), "msg_1", int(time.time()), body)
    for secret in (NEW_SECRET, OLD_SECRET):
        assert Webhook(secret).verify(body, signed) == {"type": "job.completed"}
    with pytest.raises(WebhookVerificationError):
        Webhook("whsec_" + base64.b64encode(b"someone else").decode()).verify(body, signed)
    with pytest.raises(ValueError, match="whsec_"):
        parse_secrets("whsec_not*base64")


# --- per-key secrets ------------------------------------------------------------------------------------
B_SECRET = "whsec_" + base64.b64encode(b"tenant b's own secret, 32 bytes").decode()


def verifies(secret: str, received: Received) -> bool:
    try:
        Webhook(secret).verify(received.body, received.headers)
    except WebhookVerificationError:
        return False
    return True


async def test_each_key_signs_with_its_own_secret_and_no_other(
    redis_server: EmbeddedRedis,
    tmp_path: Path,
    receivers: Callable[..., Receiver],
    start_worker: Callable[..., WorkerProcess],
) -> None:
    """A makes its secret through the API, B has one in settings: each receiver verifies its own
    tenant's events only; the deployment secret signs neither; a rotation signs with both for a day."""
    url = redis_server.url[:-1] + "3"
    redis.Redis.from_url(url).flushdb()
    owner_b = "key-" + hashlib.sha256(b"key-b").hexdigest()[:16]
    settings = hook_settings(
        url,
        tmp_path / "genq",
        api_keys=["key-a", "key-b"],
        webhook_key_secrets=json.dumps({owner_b: B_SECRET}),
    )
    start_worker(settings, "--queues=webhooks")
    receiver = receivers()
    async with api_client(settings, "key-a") as a, api_client(settings, "key-b") as b:
        made = await a.post("/v1/webhook-secret")
        assert made.status_code == 201 and made.json()["previous_valid_for_s"] is None
        a_secret = made.json()["secret"]
        for api in (a, b):
            await api.post(f"/v1/jobs/{await submit(api, receiver.url, ['completed'])}/cancel")
        await until(lambda: len(receiver.received) == 2, what="both deliveries")
        by_owner = {r.payload["data"]["id"]: r for r in receiver.received}
        for received in by_owner.values():
            a_ok, b_ok = verifies(a_secret, received), verifies(B_SECRET, received)
            assert a_ok != b_ok  # exactly one tenant's secret verifies it
            assert not verifies(NEW_SECRET, received) and not verifies(OLD_SECRET, received)

        rotated = await a.post("/v1/webhook-secret")
        assert rotated.json()["previous_valid_for_s"] == 86_400
        await a.post(f"/v1/jobs/{await submit(a, receiver.url, ['completed'])}/cancel")
        await until(lambda: len(receiver.received) == 3, what="the delivery after rotating")
        after = receiver.received[-1]
        assert verifies(rotated.json()["secret"], after) and verifies(a_secret, after)
        assert not verifies(B_SECRET, after)


# --- durability -----------------------------------------------------------------------------------------
async def test_a_retry_survives_a_killed_worker_and_runs_once(
    redis_server: EmbeddedRedis,
    tmp_path: Path,
    receivers: Callable[..., Receiver],
    start_worker: Callable[..., WorkerProcess],
) -> None:
    """The worker holding a retry (an eta'd, unacknowledged message) is killed: the broker gives the
    message back after the visibility timeout and a new worker delivers it. The retry waits longer
    than the visibility timeout, so the broker also hands out copies while it waits: the delivery's
    claim lets exactly one of them make the attempt."""
    receiver = receivers({"job.completed": [500]})
    url = redis_server.url[:-1] + "2"
    redis.Redis.from_url(url).flushdb()
    settings = hook_settings(
        url, tmp_path / "genq", visibility_timeout_s=2, job_timeout_s=1, webhook_retry_delays_s="6"
    )
    doomed = start_worker(settings, "--queues=webhooks")
    async with api_client(settings) as api:
        job_id = await submit(api, receiver.url)
        await api.post(f"/v1/jobs/{job_id}/cancel")  # no model worker here: cancel sends completed
        await log_until(api, job_id, lambda e: len(e) == 1)
        doomed.kill()
        start_worker(settings, "--queues=webhooks")
        entries = await log_until(api, job_id, lambda e: e[-1]["outcome"] == "delivered")
        await asyncio.sleep(1.0)  # any further copy would have come due by now
        entries = await delivery_log(api, job_id)
    assert [(e["attempt"], e["status_code"], e["outcome"]) for e in entries] == [
        (1, 500, "retrying"),
        (2, 200, "delivered"),
    ]
    assert receiver.statuses == [500, 200]


async def test_a_webhook_worker_takes_waiting_deliveries_without_a_broker_delivery_each(
    redis_server: EmbeddedRedis,
    tmp_path: Path,
    receivers: Callable[..., Receiver],
    start_worker: Callable[..., WorkerProcess],
) -> None:
    """Deliveries waiting in the queue when a webhook worker starts: each is made once, and its
    two task threads take most of them from the list themselves (workers/webhooks/intake.py)
    rather than each being a Celery task of its own."""
    receiver = receivers()
    url = redis_server.url[:-1] + "3"
    redis.Redis.from_url(url).flushdb()
    settings = hook_settings(url, tmp_path / "genq")
    async with api_client(settings) as api:
        ids = [await submit(api, receiver.url, ["completed"]) for _ in range(30)]
        for job_id in ids:  # no model worker here: a cancel sends `completed`
            assert (await api.post(f"/v1/jobs/{job_id}/cancel")).status_code == 200
    worker = start_worker(settings, "--queues=webhooks", "--concurrency=2")
    await until(lambda: len(receiver.received) >= len(ids), what="every delivery")
    await asyncio.sleep(0.5)  # a second delivery of any of them would have come by now
    assert sorted(r.payload["data"]["id"] for r in receiver.received) == sorted(ids)
    log_lines = worker.log_path.read_text().splitlines()
    celery_deliveries = [line for line in log_lines if "genq.webhook.deliver[" in line and "received" in line]
    assert 0 < len(celery_deliveries) <= 10  # without the take: 30
    # Each ended as recorded (most in the round trip of their thread's next take): outcome set,
    # claim released, one log entry, out of the reaper's index.
    client = redis.Redis.from_url(url, decode_responses=True)
    for job_id in ids:
        state = client.hgetall(Delivery.of(job_id, "completed", "").key)
        assert (state["outcome"], state["lease"], client.llen(keys.webhook_log(job_id))) == (
            "delivered",
            "0",
            1,
        )
    assert client.zcard(keys.WEBHOOK_PENDING) == 0
