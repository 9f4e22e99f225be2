"""Hostile tenant, every attack at once: key A runs each hole of the files, batches, schemas and
full-Redis issue in a loop while well-behaved key B submits small jobs and long-polls them.

    python -m bench.abuse            # 30 s of B alone, 75 s under attack, then A fills Redis (~3 min)
    python -m bench.abuse --quick    # a few seconds of each: a smoke test

One real `genq api` process (its TMPDIR a fresh folder, so the bytes it spools are measured), one
real worker on the placeholder model and a private Redis with a maxmemory (noeviction), so a full
Redis is reached without touching the host's memory. Both keys have the default rate limits and
quotas; the upload cap is FILE_MAX_MB (the 30 MiB uploads are over it).
- Phase `alone`: B submits at B_RATE jobs/s, each long-polled until it ends; /healthz is probed
  every 50 ms from a process of its own.
- Phase `attack`: the same, while A (its own process, niced) runs attacks (1)-(7) of
  bench/abuse_attacks.py, each one request at a time in a loop, recording every status code.
- Phase `full_redis`: A submits ~0.9 MB jobs until the API answers 503, then stops; B goes on.
Measured: B's submit and submit -> finished p50/p99 per phase and their attack/alone ratios
(target <= 1.5x), /healthz p99 and max under attack (target < 100 ms), every accepted B job
succeeded, API and worker alive with the same pids, their peak RSS, the API's peak temp bytes,
file storage bytes and Redis used_memory (sampled every 100 ms).
Writes <out>/abuse.json and <out>/abuse.png.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx
import redis

from bench.abuse_attacks import BIG_METADATA, IDLE_MODEL, KEY_A, KEY_B, MODEL, attacker, batch_files
from bench.abuse_good import B_RATE, good_tenant, one_job
from bench.abuse_report import plot, print_tables, targets
from bench.abuse_watch import Monitor, probe_healthz, probe_summary
from bench.common import (
    bench_stack,
    machine,
    parse_args,
    process_tree,
    run_async,
    service_env,
    start_http,
    start_redis,
    start_worker,
    write_report,
)

FILE_MAX_MB = 16
#: (alone s, attack s, most s the fill may take, metadata jobs seeded for the list attack, Redis MB)
FULL = (30.0, 75.0, 90.0, 300, 256)
QUICK = (4.0, 6.0, 20.0, 40, 64)
SPAWN = multiprocessing.get_context("spawn")


def abuse_settings(redis_url: str, data_dir: str) -> dict[str, str]:
    """Defaults but for the model, the upload cap and what a benchmark must not share with the host."""
    return {
        "REDIS_URL": redis_url,
        "DATA_DIR": data_dir,
        "MODEL": MODEL,
        "MODELS": IDLE_MODEL,
        "API_KEYS": f"{KEY_A},{KEY_B}",
        "FILE_MAX_BYTES": str(FILE_MAX_MB << 20),
        "PLACEHOLDER_STEP_S": "0.002",
        "WORKER_METRICS_PORT": "0",
        "LOG_LEVEL": "WARNING",
    }


def schema_compile_s() -> float:
    """Seconds one compile of bench.abuse_attacks' costly schema takes here (the issue's ~0.5 s)."""
    from bench.abuse_attacks import costly_schema
    from shared.structured import schema_error

    started = time.perf_counter()
    schema_error(costly_schema("offline"))
    return round(time.perf_counter() - started, 3)


def wait_for_file(path: Path, process: Any, limit_s: float = 60.0) -> None:
    """Until the attacker process marks that it began (or exits): its start-up is not attack time."""
    deadline = time.monotonic() + limit_s
    while not path.exists() and process.is_alive() and time.monotonic() < deadline:
        time.sleep(0.05)


async def phase(
    port: int,
    b: httpx.AsyncClient,
    scratch: Path,
    name: str,
    seconds: float,
    attack: tuple[str, Any] | None,
    t0: float,
) -> dict[str, Any]:
    """B's load and the /healthz probe for `seconds`, with A's attack process running when given
    (a fill phase lasts until the attacker stops, then B goes on for 2 s)."""
    base, started_file = f"http://127.0.0.1:{port}", scratch / f"{name}.attack.started"
    attacks = None
    if attack is not None:
        attacks = SPAWN.Process(
            target=attacker, args=(*attack, base, seconds, str(scratch / f"{name}.attack"))
        )
        attacks.start()
        await asyncio.to_thread(wait_for_file, started_file, attacks)
    stop, probe_stop = asyncio.Event(), SPAWN.Event()
    probe = SPAWN.Process(target=probe_healthz, args=(port, seconds + 120, probe_stop, str(scratch / name)))
    probe.start()
    began = time.monotonic()
    load = asyncio.create_task(good_tenant(b, stop, t0))
    if attack is not None and attack[0] == "fill":
        assert attacks is not None
        await asyncio.to_thread(attacks.join)
        await asyncio.sleep(2.0)
    else:
        await asyncio.sleep(seconds)
    stop.set()
    probe_stop.set()
    window = [round(began - t0, 1), round(time.monotonic() - t0, 1)]
    result = {"window_s": window, "b": await load}
    await asyncio.to_thread(probe.join)
    result["healthz"] = probe_summary(json.loads((scratch / name).read_text()), window[0])
    if attacks is not None:
        await asyncio.to_thread(attacks.join)
        result["a"] = json.loads((scratch / f"{name}.attack").read_text())
    return result


async def settle(b: httpx.AsyncClient, limit_s: float = 60.0) -> float:
    """Seconds until ten /healthz in a row answer within 20 ms (at most limit_s): the last phase's
    aftermath (a batch still validating, a spooled upload) is not counted in the next phase."""
    started, in_a_row = time.monotonic(), 0
    while in_a_row < 10 and time.monotonic() - started < limit_s:
        asked = time.perf_counter()
        await b.get("/healthz")
        in_a_row = in_a_row + 1 if time.perf_counter() - asked < 0.02 else 0
        await asyncio.sleep(0.05)
    return round(time.monotonic() - started, 1)


async def prepare(a: httpx.AsyncClient, seeds: int) -> tuple[dict[str, str], dict[str, Any]]:
    """A's batch input files uploaded once (used by the batch attacks), and `seeds` queued jobs with
    the widest metadata for the list attack (A's submit bucket refills meanwhile)."""
    file_ids, uploads = {}, {}
    for name, content in batch_files(FILE_MAX_MB << 20, seeds < 100).items():
        uploaded = await a.post(
            "/v1/files", files={"file": (f"{name}.jsonl", content)}, data={"purpose": "batch"}
        )
        uploads[name] = uploaded.status_code
        if uploaded.status_code == 200:
            file_ids[name] = uploaded.json()["id"]
    seeded, deadline = 0, time.monotonic() + 60
    while seeded < seeds and time.monotonic() < deadline:
        body = {"prompt": "seed", "model": IDLE_MODEL, "metadata": BIG_METADATA}
        answer = await a.post("/v1/jobs", json=body)
        seeded += answer.status_code < 300
        if answer.status_code == 429:
            await asyncio.sleep(0.2)
    return file_ids, {"uploads": uploads, "metadata_jobs_seeded": seeded}


async def run_phases(
    port: int, scratch: Path, durations: tuple[float, float, float, int, int], t0: float, only: str
) -> dict[str, Any]:
    alone_s, attack_s, fill_s, seeds, _ = durations
    base = f"http://127.0.0.1:{port}"
    as_a, as_b = ({"Authorization": f"Bearer {key}"} for key in (KEY_A, KEY_B))
    async with (
        httpx.AsyncClient(base_url=base, headers=as_a, timeout=120) as a,
        httpx.AsyncClient(
            base_url=base, headers=as_b, timeout=120, limits=httpx.Limits(max_connections=200)
        ) as b,
    ):
        file_ids, setup = await prepare(a, seeds)
        for i in range(5):  # warm-up: first requests pay imports and connection set-up
            await one_job(b, -1 - i)
        runs = {
            "alone": (alone_s, None),
            "attack": (attack_s, ("phase2", (file_ids, only))),
            "full_redis": (fill_s, ("fill", None)),
        }
        phases = {}
        for name, (seconds, attack) in runs.items():
            settle_s = await settle(b)
            phases[name] = {
                "settled_after_s": settle_s,
                **await phase(port, b, scratch, name, seconds, attack, t0),
            }
    return {"setup": setup, "phases": phases}


def processes_state(services: dict[str, Any], before: dict[str, list[int]]) -> dict[str, Any]:
    """Each service: still running, and every pid of its process tree at the start still in it
    (children it started since, such as a pool of its own, are listed, not counted against it)."""
    state = {}
    for name, service in services.items():
        alive = service.process.poll() is None
        now = process_tree(service.process.pid) if alive else []
        state[name] = {
            "alive": alive,
            "exit_code": service.process.returncode,
            "same_pids": alive and set(before[name]) <= set(now),
            "pids_at_start": before[name],
            "pids_at_end": sorted(now),
        }
    return state


def start_stack(stack: Any, scratch: Path, redis_mb: int) -> tuple[dict[str, Any], int, Monitor]:
    server = start_redis(stack, scratch / "redis")
    client = redis.Redis.from_url(server.url)
    client.config_set("maxmemory", f"{redis_mb}mb")
    client.config_set("maxmemory-policy", "noeviction")
    client.close()
    settings = abuse_settings(server.url, str(scratch / "genq"))
    worker = start_worker(stack, "worker", settings, scratch)
    temp_dir = scratch / "api-tmp"
    temp_dir.mkdir()
    env = {**service_env(settings), "TMPDIR": str(temp_dir)}
    api, port = start_http(stack, "api", [sys.executable, "-m", "cli.main", "api"], env, scratch, "/healthz")
    assert server.process is not None
    pids = (api.process.pid, worker.process.pid, server.process.pid)
    monitor = Monitor(*pids, str(temp_dir), scratch / "genq" / "files", server.url)
    return {"api": api, "worker": worker}, port, monitor


def options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--attacks", default="", help="only the attacks whose names start with one of "
                        "these comma-separated prefixes (e.g. 2_,4_n16), to find which one costs B; "
                        "default: all")  # fmt: skip
    parser.add_argument("--phase-seconds", default=None, metavar="ALONE,ATTACK",
                        help="phases `alone` and `attack` in s (default 30,75; --quick 4,6)")  # fmt: skip


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    args = parse_args(__doc__, "abuse", argv, more=options)
    durations = QUICK if args.quick else FULL
    if args.phase_seconds is not None:
        alone_s, attack_s = (float(value) for value in args.phase_seconds.split(","))
        durations = (alone_s, attack_s, *durations[2:])
    report: dict[str, Any] = {
        "quick": args.quick,
        "machine": machine(),
        "schema_compile_s": schema_compile_s(),
        "settings": {
            "file_max_mb": FILE_MAX_MB,
            "redis_maxmemory_mb": durations[4],
            "b_jobs_per_s": B_RATE,
            "rate_limits": "defaults",
            "attacks": args.attacks or "all",
        },
    }
    with bench_stack("abuse") as (stack, scratch):
        services, port, monitor = start_stack(stack, scratch, durations[4])
        before = {name: sorted(process_tree(service.process.pid)) for name, service in services.items()}
        monitor.start()
        try:
            report.update(run_async(run_phases(port, scratch, durations, monitor.t0, args.attacks)))
        finally:
            monitor.stop()
        report["processes"] = processes_state(services, before)
        report["resources"] = monitor.peaks()
        for result in report["phases"].values():
            result["peaks"] = monitor.peaks(tuple(result["window_s"]))
            result["cpu"] = monitor.cpu_percent(tuple(result["window_s"]))
        report["samples"] = [sample[:6] for sample in monitor.samples[::5]]  # every 0.5 s, for the plot
    report["targets"] = targets(report)
    print_tables(report)
    write_report(args.out, "abuse", report, plot)
    return report


if __name__ == "__main__":
    main()
