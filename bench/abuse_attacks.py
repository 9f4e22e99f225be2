"""Key A's attacks for bench.abuse: every hole of the files, batches, schemas and full-Redis
issue as a request builder, and the attacker process that runs them in loops and records each
answer's status code and latency.

The attacker runs in its own process, niced, so its client CPU (building 30 MiB bodies, JSON of
megabytes) is not measured as the server's and does not delay key B's clock in the main process.
Each attack variant sends one request at a time with a short pause: the benchmark measures what a
request costs the service (amplification), not a flood of cheap ones.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import httpx

from bench.common import latency_summary

KEY_A, KEY_B = "abuse-tenant-a-key", "abuse-tenant-b-key"
MODEL = "placeholder-echo"
#: A model no worker serves: A's seeded and filler jobs stay queued, costing no worker time.
IDLE_MODEL = "nobody-serves-this"
CHAT = "/v1/chat/completions"
UNRESOLVABLE_WEBHOOK = "http://genq-abuse.invalid/hook"
MiB = 1 << 20
#: A metadata value of 512 four-byte characters: the most bytes a value may carry.
WIDE = "\U0001d518" * 512
BIG_METADATA = {f"{chr(0x1D400 + i)}" * 64: WIDE for i in range(16)}


def costly_schema(salt: str = "") -> dict[str, Any]:
    """~3.5 KB of allOf of five anyOf of five objects: llguidance expands the product of the
    branches, so one compile costs a fraction of a second (checked offline by
    bench.abuse's schema_compile_s). `salt` renames properties, so no cache keyed by the
    schema's text or hash can answer a hostile tenant's next one."""
    branches = []
    for i in range(5):
        options = []
        for j in range(5):
            names = [f"p{i}{j}0{salt}", f"p{i}{j}1"]
            options.append(
                {
                    "type": "object",
                    "properties": {n: {"type": "string"} for n in names},
                    "required": names[:1],
                }
            )
        branches.append({"anyOf": options})
    return {"type": "object", "allOf": branches}


def response_format(salt: str) -> dict[str, Any]:
    return {"type": "json_schema", "json_schema": {"name": "abuse", "schema": costly_schema(salt)}}


def chat_line(custom_id: str, fmt: dict[str, Any] | None = None, content: str = "hi") -> bytes:
    body: dict[str, Any] = {
        "model": MODEL,
        "messages": [{"role": "user", "content": content}],
        "max_tokens": 4,
    }
    if fmt is not None:
        body["response_format"] = fmt
    return json.dumps({"custom_id": custom_id, "method": "POST", "url": CHAT, "body": body}).encode() + b"\n"


def batch_files(cap_bytes: int, quick: bool) -> dict[str, bytes]:
    """The batch input files of attacks (3)-(5): a schema on every line, one 8 MiB line, a file of
    no newline just under the cap, and refused lines with long urls (used by several batches)."""
    schema_lines = b"".join(chat_line(f"s{i}", response_format(f"s{i}")) for i in range(6 if quick else 20))
    huge_line = chat_line("huge", content="x" * (8 * MiB))
    url = "/v1/" + "u" * 60_000
    refused = json.dumps({"custom_id": "r", "method": "POST", "url": url, "body": {}}).encode() + b"\n"
    refused_count = (2 * MiB if quick else cap_bytes - MiB) // len(refused)
    return {
        "schema_lines": schema_lines,
        "one_8mib_line": huge_line,
        "no_newline_under_cap": b"x" * (cap_bytes - 64 * 1024),
        "refused_long_urls": refused * refused_count,
    }


async def multipart(payload_bytes: int, name: str = "f.jsonl") -> AsyncIterator[bytes]:
    """A multipart/form-data body streamed chunk by chunk (no Content-Length: chunked encoding)."""
    yield (
        f'--B\r\nContent-Disposition: form-data; name="purpose"\r\n\r\nbatch\r\n--B\r\n'
        f'Content-Disposition: form-data; name="file"; filename="{name}"\r\n'
        "Content-Type: application/octet-stream\r\n\r\n"
    ).encode()
    chunk = b"x" * (256 * 1024)
    for _ in range(payload_bytes // len(chunk)):
        yield chunk
    yield b"\r\n--B--\r\n"


MULTIPART = {"Content-Type": "multipart/form-data; boundary=B"}


@dataclass
class Record:
    """Every answer of every attack variant: status codes (or a transport error's name), latencies."""

    codes: dict[str, Counter[str]] = field(default_factory=dict)
    latencies: dict[str, list[float]] = field(default_factory=dict)

    def add(self, variant: str, code: str, ms: float) -> None:
        self.codes.setdefault(variant, Counter())[code] += 1
        self.latencies.setdefault(variant, []).append(ms)

    def report(self) -> dict[str, Any]:
        return {
            variant: {
                "requests": sum(codes.values()),
                "codes": dict(sorted(codes.items())),
                **latency_summary(self.latencies[variant]),
            }
            for variant, codes in sorted(self.codes.items())
        }


Request = Callable[[httpx.AsyncClient], Awaitable[httpx.Response]]


async def timed(record: Record, variant: str, client: httpx.AsyncClient, request: Request) -> int | None:
    started = time.perf_counter()
    try:
        code: str = str((response := await request(client)).status_code)
    except httpx.HTTPError as exc:
        code, response = type(exc).__name__, None
    record.add(variant, code, (time.perf_counter() - started) * 1000)
    return None if response is None else response.status_code


async def loop(
    record: Record, variant: str, client: httpx.AsyncClient, request: Request, until: float, pause_s: float
) -> None:
    while time.monotonic() < until:
        await timed(record, variant, client, request)
        await asyncio.sleep(pause_s)


def job(salt: str = "", **fields: Any) -> dict[str, Any]:
    return {"prompt": f"a{salt}", "max_tokens": 4, "cache": False, **fields}


def chat(content: str, **fields: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": [{"role": "user", "content": content}], "max_tokens": 4, **fields}


def salt() -> str:
    return f"{random.getrandbits(48):x}"


def post(path: str, body: Callable[[], dict[str, Any]]) -> Request:
    """A POST of a JSON body built afresh for each request (a new salt each time)."""
    return lambda client: client.post(path, json=body())


def upload(size: int) -> Request:
    return lambda client: client.post("/v1/files", content=multipart(size), headers=MULTIPART)


def costly_job() -> dict[str, Any]:
    return job(response_format=response_format(salt()))


def costly_chat() -> dict[str, Any]:
    return chat("a", response_format=response_format(salt()))


def raw_chat(body: bytes) -> Request:
    return lambda client: client.post(CHAT, content=body, headers={"Content-Type": "application/json"})


def phase2_requests(file_ids: dict[str, str]) -> dict[str, tuple[bool, Request, float]]:
    """Attack variant -> (with A's key?, the request, pause between requests in s)."""
    surrogate = b'{"model":"%s","messages":[{"role":"user","content":"a\\ud800b"}]}' % MODEL.encode()
    listing: Request = lambda client: client.get("/v1/jobs", params={"status": "queued", "limit": 100})  # noqa: E731
    requests: dict[str, tuple[bool, Request, float]] = {
        "1_upload_30mib_chunked_no_key": (False, upload(30 * MiB), 0.5),
        "1_upload_30mib_chunked_over_cap": (True, upload(30 * MiB), 0.5),
        "2_schema_jobs_no_key": (False, post("/v1/jobs", costly_job), 0.05),
        "2_schema_chat_no_key": (False, post(CHAT, costly_chat), 0.05),
        "2_schema_jobs_key": (True, post("/v1/jobs", costly_job), 0.2),
        "2_schema_chat_key": (True, post(CHAT, costly_chat), 0.2),
        "3_upload_64mib_no_newline": (True, upload(64 * MiB), 1.0),
        "4_n16": (True, post("/v1/jobs", lambda: job(salt(), n=16, max_tokens=16)), 0.3),
        "4_best_of16": (True, post("/v1/jobs", lambda: job(salt(), best_of=16, max_tokens=16)), 0.3),
        "5_webhook_unresolvable": (
            True,
            post("/v1/jobs", lambda: job(salt(), webhook=UNRESOLVABLE_WEBHOOK)),
            0.1,
        ),
        "6_chat_over_200k_chars": (True, post(CHAT, lambda: chat("x" * 200_001)), 0.2),
        "6_chat_lone_surrogate": (True, raw_chat(surrogate), 0.2),
        "7_list_queued_big_metadata": (True, listing, 0.1),
    }
    for name, file_id in file_ids.items():
        requests[f"3_batch_{name}"] = (True, post("/v1/batches", partial(batch_body, file_id)), 1.0)
    return requests


def batch_body(file_id: str) -> dict[str, Any]:
    return {"input_file_id": file_id, "endpoint": CHAT, "completion_window": "24h"}


async def cancel_batches(a: httpx.AsyncClient) -> None:
    """A's batches end with the phase, so the next phase measures what it says."""
    listed = await a.get("/v1/batches", params={"limit": 100})
    if listed.status_code != 200:
        return
    for batch in listed.json()["data"]:
        if batch["status"] in ("validating", "in_progress"):
            await a.post(f"/v1/batches/{batch['id']}/cancel")


async def run_phase2(base: str, plan: tuple[dict[str, str], str], duration_s: float) -> dict[str, Any]:
    """Every attack variant whose name starts with one of the comma-separated prefixes of the
    plan's second part (all when empty) in its own loop for duration_s."""
    file_ids, only = plan
    chosen = {name: attack for name, attack in phase2_requests(file_ids).items()
              if not only or name.startswith(tuple(only.split(",")))}  # fmt: skip
    record = Record()
    until = time.monotonic() + duration_s
    limits = httpx.Limits(max_connections=100)
    async with (
        httpx.AsyncClient(base_url=base, timeout=60, limits=limits) as anonymous,
        httpx.AsyncClient(
            base_url=base, timeout=60, limits=limits, headers={"Authorization": f"Bearer {KEY_A}"}
        ) as a,
    ):
        tasks = [
            asyncio.create_task(loop(record, name, a if keyed else anonymous, request, until, pause))
            for name, (keyed, request, pause) in chosen.items()
        ]
        # A request in flight at the deadline may finish (its answer counts), within a grace period.
        await asyncio.wait(tasks, timeout=duration_s + 30)
        for task in tasks:
            task.cancel()
        await cancel_batches(a)
    report = record.report()
    for name, (keyed, _, pause) in chosen.items():
        report.setdefault(name, {"requests": 0, "codes": {}}).update(with_key=keyed, pause_s=pause)
    return report


async def run_fill(base: str, limit_s: float) -> dict[str, Any]:
    """Attack (8): jobs of ~0.9 MB (four messages of 200,000 characters and the widest metadata)
    for the idle model until the API answers 503, then stop."""
    record = Record()
    body = {
        "model": IDLE_MODEL,
        "messages": [{"role": "user", "content": "f" * 200_000}] * 4,
        "max_tokens": 1,
        "metadata": BIG_METADATA,
    }
    encoded = json.dumps(body).encode()
    headers = {"Authorization": f"Bearer {KEY_A}", "Content-Type": "application/json"}
    started = time.monotonic()
    first_503_s: float | None = None
    async with httpx.AsyncClient(base_url=base, timeout=60, headers=headers) as a:
        while time.monotonic() - started < limit_s:
            code = await timed(record, "8_fill_redis", a, lambda c: c.post("/v1/jobs", content=encoded))
            if code == 503:
                first_503_s = round(time.monotonic() - started, 2)
                break
            if code == 429:  # A's submit bucket: wait for its refill, as a client told Retry-After would
                await asyncio.sleep(0.1)
    return {"attacks": record.report(), "first_503_s": first_503_s, "job_bytes": len(encoded)}


def attacker(mode: str, arg: Any, base: str, duration_s: float, out: str) -> None:
    """The attacker process's entry point (multiprocessing, spawn): run `mode` ("phase2", `arg`
    the batch files' ids and the attacks chosen, or "fill"), marking `out`.started when it
    begins; its report as JSON to `out`."""
    os.nice(10)
    Path(f"{out}.started").touch()
    coroutine = run_phase2(base, arg, duration_s) if mode == "phase2" else run_fill(base, duration_s)
    Path(out).write_text(json.dumps(asyncio.run(coroutine)))
