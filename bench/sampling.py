"""Token choice's cost per decode step (issue 20): what choosing 16 rows' next tokens costs on the
default model's real logits, beside the forward pass it follows.

    python -m bench.sampling           # ~1 minute
    python -m bench.sampling --quick   # a smoke test

Logits: the default GGUF model (llama.cpp, as the worker runs it) at every position of the 16
benchmark chat prompts (bench.engine.prompts after the chat template): ~700 rows, cut into steps of
16. Positions inside a user's prompt are less certain than a completion's usually are, so top_p's
nucleus is wider here than in most decode steps: the nucleus search's harder case.

Per step (workers/engine/sampling/sampler.py's choose_tokens, 16 rows): greedy; temperature 0.8; temperature
0.8 with top_p 0.95, as sampling.py chooses (sorting only the tokens that can be in the nucleus);
and the same top_p with the whole vocabulary sorted per row, what sampling.py did before: the
baseline, drawing the same tokens (tests/workers/engine/sampling/test_sampler.py checks that), in the same
run. Median and p99 milliseconds per step over every step, several passes; the ratios of the top_p
ways; and the median 16-row decode forward pass of the same run, for scale.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from bench.common import machine, parse_args, percentile, print_table, write_report
from bench.engine import prompts
from workers.engine.config import DEFAULT_MODEL, EngineConfig
from workers.engine.llamacpp.executor import LlamaCppExecutor, set_token
from workers.engine.prompts import tokenize
from workers.engine.sampling.sampler import Generator, choose_tokens, make_generator
from workers.engine.types import SamplingParams

ROWS = 16
PROMPTS = 16
TEMPERATURE = 0.8
TOP_P = 0.95

Chooser = Callable[[np.ndarray, list[SamplingParams], list[Generator | None]], list[int]]


def whole_sort_choice(
    logits: np.ndarray, params: list[SamplingParams], generators: list[Generator | None]
) -> list[int]:
    """The baseline: top_p by a stable sort of the whole vocabulary per row (sampling.py before)."""
    tokens = []
    for row, (row_params, generator) in enumerate(zip(params, generators, strict=True)):
        assert generator is not None
        scaled = logits[row].astype(np.float64) / row_params.temperature
        probs = np.exp(scaled - scaled.max())
        probs /= probs.sum()
        order = np.argsort(-scaled, kind="stable")
        ordered = probs[order]
        cumulative = np.cumsum(ordered)
        cumulative = cumulative[: int(np.count_nonzero(cumulative - ordered < row_params.top_p))]
        chosen = int(np.searchsorted(cumulative, generator.random() * cumulative[-1], side="right"))
        if chosen == len(cumulative):  # rounded up to the total: the last token with any mass
            chosen = int(np.flatnonzero(ordered[: len(cumulative)])[-1])
        tokens.append(int(order[chosen]))
    return tokens


def real_logits(prompt_count: int, model_cache: Path) -> tuple[np.ndarray, float]:
    """Logits [positions, vocab] at every position of the benchmark prompts, and the median
    milliseconds of a ROWS-row decode forward pass on the same executor."""
    config = EngineConfig(model=DEFAULT_MODEL, model_cache=model_cache, max_batch_size=ROWS, torch_threads=2)
    executor = LlamaCppExecutor(config)
    executor.prepare()
    try:
        rows = []
        for text in prompts(prompt_count):
            ids = tokenize(executor.tokenizer, "", [{"role": "user", "content": text}])
            # Fresh row 0 each time; every position's logits, a chunk at a time (a view: copied).
            executor._run_prompt(0, ids, scored=lambda _, logits: rows.append(logits.copy()))
            executor.kv.empty(0)
        return np.concatenate(rows), _forward_ms(executor)
    finally:
        executor.close()


def _forward_ms(executor: LlamaCppExecutor, steps: int = 8) -> float:
    """A ROWS-row decode step's forward pass (each row a one-token prompt, then decoded)."""
    times = []
    for row in range(ROWS):
        executor._run_prompt(row, [1])
    batch = executor._batch
    for step in range(steps):
        for row in range(ROWS):
            set_token(batch, row, 2, 1 + step, row, True)
        batch.n_tokens = ROWS
        started = time.perf_counter()
        executor._forward(batch)
        times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times)


def time_steps(
    logits: np.ndarray, choose: Chooser, params: SamplingParams, passes: int
) -> tuple[list[float], list[int]]:
    """Milliseconds of each ROWS-row step over `passes` passes through the logits, and the tokens."""
    steps = len(logits) // ROWS
    generators = [make_generator(params) for _ in range(ROWS)]
    times, tokens = [], []
    for _ in range(passes):
        for step in range(steps):
            rows = np.ascontiguousarray(logits[step * ROWS : (step + 1) * ROWS])
            started = time.perf_counter()
            tokens.extend(choose(rows, [params] * ROWS, generators))
            times.append((time.perf_counter() - started) * 1000)
    return times, tokens


def summary(times: Sequence[float]) -> dict[str, float]:
    return {"median_ms": round(statistics.median(times), 3), "p99_ms": round(percentile(times, 99), 3)}


def plot(report: dict[str, Any], path: Path) -> None:
    import matplotlib.pyplot as plt

    ways = report["ways"]
    names = list(ways)
    figure, axis = plt.subplots(figsize=(8, 4))
    axis.bar(names, [ways[name]["median_ms"] for name in names], label="median")
    axis.plot(names, [ways[name]["p99_ms"] for name in names], "k.", label="p99")
    axis.axhline(report["forward_ms_median"], color="grey", linestyle="--", label="16-row forward pass")
    axis.set_ylabel(f"ms per {ROWS}-row step")
    axis.set_title("token choice per decode step (default model's logits)")
    axis.legend(fontsize=8)
    figure.autofmt_xdate()
    figure.tight_layout()
    figure.savefig(path)
    plt.close(figure)


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    def more(parser: Any) -> None:
        parser.add_argument("--model-cache", type=Path, default=Path(".genq/models"))

    args = parse_args(__doc__, "sampling", argv, more)
    prompt_count, passes = (2, 1) if args.quick else (PROMPTS, 5)
    logits, forward_ms = real_logits(prompt_count, args.model_cache)
    sampled = SamplingParams(max_tokens=1, temperature=TEMPERATURE, seed=1)
    nucleus = SamplingParams(max_tokens=1, temperature=TEMPERATURE, top_p=TOP_P, seed=1)
    runs = {
        "greedy": time_steps(logits, choose_tokens, SamplingParams(max_tokens=1), passes),
        f"temperature {TEMPERATURE}": time_steps(logits, choose_tokens, sampled, passes),
        f"top_p {TOP_P}, nucleus search": time_steps(logits, choose_tokens, nucleus, passes),
        f"top_p {TOP_P}, whole sort (baseline)": time_steps(logits, whole_sort_choice, nucleus, passes),
    }
    ways = {name: summary(times) for name, (times, _) in runs.items()}
    search, whole = (runs[f"top_p {TOP_P}, {kind}"] for kind in ("nucleus search", "whole sort (baseline)"))
    report = {
        "quick": args.quick,
        "machine": machine(),
        "model": DEFAULT_MODEL,
        "rows_per_step": ROWS,
        "positions": len(logits),
        "steps_timed": len(search[0]),
        "forward_ms_median": round(forward_ms, 2),
        "ways": ways,
        "same_tokens_as_baseline": search[1] == whole[1],
        "nucleus_over_whole_sort_median": round(
            ways[f"top_p {TOP_P}, nucleus search"]["median_ms"]
            / ways[f"top_p {TOP_P}, whole sort (baseline)"]["median_ms"],
            3,
        ),
    }
    rows = [[name, value["median_ms"], value["p99_ms"]] for name, value in ways.items()]
    print_table(
        f"token choice, {ROWS} rows per step (forward pass {forward_ms:.1f} ms)",
        ["way", "median ms", "p99 ms"],
        rows,
    )
    ratio, same = report["nucleus_over_whole_sort_median"], report["same_tokens_as_baseline"]
    print(f"nucleus search / whole sort (medians): {ratio}; the same tokens drawn: {same}")
    write_report(args.out, "sampling", report, plot)
    return report


if __name__ == "__main__":
    main()
