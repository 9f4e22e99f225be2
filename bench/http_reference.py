"""End to end over HTTP: genq's API + worker against llama.cpp's llama-server, on the same GGUF model
and threads; the second half of `python -m bench.engine --reference` (bench/engine_reference.py),
which calls `compare`.

The same OpenAI chat request, 16 short prompts (bench.engine.prompts), max_tokens 64, temperature 0,
from one closed-loop client pool (bench/loadgen.py: C keep-alive connections, each sending its next
request when its last one returns) at C = 1 and 16, to
  - genq's /v1/chat/completions: Redis + one `genq api` + one `genq worker` on the default model
    (the llama.cpp backend), GENQ_TORCH_THREADS=threads, 16 rows (max_batch_size) of 2048 cells:
    its defaults, but the response cache off (it would answer the repeated prompts from memory);
  - the same with GENQ_LLAMACPP_PREFIX_CACHE=false (every prompt prefilled whole): the baseline that
    shows what genq's prefix cache gives, in the same run;
  - `llama-server -m GGUF -t threads -np 16 -c 32768` (16 slots of 2048 cells): its defaults, which
    keep each slot's prompt cache (a prompt sharing a prefix with the slot's last one skips that
    part of its prefill).
Both servers stay up, and the load goes to one at a time; each run reports the CPU seconds the idle
server used meanwhile, which shows it did not compete. Per side and C: completion tokens over the
run's wall time, latency p50/p99, and genq's ratios; two rounds, the order flipped in the second.
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from bench.common import (
    BENCH_SETTINGS,
    ServiceExited,
    bench_stack,
    cpu_seconds,
    host_busy_cpu_s,
    latency_summary,
    print_table,
    process_tree,
    run_async,
    start_api,
    start_http,
    start_redis,
    start_worker,
)
from bench.engine import prompts
from bench.llamacpp_reference import REPACK_CRASHED, Reference
from bench.loadgen import closed_loop, json_post
from workers.engine.config import EngineConfig
from workers.engine.llamacpp.model import gguf_file

SIDES = ("genq", "genq_whole_prefill", "llama_server")
PROMPTS = 16
MAX_TOKENS = 64
#: Slots (llama-server -np) and rows (genq's max_batch_size), and each one's KV cells.
SLOTS = 16
SLOT_TOKENS = 2048
TIMEOUT_S = 600


@dataclass(frozen=True)
class Sizes:
    #: (clients, requests) per run.
    runs: tuple[tuple[int, int], ...]
    rounds: int
    max_tokens: int


FULL = Sizes(((1, 16), (16, 64)), 2, MAX_TOKENS)
QUICK = Sizes(((1, 2), (4, 4)), 1, 8)


def chat_requests(model: str, count: int, max_tokens: int) -> list[bytes]:
    """`count` requests cycling through the PROMPTS prompts."""
    texts = prompts(PROMPTS)
    bodies = [
        {"model": model, "messages": [{"role": "user", "content": texts[index % PROMPTS]}],
         "max_tokens": max_tokens, "temperature": 0}
        for index in range(count)
    ]  # fmt: skip
    return [json_post("/v1/chat/completions", orjson.dumps(body)) for body in bodies]


def run_load(
    port: int, requests: list[bytes], clients: int, active_pids: list[int], idle_pids: list[int]
) -> dict[str, Any]:
    """One closed-loop run: completion tokens per second, latencies, the CPU of the server under load,
    of the idle one, and of everything else on the host (neither server nor this load generator)."""
    busy, mine = host_busy_cpu_s(), time.process_time()
    active, idle = cpu_seconds(active_pids), cpu_seconds(idle_pids)
    result = run_async(closed_loop("127.0.0.1", port, requests, clients, TIMEOUT_S, keep_bodies=True))
    active, idle = cpu_seconds(active_pids) - active, cpu_seconds(idle_pids) - idle
    others = host_busy_cpu_s() - busy - active - idle - (time.process_time() - mine)
    ok = [reply for reply in result.replies if reply.status == 200]
    completion = [orjson.loads(reply.body)["usage"]["completion_tokens"] for reply in ok]
    latencies = result.latencies_ms()
    return {
        "clients": clients,
        "requests": len(requests),
        "succeeded": len(completion),
        "failed_or_unfinished": len(requests) - len(completion),
        "completion_tokens": sum(completion),
        "wall_s": round(result.duration_s, 3),
        "tokens_per_s": round(sum(completion) / result.duration_s, 2) if result.duration_s else 0.0,
        "latency_p50_ms": latency_summary(latencies)["p50_ms"],
        "latency_p99_ms": latency_summary(latencies)["p99_ms"],
        "server_cpu_s": round(active, 2),
        "idle_server_cpu_s": round(idle, 2),
        "others_cpu_s": round(others, 2),
    }


def start_genq(
    stack: ExitStack, scratch: Path, config: EngineConfig, threads: int, prefix_cache: bool = True
) -> tuple[int, list[int]]:
    """Redis, one worker on config.model (the llama.cpp backend) and one API; the API's port and the pids."""
    name = "" if prefix_cache else "-whole-prefill"
    redis = start_redis(stack, scratch / f"redis{name}")
    assert redis.process is not None
    settings = {
        **BENCH_SETTINGS,
        "REDIS_URL": redis.url,
        "DATA_DIR": str(scratch / "genq"),
        "MODEL": config.model,
        "MODEL_CACHE": str(config.model_cache.resolve()),
        "TORCH_THREADS": str(threads),
        "ENGINE_BACKEND": "llamacpp",
        "MAX_BATCH_SIZE": str(SLOTS),
        "LLAMACPP_SEQUENCE_TOKENS": str(SLOT_TOKENS),
        "LLAMACPP_PREFIX_CACHE": str(prefix_cache).lower(),
        "LLAMACPP_KV_CELLS": config.llamacpp_kv_cells,
        "CACHE_ENABLED": "false",
        "MAX_WAIT_S": "300",
    }
    worker = start_worker(stack, f"worker{name}", settings, scratch)
    api, port = start_api(stack, f"api{name}", settings, scratch)
    return port, [redis.process.pid, worker.process.pid, api.process.pid]


def start_llama_server(
    stack: ExitStack, scratch: Path, reference: Reference, gguf: Path, threads: int, report: dict[str, Any]
) -> tuple[int, list[int]]:
    """llama-server with its defaults; when those are killed by a signal as it starts (its
    repacked weight kernels on some CPUs), with -nr, saying so in `report` (llama_server_fallback)."""
    argv = [str(reference.server), "-m", str(gguf), "-t", str(threads), "-np", str(SLOTS),
            "-c", str(SLOTS * SLOT_TOKENS), "--host", "127.0.0.1"]  # fmt: skip
    try:
        server, port = start_http(stack, "llama-server", argv, dict(os.environ), scratch, "/health")
    except ServiceExited as exc:
        if exc.returncode >= 0:
            raise
        report["llama_server_fallback"] = REPACK_CRASHED.format(code=exc.returncode)
        print(report["llama_server_fallback"])
        server, port = start_http(
            stack, "llama-server-nr", [*argv, "-nr"], dict(os.environ), scratch, "/health"
        )
    return port, [server.process.pid]


def compare(reference: Reference | None, config: EngineConfig, threads: int, quick: bool) -> dict[str, Any]:
    """Both servers up; each run on one side, then the other (see the module docstring)."""
    sizes = QUICK if quick else FULL
    gguf = gguf_file(config.model)
    assert gguf is not None
    report: dict[str, Any] = {
        "prompts": PROMPTS,
        "max_tokens": sizes.max_tokens,
        "temperature": 0,
        "slots": SLOTS,
        "slot_tokens": SLOT_TOKENS,
        "rounds": [],
    }
    with bench_stack("http_reference") as (stack, scratch):
        servers = {
            "genq": start_genq(stack, scratch, config, threads),
            "genq_whole_prefill": start_genq(stack, scratch, config, threads, prefix_cache=False),
        }
        if reference is not None:
            servers["llama_server"] = start_llama_server(stack, scratch, reference, gguf, threads, report)
        report["llama_server_argv"] = _argv_of(servers.get("llama_server"))
        trees = {side: [p for pid in pids for p in process_tree(pid)] for side, (_, pids) in servers.items()}
        for port, _ in servers.values():  # warm-up: two requests each
            run_load(port, chat_requests(config.model, 2, sizes.max_tokens), 2, [], [])
        for number in range(sizes.rounds):
            order = list(servers) if number % 2 == 0 else list(reversed(servers))
            report["rounds"].append(one_round(servers, trees, order, config.model, sizes))
    report["medians"] = _medians(report["rounds"], sizes)
    return report


def _argv_of(server: tuple[int, list[int]] | None) -> list[str] | None:
    if server is None:
        return None
    return Path(f"/proc/{server[1][0]}/cmdline").read_bytes().decode().strip("\0").split("\0")


def one_round(
    servers: dict[str, tuple[int, list[int]]],
    trees: dict[str, list[int]],
    order: list[str],
    model: str,
    sizes: Sizes,
) -> list[dict[str, Any]]:
    runs = []
    for clients, count in sizes.runs:
        row: dict[str, Any] = {"clients": clients}
        for side in order:
            idle = [pid for other, tree in trees.items() if other != side for pid in tree]
            requests = chat_requests(model, count, sizes.max_tokens)
            row[side] = run_load(servers[side][0], requests, clients, trees[side], idle)
            print(f"  HTTP C={clients} {side}: {orjson.dumps(row[side]).decode()}", file=sys.stderr)
        runs.append(row | _ratios(row))
    return runs


def _ratios(row: dict[str, Any]) -> dict[str, float | None]:
    if "llama_server" not in row:
        return {}
    genq, whole, llama = row["genq"], row["genq_whole_prefill"], row["llama_server"]
    return {
        "tokens_per_s_ratio": round(genq["tokens_per_s"] / llama["tokens_per_s"], 3),
        "latency_p50_ratio": round(genq["latency_p50_ms"] / llama["latency_p50_ms"], 3),
        "latency_p99_ratio": round(genq["latency_p99_ms"] / llama["latency_p99_ms"], 3),
        "whole_prefill_tokens_per_s_ratio": round(whole["tokens_per_s"] / llama["tokens_per_s"], 3),
    }


def _medians(rounds: list[list[dict[str, Any]]], sizes: Sizes) -> list[dict[str, Any]]:
    out = []
    for index, (clients, _) in enumerate(sizes.runs):
        rows = [round_[index] for round_ in rounds]
        row: dict[str, Any] = {"clients": clients}
        for side in SIDES:
            if side in rows[0]:
                row[side] = {key: round(statistics.median(r[side][key] for r in rows), 2) for key in SHOWN}
        out.append(row | _ratios(row))
    return out


#: What the medians table shows per side.
SHOWN = ("tokens_per_s", "latency_p50_ms", "latency_p99_ms")
#: What each round's table shows per side.
SHOWN_PER_ROUND = (*SHOWN, "completion_tokens", "failed_or_unfinished", "server_cpu_s", "idle_server_cpu_s",
                   "others_cpu_s")  # fmt: skip


def print_tables(report: dict[str, Any]) -> None:
    sides = [side for side in SIDES if side in report["medians"][0]]
    columns = ["C", *(f"{side} {key}" for side in sides for key in SHOWN), "genq / llama tok/s",
               "whole-prefill genq / llama tok/s"]  # fmt: skip
    ratios = ("tokens_per_s_ratio", "whole_prefill_tokens_per_s_ratio")
    rows = [
        [row["clients"], *(row[side][key] for side in sides for key in SHOWN), *(row.get(r) for r in ratios)]
        for row in report["medians"]
    ]
    title = f"HTTP /v1/chat/completions, max_tokens {report['max_tokens']}"
    print_table(f"{title}, median of {len(report['rounds'])} rounds", columns, rows)
    for number, round_ in enumerate(report["rounds"], 1):
        columns = ["C", *(f"{side} {key}" for side in sides for key in SHOWN_PER_ROUND)]
        rows = [
            [row["clients"], *(row[side][key] for side in sides for key in SHOWN_PER_ROUND)] for row in round_
        ]
        print_table(f"HTTP round {number}", columns, rows)


def plot_axis(report: dict[str, Any], axis: Any) -> None:
    """genq's and llama-server's tokens/s per C on one matplotlib axis."""
    medians = report["medians"]
    sides = [side for side in SIDES if side in medians[0]]
    width = 0.8 / len(sides)
    for offset, (side, color) in enumerate(zip(sides, ("#4c72b0", "#8fa9d6", "#dd8452"), strict=False)):
        positions = [index + (offset - (len(sides) - 1) / 2) * width for index in range(len(medians))]
        axis.bar(
            positions, [row[side]["tokens_per_s"] for row in medians], width=width, color=color, label=side
        )
    axis.set_xticks(range(len(medians)), [str(row["clients"]) for row in medians])
    title = f"HTTP chat completions, median of {len(report['rounds'])}"
    axis.set(xlabel="concurrent clients", ylabel="completion tokens/s", title=title)
    axis.legend(fontsize=8)
