"""Engine benchmark: sequential `transformers.generate` against the continuous-batching engine.

    python -m bench.engine            # the default model, fp32, CPU (~3-4 minutes on 2 cores)
    python -m bench.engine --quick    # random-tiny, a few tokens: a smoke test that takes seconds
    python -m bench.engine --device cuda --model PATH   # on a GPU (dtype: bf16 where supported)
    python -m bench.engine --structured-only   # only the structured-output row: engine_structured.json
    python -m bench.engine --backends   # llama.cpp, then torch, one GGUF model: engine_llamacpp.json
    python -m bench.engine --reference  # against llama.cpp's own tools: engine_reference.json

Same prompts (chat-templated), same machine, same process, same torch threads, one run. Every job
generates exactly --tokens tokens (ignore_eos, and min_new_tokens for generate), so both sides do the
same work. Reports output tokens/s, time to first token (from submit) p50/p99 and per-job latency
p50/p99 at each concurrency (closed loop: N clients, each submitting its next job when the last one
returns), the ratios to the baseline, peak RSS, and a 16-token job submitted while 256-token jobs
run against the same job alone, and (the structured row) tokens/s with a JSON schema enforced
against the same jobs without one at concurrency 16, with the mask's cost per decode step. Writes
<out>/engine.json and <out>/engine.png.

--backends runs the same closed-loop sweep on each engine backend (EngineConfig.backend) over the same
GGUF model, llama.cpp first (so its resident memory is measured before torch's model is loaded), in
two rounds, and reports llama.cpp's tokens/s, time to first token and job latency as ratios to
torch's at each concurrency (per round, and their medians). Writes <out>/engine_llamacpp.json and .png.

--reference runs genq's llama.cpp backend (engine and API) side by side with llama.cpp's own
llama-batched-bench and llama-server, built once from the sources llama-cpp-python vendors: see
bench/engine_reference.py. Writes <out>/engine_reference.json and .png.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import platform
import queue
import resource
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, cast

import torch

from bench.common import parse_args, percentile, write_report
from workers.engine import GenerationRequest, SamplingParams, StepStats, build_engine
from workers.engine.config import DEFAULT_MODEL, KV_CELL_TYPES, RANDOM_MODEL, EngineConfig
from workers.engine.local import LocalEngine
from workers.engine.torch.loading import LoadedModel, load_model

TOPICS = [
    "the moon",
    "how bread rises",
    "why the sky is blue",
    "a cat who learns to swim",
    "the history of the bicycle",
    "how vaccines train the immune system",
    "a lighthouse keeper's last night",
    "the rules of chess",
    "volcanoes",
    "a robot that paints",
    "how rainbows form",
    "the life of a honeybee",
    "why leaves change colour in autumn",
    "a journey across the desert",
    "how a compass works",
    "the first day at a new school",
]
STYLES = ["Write a short story about {}.", "Explain {} to a curious ten-year-old, in a few paragraphs."]


#: The structured-output row's schema: extraction-shaped (a list of records), and long enough
#: (at least 50 records) that no job completes it within its tokens, so both rows do the same work.
RECORDS_SCHEMA = {
    "type": "object",
    "properties": {
        "records": {
            "type": "array",
            "minItems": 50,
            "items": {
                "type": "object",
                "properties": {"name": {"type": "string", "maxLength": 20}, "score": {"type": "integer"}},
                "required": ["name", "score"],
                "additionalProperties": False,
            },
        }
    },
    "required": ["records"],
    "additionalProperties": False,
}


@dataclass(frozen=True)
class Sizes:
    model: str
    tokens: int
    concurrency: tuple[int, ...]
    baseline_jobs: int
    long_tokens: int
    short_tokens: int
    long_jobs: int
    #: Concurrency of the structured-output row (with a JSON schema against without).
    structured_concurrency: int
    #: Alternating rounds of that row (the ratio is of the medians).
    structured_rounds: int


FULL = Sizes(DEFAULT_MODEL, 64, (1, 4, 16, 32), 6, 256, 16, 15, 16, 3)
QUICK = Sizes(RANDOM_MODEL, 8, (1, 4), 2, 32, 4, 3, 4, 1)
#: --backends: jobs per concurrency (at least the concurrency: every client gets one).
BACKEND_JOBS = {1: 4, 4: 8, 16: 16, 32: 32}
#: --backends: the most tokens of a job (a ~40-token prompt + 64 tokens fit), and the KV cells per
#: row the engine may reserve (the llama.cpp cache, allocated whole at start, holds that many per
#: row: 32 rows of the default 2048 would zero 1.4 GB up front for nothing).
BACKEND_SEQUENCE_TOKENS = 512


def prompts(count: int) -> list[str]:
    return [STYLES[i % len(STYLES)].format(TOPICS[i % len(TOPICS)]) for i in range(count)]


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def run_baseline(loaded: LoadedModel, texts: list[str], tokens: int) -> dict[str, Any]:
    """Sequential generate(): one prompt at a time, greedy, exactly `tokens` new tokens each."""
    model: Any = loaded.model  # transformers' generate() is untyped
    tokenizer: Any = loaded.tokenizer
    latencies, ttfts, generated = [], [], 0
    with torch.inference_mode():  # warm-up, as the engine's start() does
        model.generate(torch.tensor([[1, 2, 3]], device=model.device), max_new_tokens=2, do_sample=False)
    started = time.perf_counter()
    for text in texts:
        ids = tokenizer.apply_chat_template(
            [{"role": "user", "content": text}], add_generation_prompt=True, return_tensors="pt"
        )["input_ids"].to(model.device)
        begin = time.perf_counter()
        with torch.inference_mode():
            first = model.generate(ids, max_new_tokens=1, do_sample=False)
            ttfts.append((time.perf_counter() - begin) * 1000)
            begin = time.perf_counter()
            output = model.generate(ids, max_new_tokens=tokens, min_new_tokens=tokens, do_sample=False)
        latencies.append((time.perf_counter() - begin) * 1000)
        generated += output.shape[1] - ids.shape[1]
        assert first.shape[1] == ids.shape[1] + 1
    # The generate used for timing is the second one: ttft is measured by its own one-token call.
    wall = sum(latencies) / 1000
    return _summary(
        name="baseline generate()",
        concurrency=1,
        generated=generated,
        wall=wall,
        ttfts=ttfts,
        latencies=latencies,
        elapsed=time.perf_counter() - started,
    )


def on_own_thread(function: Callable[..., dict[str, Any]], *args: Any) -> dict[str, Any]:
    """Run torch work on a thread that then exits, taking its OpenMP team with it.

    With GNU OpenMP a thread's parallel regions run 1.5-2x slower while another thread's team exists,
    so a baseline run on the main thread would slow the engine's loop thread down afterwards.
    """
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(function, *args).result()


def _summary(
    *,
    name: str,
    concurrency: int,
    generated: int,
    wall: float,
    ttfts: list[float],
    latencies: list[float],
    elapsed: float,
) -> dict[str, Any]:
    return {
        "name": name,
        "concurrency": concurrency,
        "jobs": len(latencies),
        "output_tokens": generated,
        "wall_s": round(wall, 3),
        "tokens_per_s": round(generated / wall, 2),
        "ttft_ms_p50": round(percentile(ttfts, 50), 1),
        "ttft_ms_p99": round(percentile(ttfts, 99), 1),
        "latency_ms_p50": round(percentile(latencies, 50), 1),
        "latency_ms_p99": round(percentile(latencies, 99), 1),
        "elapsed_s": round(elapsed, 2),
        "peak_rss_mb": round(peak_rss_mb(), 1),
    }


def run_engine(
    engine: LocalEngine,
    texts: list[str],
    tokens: int,
    concurrency: int,
    json_schema: str | None = None,
) -> dict[str, Any]:
    """Closed loop: `concurrency` clients, each submitting its next job when the previous one returns."""
    jobs: queue.Queue[tuple[int, str]] = queue.Queue()
    for index, text in enumerate(texts):
        jobs.put((index, text))
    ttfts: list[float] = []
    latencies: list[float] = []
    generated = [0]
    lock = threading.Lock()

    def client() -> None:
        while True:
            try:
                index, text = jobs.get_nowait()
            except queue.Empty:
                return
            request = GenerationRequest(
                f"c{concurrency}-{index}",
                SamplingParams(max_tokens=tokens, ignore_eos=True, json_schema=json_schema),
                messages=[{"role": "user", "content": text}],
            )
            begin = time.perf_counter()
            result = engine.submit(request).result()
            latency = (time.perf_counter() - begin) * 1000
            with lock:
                latencies.append(latency)
                ttfts.append(result.queued_ms + result.time_to_first_token_ms)
                generated[0] += result.completion_tokens

    clients = [threading.Thread(target=client) for _ in range(concurrency)]
    started = time.perf_counter()
    for thread in clients:
        thread.start()
    for thread in clients:
        thread.join()
    wall = time.perf_counter() - started
    return _summary(
        name=f"engine c={concurrency}" + (" json_schema" if json_schema else ""),
        concurrency=concurrency,
        generated=generated[0],
        wall=wall,
        ttfts=ttfts,
        latencies=latencies,
        elapsed=wall,
    )


def run_structured(engine: LocalEngine, steps: list[StepStats], sizes: Sizes) -> dict[str, Any]:
    """Throughput with a JSON schema enforced against without, same prompts and tokens, in
    alternating rounds (plain, schema, plain, ...) so a load change on a shared machine hits both
    sides; the ratio is of the medians. Also per CPU-second of this process (time.process_time: all
    its threads), which other processes' load barely moves, and the mask's cost per decode step
    (from the engine's StepStats)."""
    concurrency = sizes.structured_concurrency
    texts = prompts(concurrency)
    schema = json.dumps(RECORDS_SCHEMA)
    rounds: dict[str, list[dict[str, Any]]] = {"plain": [], "json_schema": []}
    masked: list[StepStats] = []
    for _ in range(sizes.structured_rounds):
        rounds["plain"].append(_timed_run(engine, texts, sizes.tokens, concurrency, None))
        steps.clear()
        rounds["json_schema"].append(_timed_run(engine, texts, sizes.tokens, concurrency, schema))
        masked += [step for step in steps if step.masked_rows]
    per_step_ms = [step.mask_s * 1000 for step in masked]
    plain, structured = (_median_run(rounds[side]) for side in ("plain", "json_schema"))
    return {
        "concurrency": concurrency,
        "rounds": sizes.structured_rounds,
        "plain": plain,
        "json_schema": structured,
        "round_ratios": [
            round(s["tokens_per_s"] / p["tokens_per_s"], 3)
            for p, s in zip(rounds["plain"], rounds["json_schema"], strict=True)
        ],
        "throughput_ratio": round(structured["tokens_per_s"] / plain["tokens_per_s"], 3),
        "cpu_throughput_ratio": round(structured["tokens_per_cpu_s"] / plain["tokens_per_cpu_s"], 3),
        "mask_ms_per_step_p50": round(percentile(per_step_ms, 50), 3),
        "mask_ms_per_step_p99": round(percentile(per_step_ms, 99), 3),
        "mask_ms_per_row": round(sum(per_step_ms) / max(1, sum(step.masked_rows for step in masked)), 4),
        "mask_share_of_step": round(
            sum(s.mask_s for s in masked) / max(1e-9, sum(s.duration_s for s in masked)), 4
        ),
    }


def _timed_run(
    engine: LocalEngine, texts: list[str], tokens: int, concurrency: int, schema: str | None
) -> dict[str, Any]:
    cpu = time.process_time()
    run = run_engine(engine, texts, tokens, concurrency, schema)
    run["cpu_s"] = round(time.process_time() - cpu, 3)
    run["tokens_per_cpu_s"] = round(run["output_tokens"] / max(1e-9, run["cpu_s"]), 2)
    return run


def _median_run(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The run with the median tokens/s, and the median tokens per CPU-second over all runs."""
    ranked = sorted(runs, key=lambda run: run["tokens_per_s"])
    return ranked[len(ranked) // 2] | {
        "tokens_per_cpu_s": percentile([run["tokens_per_cpu_s"] for run in runs], 50)
    }


def run_short_amid_long(engine: LocalEngine, sizes: Sizes) -> dict[str, Any]:
    """Latency of a short job alone, then submitted while `long_jobs` long jobs are decoding."""

    def short_job(request_id: str) -> float:
        request = GenerationRequest(
            request_id,
            SamplingParams(max_tokens=sizes.short_tokens, ignore_eos=True),
            messages=[{"role": "user", "content": "Say hello to the team."}],
        )
        begin = time.perf_counter()
        engine.submit(request).result()
        return (time.perf_counter() - begin) * 1000

    solo_ms = short_job("short-solo")
    long_futures = [
        engine.submit(
            GenerationRequest(
                f"long-{i}",
                SamplingParams(max_tokens=sizes.long_tokens, ignore_eos=True),
                messages=[{"role": "user", "content": text}],
            )
        )
        for i, text in enumerate(prompts(sizes.long_jobs))
    ]
    while engine.stats().running < sizes.long_jobs:  # all long jobs prefilled and decoding
        time.sleep(0.01)
    amid_ms = short_job("short-amid")
    long_unfinished = sum(not future.done() for future in long_futures)
    for future in long_futures:
        future.result()
    return {
        "short_tokens": sizes.short_tokens,
        "long_tokens": sizes.long_tokens,
        "long_jobs": sizes.long_jobs,
        "short_solo_ms": round(solo_ms, 1),
        "short_amid_long_ms": round(amid_ms, 1),
        "ratio": round(amid_ms / solo_ms, 2),
        "long_jobs_unfinished_when_short_done": long_unfinished,
    }


def plot(report: dict[str, Any], path: Path) -> None:
    import matplotlib.pyplot as plt

    runs = report["engine"]
    baseline = report["baseline"]
    labels = [str(run["concurrency"]) for run in runs]
    figure, (throughput, latency) = plt.subplots(1, 2, figsize=(11, 4.2))
    throughput.bar(labels, [run["tokens_per_s"] for run in runs], color="#4c72b0", label="engine")
    throughput.axhline(
        baseline["tokens_per_s"], color="#dd8452", linestyle="--", label="sequential generate()"
    )
    for index, run in enumerate(runs):
        throughput.annotate(
            f"{run['tokens_per_s'] / baseline['tokens_per_s']:.1f}x", (index, run["tokens_per_s"])
        )
    throughput.set(xlabel="concurrent jobs", ylabel="output tokens/s", title="Throughput")
    throughput.legend()
    for key, style in (("ttft_ms", "o-"), ("latency_ms", "s-")):
        for q in ("p50", "p99"):
            latency.plot(labels, [run[f"{key}_{q}"] / 1000 for run in runs], style, label=f"{key[:-3]} {q}")
    latency.set(xlabel="concurrent jobs", ylabel="seconds", title="Time to first token and job latency")
    latency.legend()
    figure.suptitle(
        f"{report['model']} ({report['label']}), {report['torch_threads']} threads, {report['machine']}"
    )
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def _engine_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default=None, help="model id, folder or .gguf (default: the size's model)")
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    parser.add_argument("--dtype", default="auto", help="auto (fp32 on CPU, bf16/fp16 on CUDA), float32, ...")
    parser.add_argument("--model-cache", type=Path, default=Path(".genq/models"))
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    parser.add_argument(
        "--backends", action="store_true",
        help="torch against llama.cpp on the default GGUF model (writes engine_llamacpp.json/png)",
    )  # fmt: skip
    parser.add_argument(
        "--reference", action="store_true",
        help="genq's llama.cpp engine and API against llama.cpp's llama-batched-bench and llama-server "
        "on the default GGUF (builds them once; writes engine_reference.json/png; --threads default 2)",
    )  # fmt: skip
    parser.add_argument(
        "--kv-cells", choices=sorted(KV_CELL_TYPES), default="q8_0",
        help="--backends, --reference: genq's llama.cpp K/V cell type (GENQ_LLAMACPP_KV_CELLS)",
    )  # fmt: skip
    parser.add_argument(
        "--llamacpp-dir", type=Path, default=None,
        help="--reference: a llama.cpp build folder holding the reference tools (default: found or built)",
    )  # fmt: skip
    parser.add_argument(
        "--structured-only", action="store_true",
        help="only the structured-output row (writes engine_structured.json/png, leaves engine.json)",
    )  # fmt: skip


def machine_label(device: str) -> str:
    if device.startswith("cuda"):
        return f"{torch.cuda.get_device_name(torch.device(device))}, {platform.machine()} host"
    return f"{platform.machine()} {torch.get_num_threads()}-thread CPU"


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    args = parse_args(__doc__, "engine", argv, _engine_options)
    sizes = QUICK if args.quick else FULL
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.reference:
        from bench import engine_reference  # it imports this module

        return engine_reference.main(args)
    if args.backends:
        return compare_backends(args)
    biggest = max(sizes.concurrency)
    config = EngineConfig(
        model=args.model or sizes.model,
        model_cache=args.model_cache,
        device=args.device,
        dtype=args.dtype,
        max_batch_size=max(biggest, sizes.long_jobs + 1),
        max_batch_tokens=32768,
    )
    steps: list[StepStats] = []
    config = replace(config, on_step=steps.append)
    loaded = load_model(config)
    if args.structured_only:
        return structured_only(args.out, config, loaded, steps, sizes, args.quick)
    texts = prompts(max(biggest, 2 * sizes.concurrency[0]))
    report: dict[str, Any] = {
        "model": config.model,
        "label": loaded.label,
        "quick": args.quick,
        "tokens_per_job": sizes.tokens,
        "torch_threads": torch.get_num_threads(),
        "machine": machine_label(args.device),
        "config": {k: str(v) for k, v in asdict(config).items() if k not in ("on_step", "on_fatal")},
        "baseline": on_own_thread(run_baseline, loaded, texts[: sizes.baseline_jobs], sizes.tokens),
    }
    print(json.dumps(report["baseline"]))
    engine = LocalEngine(config, loaded)
    engine.start()
    try:
        report["engine"] = []
        for concurrency in sizes.concurrency:
            count = max(
                concurrency, 4 if concurrency == 1 else 2 * concurrency if concurrency < 16 else concurrency
            )
            run = run_engine(
                engine, texts[:count] if count <= len(texts) else prompts(count), sizes.tokens, concurrency
            )
            run["ratio_to_baseline"] = round(run["tokens_per_s"] / report["baseline"]["tokens_per_s"], 2)
            report["engine"].append(run)
            print(json.dumps(run))
        report["short_amid_long"] = run_short_amid_long(engine, sizes)
        print(json.dumps(report["short_amid_long"]))
        report["structured"] = run_structured(engine, steps, sizes)
        print(json.dumps(report["structured"]))
    finally:
        engine.shutdown(60)
    report["peak_rss_mb"] = round(peak_rss_mb(), 1)
    write_report(args.out, "engine", report, plot)
    print(f"peak RSS {report['peak_rss_mb']} MB")
    return report


def compare_backends(args: argparse.Namespace) -> dict[str, Any]:
    """The closed-loop sweep on llama.cpp, then on torch, over one GGUF model (see the module docstring)."""
    concurrency = (1, 4) if args.quick else FULL.concurrency
    tokens = QUICK.tokens if args.quick else FULL.tokens
    config = gguf_config(args, concurrency, torch.get_num_threads())
    report: dict[str, Any] = {
        "model": config.model,
        "quick": args.quick,
        "tokens_per_job": tokens,
        "threads": torch.get_num_threads(),
        "machine": machine_label("cpu"),
        "llamacpp_sequence_tokens": BACKEND_SEQUENCE_TOKENS,
        "rounds": [],
    }
    for _ in range(1 if args.quick else BACKEND_ROUNDS):
        sweeps = {
            backend: _sweep(replace(config, backend=backend), concurrency, tokens) for backend in BACKENDS
        }
        report["rounds"].append({"backends": sweeps, "ratios": _ratios(sweeps)})
    report["ratios"] = [  # each ratio's median over the rounds
        {"concurrency": rows[0]["concurrency"]}
        | {key: round(percentile([row[key] for row in rows], 50), 2) for key in _COMPARED}
        for rows in zip(*(round_["ratios"] for round_ in report["rounds"]), strict=True)
    ]
    print(json.dumps(report["ratios"]))
    write_report(args.out, "engine_llamacpp", report, plot_backends)
    return report


def gguf_config(args: argparse.Namespace, concurrency: Sequence[int], threads: int) -> EngineConfig:
    """The engine of --backends and --reference: the GGUF model, a row per client, `threads` threads."""
    return EngineConfig(
        model=args.model or DEFAULT_MODEL,
        model_cache=args.model_cache,
        max_batch_size=max(concurrency),
        max_batch_tokens=max(concurrency) * BACKEND_SEQUENCE_TOKENS,
        torch_threads=threads,
        llamacpp_sequence_tokens=BACKEND_SEQUENCE_TOKENS,
        llamacpp_kv_cells=args.kv_cells,
        # Every round runs the same prompts, and llama-batched-bench (and torch) prefill each one:
        # kept prefixes would skip most of genq's prefills. The HTTP half measures the prefix cache.
        llamacpp_prefix_cache=False,
    )


#: --backends: the order of each round's sweeps (llama.cpp first: its RSS is read before torch's
#: model is loaded) and the rounds (a load change on a shared machine hits both sides).
BACKENDS = ("llamacpp", "torch")
BACKEND_ROUNDS = 2


def _ratios(sweeps: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    return [
        {"concurrency": llama["concurrency"]}
        | {key: round(llama[key] / torch_run[key], 2) for key in _COMPARED}
        for llama, torch_run in zip(sweeps["llamacpp"]["runs"], sweeps["torch"]["runs"], strict=True)
    ]


#: What --backends compares (llama.cpp's value over torch's).
_COMPARED = ("tokens_per_s", "ttft_ms_p50", "ttft_ms_p99", "latency_ms_p50", "latency_ms_p99")


def _sweep(config: EngineConfig, concurrency: tuple[int, ...], tokens: int) -> dict[str, Any]:
    engine = build_engine(config)
    engine.start()
    try:
        runs = []
        for clients in concurrency:
            count = max(clients, BACKEND_JOBS.get(clients, clients))
            runs.append(run_engine(cast(LocalEngine, engine), prompts(count), tokens, clients))
            print(config.backend, json.dumps(runs[-1]))
        rss_mb = int(Path("/proc/self/status").read_text().split("VmRSS:")[1].split()[0]) / 1024
    finally:
        engine.shutdown(60)
    label = cast(LocalEngine, engine).label
    return {"label": label, "runs": runs, "rss_mb_after_runs": round(rss_mb, 1)}


def plot_backends(report: dict[str, Any], path: Path) -> None:
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(6.5, 4))
    for offset, (backend, color) in enumerate((("torch", "#dd8452"), ("llamacpp", "#4c72b0"))):
        runs = report["rounds"][-1]["backends"][backend]["runs"]
        positions = [index + (offset - 0.5) * 0.4 for index in range(len(runs))]
        axis.bar(positions, [run["tokens_per_s"] for run in runs], width=0.4, color=color, label=backend)
    labels = [str(ratio["concurrency"]) for ratio in report["ratios"]]
    axis.set_xticks(range(len(labels)), labels)
    axis.set(xlabel="concurrent jobs", ylabel="output tokens/s", title="llama.cpp vs torch, one GGUF")
    axis.legend()
    figure.suptitle(f"{report['model']}, {report['threads']} threads, {report['machine']}", fontsize=9)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def structured_only(
    out: Path, config: EngineConfig, loaded: LoadedModel, steps: list[StepStats], sizes: Sizes, quick: bool
) -> dict[str, Any]:
    """The structured-output row alone (--structured-only), with the same engine settings."""
    engine = LocalEngine(config, loaded)
    engine.start()
    try:
        row = run_structured(engine, steps, sizes)
    finally:
        engine.shutdown(60)
    report = {"model": config.model, "label": loaded.label, "quick": quick, "tokens_per_job": sizes.tokens,
              "torch_threads": torch.get_num_threads(), "machine": machine_label(config.device),
              "structured": row}  # fmt: skip
    print(json.dumps(row))
    write_report(out, "engine_structured", report, plot_structured)
    return report


def plot_structured(report: dict[str, Any], path: Path) -> None:
    import matplotlib.pyplot as plt

    row = report["structured"]
    figure, axis = plt.subplots(figsize=(5.5, 4))
    values = [row["plain"]["tokens_per_s"], row["json_schema"]["tokens_per_s"]]
    axis.bar(["without schema", "with JSON schema"], values, color=["#4c72b0", "#55a868"])
    axis.set(ylabel="output tokens/s", title=f"c={row['concurrency']}: {row['throughput_ratio']:.2f}x")
    figure.suptitle(f"{report['model']}, {report['torch_threads']} threads, {report['machine']}", fontsize=9)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


if __name__ == "__main__":
    main()
