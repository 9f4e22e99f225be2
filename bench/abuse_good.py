"""Key B of bench.abuse, the well-behaved tenant: small jobs submitted at a steady rate (open
loop), each long-polled until it ends, with their submit and submit -> finished latencies."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from typing import Any

import httpx

from bench.common import latency_summary

B_RATE = 4.0
TERMINAL = ("succeeded", "failed", "canceled")


async def one_job(b: httpx.AsyncClient, i: int) -> dict[str, Any]:
    """One of B's jobs: submit, then long-poll until it ends (a 429 on a poll: wait and poll again)."""
    started, at = time.perf_counter(), time.monotonic()
    try:
        submitted = await b.post("/v1/jobs", json={"prompt": f"b{i}", "max_tokens": 4, "cache": False})
    except httpx.HTTPError as exc:
        return {"code": type(exc).__name__}
    outcome: dict[str, Any] = {
        "at": at,
        "code": str(submitted.status_code),
        "submit_ms": (time.perf_counter() - started) * 1000,
    }
    if submitted.status_code >= 300:
        return outcome
    job = submitted.json()
    while job["status"] not in TERMINAL and time.perf_counter() - started < 120:
        polled = await b.get(f"/v1/jobs/{job['id']}", params={"wait": 30})
        if polled.status_code == 200:
            job = polled.json()
        else:
            await asyncio.sleep(0.2)
    return {**outcome, "status": job["status"], "finish_ms": (time.perf_counter() - started) * 1000}


async def good_tenant(b: httpx.AsyncClient, stop: asyncio.Event, t0: float) -> dict[str, Any]:
    """B's load at B_RATE jobs/s (open loop: job i is due at i / B_RATE) until `stop`; with each
    accepted job's [submitted at (s since t0), submit -> finished ms] for the plot."""
    started, tasks = time.perf_counter(), list[asyncio.Task[dict[str, Any]]]()
    while not stop.is_set():
        await asyncio.sleep(max(0.0, started + len(tasks) / B_RATE - time.perf_counter()))
        if not stop.is_set():
            tasks.append(asyncio.create_task(one_job(b, len(tasks))))
    jobs = await asyncio.gather(*tasks)
    accepted = [job for job in jobs if "status" in job]
    return {
        "submitted": len(jobs),
        "codes": dict(Counter(job["code"] for job in jobs)),
        "accepted": len(accepted),
        "succeeded": sum(1 for job in accepted if job["status"] == "succeeded"),
        **latency_summary([job["submit_ms"] for job in jobs if "submit_ms" in job], "submit_"),
        **latency_summary([job["finish_ms"] for job in accepted], "finish_"),
        "finish_timeline": [[round(job["at"] - t0, 2), round(job["finish_ms"], 1)] for job in accepted],
    }
