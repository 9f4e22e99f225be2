"""genq's CPU engine side by side with llama.cpp's own tools, in one run (issue 20).

    python -m bench.engine --reference           # genq bench engine --reference: ~6 minutes, plus a
                                                 # one-time build of llama.cpp's tools (~8 minutes)
    python -m bench.engine --reference --quick   # a smoke test; without llama.cpp's tools it skips
                                                 # their side (it never builds them) and says so

The reference tools are llama.cpp's `llama-batched-bench` and `llama-server` from the sources the
installed llama-cpp-python vendors (bench/llamacpp_reference.py finds them or builds them, once).

Engine level, at each concurrency C of 1, 4, 16, 32, on the default GGUF model, with --threads
threads (default 2) on every side, and P prompt tokens (the mean of genq's C benchmark prompts
after the chat template, about 40 as in the issue) and 64 generated tokens per sequence:
  - llama-batched-bench `-npp P -ntg 64 -npl 1,4,16,32`: C random prompts prefilled in one batch,
    then 64 decode steps of C tokens. Twice: with llama.cpp's defaults (repacked weights, f16 K
    and V, a context of the model's training length) and with the context genq gives llama.cpp
    (`-nr` no repacking, `-ctk`/`-ctv` genq's K/V cell type (`--kv-cells`, default q8_0), `-kvu`
    genq's shared KV cache or `-no-kvu` a stream per sequence as its layout is
    (workers/engine/llamacpp/context.py), genq's cells and batch), so the report separates what
    llama.cpp's defaults give from what genq's settings cost.
  - genq's engine, the llama.cpp backend (EngineConfig as `--backends` builds it): the C prompts
    submitted at once, 64 tokens each (ignore_eos), so the shapes match batched-bench's.
Per run: the generation rate (llama.cpp's S_TG; genq's tokens of the steps after its last prefill
over their wall time) and generated tokens over the whole time (llama.cpp's B*TG/T; genq's C*64
over first submit to last result, tokenization and detokenization included), and genq's ratio
to each llama.cpp run, and the share of genq's wall time spent inside `llama_decode`
(`llama_decode_share`: llama.cpp's own compute; the rest is genq's scheduling, sampling,
tokenizing and output). Three rounds (llama.cpp defaults, llama.cpp with genq's settings, genq):
a load change on this shared machine hits every side; the medians and every round are reported.

End to end over HTTP (bench/http_reference.py, run by the same command): genq's API + worker
against llama-server on the same GGUF and threads. Writes <out>/engine_reference.json and .png.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, cast

from bench import http_reference
from bench.common import host_busy_cpu_s, machine, print_table, write_report
from bench.engine import gguf_config, prompts
from bench.llamacpp_reference import REPACK_CRASHED, Reference, ReferenceError, locate
from workers.engine import GenerationRequest, SamplingParams, StepStats
from workers.engine.config import EngineConfig
from workers.engine.llamacpp.context import kv_layout
from workers.engine.llamacpp.executor import BATCH_TOKENS, LlamaCppExecutor
from workers.engine.llamacpp.model import gguf_file, load_llamacpp_model
from workers.engine.local import LocalEngine
from workers.engine.prompts import tokenize

#: The two llama-batched-bench runs: llama.cpp's defaults, and the context genq gives llama.cpp.
REFERENCE_RUNS = ("llamacpp_defaults", "llamacpp_genq_settings")
#: The batched-bench columns, named as in its jsonl output, and what the report calls them.
COLUMNS = {
    "pp": "pp",
    "tg": "tg",
    "pl": "batch",
    "n_kv": "n_kv",
    "t_pp": "t_pp_s",
    "speed_pp": "pp_tokens_per_s",
    "t_tg": "t_tg_s",
    "speed_tg": "tg_tokens_per_s",
    "t": "t_s",
    "speed": "tokens_per_s",
}


@dataclass(frozen=True)
class Sizes:
    concurrency: tuple[int, ...]
    tokens: int
    rounds: int


FULL = Sizes((1, 4, 16, 32), 64, 3)
QUICK = Sizes((1, 4), 8, 1)


# --- llama-batched-bench ------------------------------------------------------------------------


def parse_batched_bench(text: str) -> list[dict[str, float]]:
    """The result rows of llama-batched-bench's output: its jsonl lines (--output-format jsonl) or
    its markdown table (the default), each as COLUMNS' report names, plus generated_tokens_per_s
    (B * TG / T: generated tokens over prefill and generation time)."""
    rows = [_jsonl_row(line) for line in text.splitlines() if line.startswith("{") and '"speed_tg"' in line]
    rows += [_table_row(line) for line in text.splitlines() if _is_table_row(line)]
    for row in rows:
        row["generated_tokens_per_s"] = round(row["batch"] * row["tg"] / row["t_s"], 2)
    return rows


def _jsonl_row(line: str) -> dict[str, float]:
    record = json.loads(line)
    return {name: record[key] for key, name in COLUMNS.items()}


def _is_table_row(line: str) -> bool:
    cells = line.strip().strip("|").split("|")
    return line.startswith("|") and len(cells) == len(COLUMNS) and cells[0].strip().isdigit()


def _table_row(line: str) -> dict[str, float]:
    cells = [float(cell) for cell in line.strip().strip("|").split("|")]
    return dict(zip(COLUMNS.values(), cells, strict=True))


def batched_bench_argv(
    reference: Reference, run: str, config: EngineConfig, prompt: int, sizes: Sizes
) -> list[str]:
    """llama-batched-bench's command line for one of REFERENCE_RUNS."""
    gguf = str(gguf_file(config.model))
    threads = str(config.torch_threads)
    batches = ",".join(map(str, sizes.concurrency))
    argv = [str(reference.batched_bench), "-m", gguf, "-t", threads, "-tb", threads, "-npp", str(prompt),
            "-ntg", str(sizes.tokens), "-npl", batches, "--output-format", "jsonl", "-lv", "4"]  # fmt: skip
    if run == "llamacpp_genq_settings":
        layout, kv = kv_layout(config), config.llamacpp_kv_cells
        unified = "-kvu" if layout.shared else "-no-kvu"
        argv += ["-nr", "-ctk", kv, "-ctv", kv, unified, "-c", str(layout.cells),
                 "-b", str(BATCH_TOKENS), "-ub", str(BATCH_TOKENS)]  # fmt: skip
    return argv


class ReferenceCrashed(ReferenceError):
    """llama-batched-bench was killed by a signal (returncode < 0)."""

    def __init__(self, message: str, returncode: int) -> None:
        super().__init__(message)
        self.returncode = returncode


def run_batched_bench(argv: list[str], sizes: Sizes) -> dict[str, Any]:
    """One llama-batched-bench run: its rows (one per concurrency), and what its log says of the
    context it made (flash attention, KV types, repacking)."""
    started, busy, children = time.perf_counter(), host_busy_cpu_s(), _children_cpu_s()
    completed = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=900)
    own = _children_cpu_s() - children
    rows = parse_batched_bench(completed.stdout + completed.stderr)
    if completed.returncode != 0 or [int(row["batch"]) for row in rows] != list(sizes.concurrency):
        failure = f"{' '.join(argv)} failed ({completed.returncode})"
        message = f"{failure}:\n{completed.stderr[-3000:]}"
        if completed.returncode < 0:
            raise ReferenceCrashed(message, completed.returncode)
        raise ReferenceError(message)
    return {
        "argv": argv,
        "rows": rows,
        "context": _context_lines(completed.stderr),
        "elapsed_s": round(time.perf_counter() - started, 2),
        "cpu_s": round(own, 2),
        "others_cpu_s": round(host_busy_cpu_s() - busy - own, 2),
    }


def _children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _context_lines(log: str) -> list[str]:
    """The lines of its log (-lv 4: info) that show the context llama.cpp made: weight buffers (a
    CPU_REPACK one when weights were repacked), cells per sequence, batch, flash attention, KV types."""
    keys = ("model buffer size", "n_seq_max", "n_ctx_seq ", "n_batch ", "n_ubatch ", "flash_attn ",
            "kv_unified ", "llama_kv_cache: size", "Flash Attention")  # fmt: skip
    lines = [line.split(" I ", 1)[-1].strip() for line in log.splitlines()]
    return list(dict.fromkeys(line for line in lines if any(key in line for key in keys)))


# --- genq's engine ------------------------------------------------------------------------------


@dataclass
class StepClock:
    """Each engine step's StepStats and when it ended (EngineConfig.on_step), and the engine's
    executor's seconds inside llama_decode so far (`decode_seconds`, set once it is made)."""

    steps: list[tuple[float, StepStats]]
    decode_seconds: Callable[[], float] = lambda: 0.0

    def __call__(self, stats: StepStats) -> None:
        self.steps.append((time.perf_counter(), stats))


def run_genq_batch(engine: LocalEngine, clock: StepClock, texts: list[str], tokens: int) -> dict[str, Any]:
    """The C prompts submitted at once, `tokens` tokens each; batched-bench's measures of the run."""
    clock.steps.clear()
    started, busy, cpu = time.perf_counter(), host_busy_cpu_s(), time.process_time()
    in_decode = clock.decode_seconds()
    futures = [
        engine.submit(
            GenerationRequest(
                f"ref-{len(texts)}-{index}",
                SamplingParams(max_tokens=tokens, ignore_eos=True),
                messages=[{"role": "user", "content": text}],
            )
        )
        for index, text in enumerate(texts)
    ]
    results = [future.result() for future in futures]
    wall = time.perf_counter() - started
    in_decode = clock.decode_seconds() - in_decode
    cpu = time.process_time() - cpu
    others = host_busy_cpu_s() - busy - cpu
    generated = sum(result.completion_tokens for result in results)
    steps = list(clock.steps)
    last_prefill = max(index for index, (_, stats) in enumerate(steps) if stats.prefill_tokens)
    prefilled_at = steps[last_prefill][0]
    decoding = steps[last_prefill + 1 :]
    decode_s = decoding[-1][0] - prefilled_at if decoding else float("nan")
    decoded = sum(stats.tokens for _, stats in decoding)
    return {
        "batch": len(texts),
        "generated_tokens": generated,
        "prompt_tokens_mean": round(statistics.mean(r.prompt_tokens for r in results), 1),
        "prefill_steps": sum(1 for _, stats in steps if stats.prefill_tokens),
        "t_to_last_first_token_s": round(prefilled_at - started, 3),
        "t_tg_s": round(decode_s, 3),
        "tg_tokens_per_s": round(decoded / decode_s, 2),
        "t_s": round(wall, 3),
        "generated_tokens_per_s": round(generated / wall, 2),
        "llama_decode_share": round(in_decode / wall, 3),
        "cpu_s": round(cpu, 2),
        "others_cpu_s": round(others, 2),
    }


def genq_sweep(engine: LocalEngine, clock: StepClock, sizes: Sizes) -> list[dict[str, Any]]:
    texts = prompts(max(sizes.concurrency))
    rows = []
    for concurrency in sizes.concurrency:
        rows.append(run_genq_batch(engine, clock, texts[:concurrency], sizes.tokens))
        print("genq", json.dumps(rows[-1]))
    return rows


def mean_prompt_tokens(tokenizer: Any, count: int) -> int:
    """The mean length of genq's first `count` benchmark prompts after the chat template."""
    lengths = [len(tokenize(tokenizer, "", [{"role": "user", "content": text}])) for text in prompts(count)]
    return round(statistics.mean(lengths))


# --- The run ------------------------------------------------------------------------------------


def main(args: argparse.Namespace) -> dict[str, Any]:
    """`bench.engine --reference` (see the module docstring)."""
    sizes = QUICK if args.quick else FULL
    threads = args.threads or 2
    reference = find_reference(args)
    clock = StepClock([])
    config = replace(gguf_config(args, sizes.concurrency, threads), backend="llamacpp", on_step=clock)
    model = load_llamacpp_model(config)
    prompt = mean_prompt_tokens(model.tokenizer, max(sizes.concurrency))
    report: dict[str, Any] = {
        "quick": args.quick,
        "model": config.model,
        "gguf": str(gguf_file(config.model)),
        "threads": threads,
        "machine": machine(),
        "reference": reference.describe() if reference else None,
        "prompt_tokens": prompt,
        "prompt_tokens_from": f"the mean of genq's {max(sizes.concurrency)} benchmark prompts after the "
        "chat template (batched-bench: random tokens, that many)",
        "tokens_per_sequence": sizes.tokens,
        "concurrency": list(sizes.concurrency),
        "engine_config": {
            "max_batch_size": config.max_batch_size,
            "llamacpp_sequence_tokens": config.llamacpp_sequence_tokens,
            "llamacpp_prefix_cache": config.llamacpp_prefix_cache,
            "llamacpp_kv_cells": config.llamacpp_kv_cells,
            "threads": config.torch_threads,
        },
        "rounds": [],
    }
    executor = LlamaCppExecutor(config, model)
    clock.decode_seconds = lambda: executor.decode_seconds
    engine = LocalEngine(config, executor=executor)
    engine.start()
    try:
        for _ in range(sizes.rounds):
            report["rounds"].append(one_round(engine, clock, reference, config, prompt, sizes))
    finally:
        engine.shutdown(60)
    report["medians"] = medians(report["rounds"], sizes)
    report["http"] = http_reference.compare(reference, config, threads, args.quick)
    print_tables(report)
    write_report(args.out, "engine_reference", report, plot)
    return report


def find_reference(args: argparse.Namespace) -> Reference | None:
    """The llama.cpp tools; with --quick only when already built (a smoke test never builds them)."""
    reference = locate(args.llamacpp_dir, build=not args.quick)
    if reference is None:
        print("skipping llama.cpp's side: no runnable reference tools are built (--quick never builds them)")
    return reference


def one_round(
    engine: LocalEngine,
    clock: StepClock,
    reference: Reference | None,
    config: EngineConfig,
    prompt: int,
    sizes: Sizes,
) -> dict[str, Any]:
    """llama.cpp with its defaults, llama.cpp with genq's settings, then genq's engine."""
    round_: dict[str, Any] = {}
    for run in REFERENCE_RUNS if reference else ():
        argv = batched_bench_argv(cast(Reference, reference), run, config, prompt, sizes)
        round_[run] = run_defaults_or_plain(run, argv, sizes)
        print(run, json.dumps(round_[run]["rows"]))
    round_["genq"] = genq_sweep(engine, clock, sizes)
    round_["ratios"] = ratios(round_)
    return round_


def run_defaults_or_plain(run: str, argv: list[str], sizes: Sizes) -> dict[str, Any]:
    """run_batched_bench; when llama.cpp's defaults are killed by a signal, the same with -nr,
    saying so in the result's `fallback` (genq's settings have -nr already)."""
    try:
        return run_batched_bench(argv, sizes)
    except ReferenceCrashed as exc:
        if run != "llamacpp_defaults" or "-nr" in argv:
            raise
        why = REPACK_CRASHED.format(code=exc.returncode)
        print(why)
        return run_batched_bench([*argv, "-nr"], sizes) | {"fallback": why}


#: What the ratios compare: the generation rate and generated tokens over the whole time.
RATES = ("tg_tokens_per_s", "generated_tokens_per_s")


def ratios(round_: dict[str, Any]) -> list[dict[str, Any]]:
    """genq's rates over each llama.cpp run's, per concurrency (none without llama.cpp's side)."""
    out = []
    for index, genq in enumerate(round_["genq"]):
        row: dict[str, Any] = {"batch": genq["batch"]}
        for run in REFERENCE_RUNS:
            if run in round_:
                llama = round_[run]["rows"][index]
                row |= {f"{rate}_vs_{run}": round(genq[rate] / llama[rate], 3) for rate in RATES}
        out.append(row)
    return out


def medians(rounds: list[dict[str, Any]], sizes: Sizes) -> list[dict[str, Any]]:
    """Per concurrency, each side's rates and genq's ratios: their medians over the rounds."""
    out = []
    for index, concurrency in enumerate(sizes.concurrency):
        row: dict[str, Any] = {"batch": concurrency}
        for side in ("genq", *REFERENCE_RUNS):
            if side in rounds[0]:
                runs = [r[side][index] if side == "genq" else r[side]["rows"][index] for r in rounds]
                row[side] = {rate: round(statistics.median(run[rate] for run in runs), 2) for rate in RATES}
        for key in rounds[0]["ratios"][index]:
            if key != "batch":
                row[key] = round(statistics.median(r["ratios"][index][key] for r in rounds), 3)
        out.append(row)
    return out


# --- Output -------------------------------------------------------------------------------------

#: The sides of the engine-level report, and their colours in the plot.
SIDES = {"llamacpp_defaults": "#8172b3", "llamacpp_genq_settings": "#55a868", "genq": "#4c72b0"}
TITLES = {
    "tg_tokens_per_s": "generation tokens/s (llama.cpp: S_TG)",
    "generated_tokens_per_s": "generated tokens / total time (llama.cpp: B*TG/T)",
}


def print_tables(report: dict[str, Any]) -> None:
    sides = [side for side in SIDES if side in report["medians"][0]]
    references = [side for side in sides if side != "genq"]
    for rate in RATES:
        columns = ["C", *sides, *(f"genq / {side}" for side in references)]
        rows = [
            [row["batch"], *(row[side][rate] for side in sides), *(row[f"{rate}_vs_{s}"] for s in references)]
            for row in report["medians"]
        ]
        print_table(f"{TITLES[rate]}, median of {len(report['rounds'])} rounds", columns, rows)
    for number, round_ in enumerate(report["rounds"], 1):
        labels = ("tg", "total")
        columns = ["C", *(f"{side} {label}" for side in sides for label in labels), "genq others' cpu s"]
        rows = [
            [row["batch"], *_round_rates(round_, index, sides), row["others_cpu_s"]]
            for index, row in enumerate(round_["genq"])
        ]
        title = f"round {number}, tokens/s (tg: generation; total: generated / total time)"
        print_table(title, columns, rows)
        for side in references:  # what the rest of the host took while each llama.cpp run ran
            run = round_[side]
            print(f"{side}: other processes took {run['others_cpu_s']} CPU-s in its {run['elapsed_s']} s")
    http_reference.print_tables(report["http"])


def _round_rates(round_: dict[str, Any], index: int, sides: list[str]) -> list[float]:
    runs = [round_[side][index] if side == "genq" else round_[side]["rows"][index] for side in sides]
    return [run[rate] for run in runs for rate in RATES]


def plot(report: dict[str, Any], path: Path) -> None:
    import matplotlib.pyplot as plt

    figure, (engine, http) = plt.subplots(1, 2, figsize=(12, 4.4))
    medians_ = report["medians"]
    sides = [side for side in SIDES if side in medians_[0]]
    width = 0.8 / len(sides)
    for offset, side in enumerate(sides):
        positions = [index + (offset - (len(sides) - 1) / 2) * width for index in range(len(medians_))]
        rates = [row[side]["tg_tokens_per_s"] for row in medians_]
        engine.bar(positions, rates, width=width, color=SIDES[side], label=side)
    engine.set_xticks(range(len(medians_)), [str(row["batch"]) for row in medians_])
    title = f"Engine: batched-bench vs genq, median of {len(report['rounds'])}"
    engine.set(xlabel="sequences decoded together (C)", ylabel="generation tokens/s", title=title)
    engine.legend(fontsize=8)
    http_reference.plot_axis(report["http"], http)
    shape = f"P={report['prompt_tokens']} prompt + {report['tokens_per_sequence']} generated tokens"
    figure.suptitle(f"{Path(report['gguf']).name}, {report['threads']} threads, {shape}", fontsize=9)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
