"""A worker's resident memory, stage by stage, on its own settings (`GENQ_*`, as `genq worker` reads
them): its imports, the engine built, started (model loaded, KV cache allocated, warmed up), after
C concurrent jobs of N tokens, after `--waves` waves of C jobs that share a system prompt (prompts
of 20-300 words, 4-48 tokens each: rows end inside the run and others move, prefixes are reused and
copied between rows, the traffic that used to leave whole KV streams resident), after C jobs of
~1,900-token prompts at once (every row's stream nearly full; the cells the prefix cache then keeps
are bounded by GENQ_LLAMACPP_CACHE_TOKENS), then after one job with a response format (the first
builds llguidance's view of the tokenizer, workers/engine/sampling/structured.py). Peak (VmHWM) and current
(VmRSS) resident MiB and the seconds at each stage, split into anonymous and file-backed (the
mapped GGUF weights and shared libraries), the largest mappings at the end (the KV cache is one
anonymous mapping under llama.cpp), and which model code was imported (transformers' models,
accelerate: a llama.cpp worker needs none of it).

    python -m bench.worker_memory                       # default settings, 16 jobs of 64 tokens, 6 waves
    GENQ_LLAMACPP_SEQUENCE_TOKENS=1024 python -m bench.worker_memory
    git worktree add /tmp/base <commit> && python -m bench.worker_memory --base /tmp/base

The measured process is a fresh interpreter that imports what a worker imports (workers.worker) and
nothing of the benchmarks', so its numbers are a worker's. With --base, a worker of that checkout
(its own code, this run's settings) is measured first, the same way, as the baseline. Writes
<out>/worker_memory.json and .png.
"""

from __future__ import annotations

import json
import os
import random
import re
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

#: This checkout: the measured interpreter imports the worker from here, or from --base.
ROOT = Path(__file__).resolve().parents[1]
#: Mappings larger than this are listed by name in the report.
_LARGE_MAPPING_MIB = 8
#: Modules a worker on llama.cpp has no use for; the report says which were imported.
MODEL_CODE = ("transformers.modeling_utils", "transformers.activations", "accelerate")
#: Words a churn job's prompt may have, tokens it may generate, and a long prompt's words (~1,900
#: tokens of the default model's tokenizer, within its 2,048 cells with 16 generated).
_CHURN_WORDS, _CHURN_TOKENS, _LONG_WORDS = (20, 100, 300), (4, 16, 48), 940
_WORDS = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta", "iota", "kappa"]
_SYSTEM = "You are a careful assistant. Answer briefly."
#: --quick: a small context so the smoke run allocates little.
_QUICK_ENV = {"GENQ_MAX_BATCH_SIZE": "2", "GENQ_LLAMACPP_SEQUENCE_TOKENS": "256"}


def status_mib() -> dict[str, int]:
    """VmHWM (peak), VmRSS, RssAnon and RssFile of this process, MiB."""
    wanted = ("VmHWM", "VmRSS", "RssAnon", "RssFile")
    values = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        key, _, rest = line.partition(":")
        if key in wanted:
            values[key] = int(rest.split()[0]) // 1024
    return values


def large_mappings() -> list[dict[str, Any]]:
    """This process's mappings resident above _LARGE_MAPPING_MIB, largest first."""
    found, name = [], ""
    for line in Path("/proc/self/smaps").read_text().splitlines():
        if re.match(r"^[0-9a-f]+-[0-9a-f]+ ", line):
            fields = line.split()
            name = fields[5] if len(fields) > 5 else "[anonymous]"
        elif line.startswith("Rss:") and int(line.split()[1]) >= _LARGE_MAPPING_MIB * 1024:
            found.append({"mapping": name, "rss_mib": int(line.split()[1]) // 1024})
    return sorted(found, key=lambda item: -item["rss_mib"])


def measure(concurrency: int, tokens: int, waves: int, long_words: int = _LONG_WORDS) -> dict[str, Any]:
    """Run in the measured interpreter: a worker's engine, stage by stage (see the module docstring).
    Each stage also says when it was reached, in seconds from the start of this function."""
    began = time.monotonic()

    def stage() -> dict[str, float]:
        return {**status_mib(), "seconds": round(time.monotonic() - began, 2)}

    stages = {"interpreter": stage()}
    import workers.worker
    from shared.config import Settings

    stages["worker imported"] = stage()
    from workers.engine import GenerationRequest, SamplingParams, build_engine, choose_backend

    config = workers.worker.engine_config(Settings())
    engine = build_engine(config)
    stages["engine built"] = stage()
    engine.start()
    stages["engine started"] = stage()
    generated: list[int] = []

    def job(index: int) -> None:
        params = SamplingParams(max_tokens=tokens, ignore_eos=True)
        prompt = f"Tell me about topic number {index}, in detail."
        generated.append(
            engine.submit(GenerationRequest(f"m{index}", params, prompt=prompt)).result().completion_tokens
        )

    _at_once(job, [(index,) for index in range(concurrency)])
    stages[f"after {concurrency} jobs"] = stage()
    rng = random.Random(0)
    chat = _chatter(engine, rng)
    for wave in range(waves):
        first = wave * concurrency
        jobs = [(first + k, rng.choice(_CHURN_WORDS), rng.choice(_CHURN_TOKENS)) for k in range(concurrency)]
        _at_once(chat, jobs)
    stages[f"after {waves} waves"] = stage()
    _at_once(chat, [(10_000 + k, long_words, 16) for k in range(concurrency)])
    stages[f"after {concurrency} long prompts"] = stage()
    # llguidance's view of the tokenizer is built by the first response format (structured.py).
    schema = SamplingParams(max_tokens=tokens, json_schema='{"type": "array", "items": {"type": "integer"}}')
    engine.submit(GenerationRequest("m-json", schema, prompt="Five integers, as JSON.")).result()
    stages["after a response format"] = stage()
    report = {
        "model": config.model,
        "backend": choose_backend(config),
        "max_batch_size": config.max_batch_size,
        "llamacpp_sequence_tokens": config.llamacpp_sequence_tokens,
        "llamacpp_kv_cells": config.llamacpp_kv_cells,
        "llamacpp_cache_tokens": config.llamacpp_cache_tokens,
        "llamacpp_batch_invariant": getattr(config, "llamacpp_batch_invariant", None),
        "generated_tokens": sum(generated),
        "stages": stages,
        "peak_mib": stages[f"after {concurrency} jobs"]["VmHWM"],
        "peak_after_waves_mib": stages[f"after {waves} waves"]["VmHWM"],
        "peak_after_long_prompts_mib": stages[f"after {concurrency} long prompts"]["VmHWM"],
        "peak_with_response_format_mib": stages["after a response format"]["VmHWM"],
        "rss_after_waves_mib": stages[f"after {waves} waves"]["VmRSS"],
        "rss_after_long_prompts_mib": stages[f"after {concurrency} long prompts"]["VmRSS"],
        "large_mappings": large_mappings(),
        "model_code_imported": [name for name in MODEL_CODE if name in sys.modules],
    }
    engine.shutdown()
    return report


def _chatter(engine: Any, rng: random.Random) -> Callable[[int, int, int], None]:
    """A job of the churn stages: a chat sharing _SYSTEM, `words` words of its own, `tokens` tokens."""
    from workers.engine import GenerationRequest, SamplingParams

    def chat(index: int, words: int, tokens: int) -> None:
        text = " ".join(rng.choice(_WORDS) for _ in range(words))
        messages = [{"role": "system", "content": _SYSTEM}, {"role": "user", "content": f"{index}: {text}"}]
        params = SamplingParams(max_tokens=tokens, ignore_eos=True)
        engine.submit(GenerationRequest(f"c{index}", params, messages=messages)).result()

    return chat


def _at_once(target: Callable[..., None], jobs: Sequence[tuple[int, ...]]) -> None:
    """Run target(*job) for every job, each on a thread of its own, all at once; wait for them all."""
    threads = [threading.Thread(target=target, args=job) for job in jobs]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def run(concurrency: int, tokens: int, waves: int, quick: bool, tree: Path = ROOT) -> dict[str, Any]:
    """measure() in a fresh interpreter with the caller's GENQ_* settings (plus --quick's), importing
    the worker (and this module) from the checkout `tree`; the model cache is this checkout's unless
    GENQ_MODEL_CACHE names one, so each tree reads the same files."""
    env = {"GENQ_MODEL_CACHE": str(ROOT / ".genq" / "models"), **os.environ, **(_QUICK_ENV if quick else {})}
    env["PYTHONPATH"] = str(tree)
    words = 60 if quick else _LONG_WORDS  # within --quick's 256 cells
    call = f"m.measure({concurrency}, {tokens}, {waves}, {words})"
    code = f"import json, bench.worker_memory as m; print(json.dumps({call}))"
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=tree, env=env, capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        raise SystemExit(f"the measured worker ({tree}) failed:\n{done.stderr[-3000:]}")
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def commit_of(tree: Path) -> str:
    """The commit checked out at `tree` (its short hash), marked + when it has changes."""

    def git(*words: str) -> str:
        done = subprocess.run(["git", *words], cwd=tree, capture_output=True, text=True, check=True)
        return done.stdout.strip()

    return git("rev-parse", "--short", "HEAD") + ("+" if git("status", "--porcelain") else "")


def plot(report: dict[str, Any], path: Path) -> None:
    import matplotlib.pyplot as plt

    stages = report["stages"]
    names = list(stages)
    figure, axis = plt.subplots(figsize=(8, 4))
    anonymous = [stages[name]["RssAnon"] for name in names]
    axis.bar(names, anonymous, label="anonymous (heap, KV cache)")
    axis.bar(
        names,
        [stages[name]["RssFile"] for name in names],
        bottom=anonymous,
        label="file-backed (weights, libraries)",
    )
    axis.plot(names, [stages[name]["VmHWM"] for name in names], "k.--", label="peak (VmHWM)")
    if "baseline" in report:
        base = list(report["baseline"]["stages"].values())  # the same stages, in the same order
        label = f"peak, baseline {report['baseline']['commit']}"
        axis.plot(names, [stage["VmHWM"] for stage in base], "r.:", label=label)
    axis.set_ylabel("MiB resident")
    axis.set_title(f"worker memory: {report['backend']} backend, {report['max_batch_size']} rows")
    axis.legend(fontsize=8)
    figure.autofmt_xdate()
    figure.tight_layout()
    figure.savefig(path)
    plt.close(figure)


def print_report(report: dict[str, Any]) -> None:
    from bench.common import print_table

    keys = ("VmHWM", "VmRSS", "RssAnon", "RssFile", "seconds")
    rows = [[name, *(values[key] for key in keys)] for name, values in report["stages"].items()]
    columns = ["stage", "peak MiB", "rss", "anon", "file", "at s"]
    print_table(f"worker memory ({report['backend']} backend, {report['commit']})", columns, rows)
    print(
        "largest mappings:", ", ".join(f"{m['mapping']} {m['rss_mib']}" for m in report["large_mappings"][:5])
    )


def main(argv: Sequence[str] | None = None) -> None:
    from bench.common import machine, parse_args, write_report

    def more(parser: Any) -> None:
        parser.add_argument("--concurrency", type=int, default=16, help="jobs run at once (default 16)")
        parser.add_argument("--tokens", type=int, default=64, help="tokens each job generates (default 64)")
        parser.add_argument("--waves", type=int, default=6, help="waves of churn jobs (default 6)")
        parser.add_argument(
            "--base", type=Path, default=None, help="a checkout (git worktree) measured first: the baseline"
        )

    args = parse_args(__doc__, "worker_memory", argv, more)
    concurrency, tokens, waves = (2, 4, 1) if args.quick else (args.concurrency, args.tokens, args.waves)
    baseline = None
    if args.base is not None:
        baseline = {"commit": commit_of(args.base), **run(concurrency, tokens, waves, args.quick, args.base)}
        print_report(baseline)
    measured = {"commit": commit_of(ROOT), **run(concurrency, tokens, waves, args.quick)}
    report = {"quick": args.quick, "machine": machine(), **measured}
    print_report(report)
    if baseline is not None:
        report["baseline"] = baseline
        print(
            f"peak with a response format: {report['peak_with_response_format_mib']} MiB, "
            f"baseline {baseline['commit']} {baseline['peak_with_response_format_mib']} MiB"
        )
    write_report(args.out, "worker_memory", report, plot)


if __name__ == "__main__":
    main()
