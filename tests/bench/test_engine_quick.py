"""The engine benchmark's --quick mode runs end to end and writes its JSON and PNG."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.workers.engine.conftest import MODEL_CACHE, ROOT


def test_bench_engine_quick(tmp_path: Path) -> None:
    subprocess.run(
        [
            sys.executable,
            "-m",
            "bench.engine",
            "--quick",
            "--threads",
            "1",
            "--out",
            str(tmp_path),
            "--model-cache",
            str(MODEL_CACHE),
        ],
        cwd=ROOT,
        check=True,
        timeout=240,
        capture_output=True,
    )
    report = json.loads((tmp_path / "engine.json").read_text())
    assert report["quick"] is True
    assert report["baseline"]["tokens_per_s"] > 0
    assert [run["concurrency"] for run in report["engine"]] == [1, 4]
    assert all(run["output_tokens"] == run["jobs"] * report["tokens_per_job"] for run in report["engine"])
    assert report["short_amid_long"]["long_jobs_unfinished_when_short_done"] > 0
    structured = report["structured"]  # the same work with a JSON schema enforced, and its mask's cost
    assert structured["json_schema"]["output_tokens"] == structured["plain"]["output_tokens"]
    assert structured["mask_ms_per_step_p50"] > 0 and structured["throughput_ratio"] > 0
    assert (tmp_path / "engine.png").stat().st_size > 0


def test_bench_engine_structured_row_alone(tmp_path: Path) -> None:
    subprocess.run(
        [sys.executable, "-m", "bench.engine", "--quick", "--structured-only", "--threads", "1",
         "--out", str(tmp_path), "--model-cache", str(MODEL_CACHE)],
        cwd=ROOT, check=True, timeout=240, capture_output=True,
    )  # fmt: skip
    report = json.loads((tmp_path / "engine_structured.json").read_text())
    structured = report["structured"]
    assert structured["rounds"] == len(structured["round_ratios"]) == 1
    assert structured["cpu_throughput_ratio"] > 0 and structured["plain"]["tokens_per_cpu_s"] > 0
    assert structured["json_schema"]["output_tokens"] == structured["plain"]["output_tokens"] > 0
    assert structured["throughput_ratio"] > 0 and structured["mask_ms_per_step_p50"] > 0
    assert (tmp_path / "engine_structured.png").stat().st_size > 0
    assert not (tmp_path / "engine.json").exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA")
def test_bench_engine_on_cuda_without_a_gpu_says_so(tmp_path: Path) -> None:
    completed = subprocess.run(
        [sys.executable, "-m", "bench.engine", "--quick", "--device", "cuda", "--out", str(tmp_path),
         "--model-cache", str(MODEL_CACHE)],
        cwd=ROOT, check=False, timeout=120, capture_output=True, text=True,
    )  # fmt: skip
    assert completed.returncode != 0
    assert "torch sees no CUDA device" in completed.stderr
    assert not (tmp_path / "engine.json").exists()


def test_bench_engine_backends_quick(tmp_path: Path) -> None:
    subprocess.run(
        [sys.executable, "-m", "bench.engine", "--quick", "--backends", "--threads", "1",
         "--out", str(tmp_path), "--model-cache", str(MODEL_CACHE)],
        cwd=ROOT, check=True, timeout=240, capture_output=True,
    )  # fmt: skip
    report = json.loads((tmp_path / "engine_llamacpp.json").read_text())
    (only,) = report["rounds"]
    assert set(only["backends"]) == {"torch", "llamacpp"}
    assert "llama.cpp" in only["backends"]["llamacpp"]["label"]
    for backend in only["backends"].values():
        assert [run["concurrency"] for run in backend["runs"]] == [1, 4]
        assert all(run["output_tokens"] == run["jobs"] * report["tokens_per_job"] for run in backend["runs"])
    assert report["ratios"] == only["ratios"] and [ratio["concurrency"] for ratio in report["ratios"]] == [
        1,
        4,
    ]
    assert all(ratio["tokens_per_s"] > 0 for ratio in report["ratios"])
    assert (tmp_path / "engine_llamacpp.png").stat().st_size > 0


def test_bench_worker_memory_quick(tmp_path: Path) -> None:
    """The worker's memory, stage by stage, in a fresh interpreter on its own settings (churn and long
    prompts included): the default GGUF runs on llama.cpp, with none of transformers' model code
    imported."""
    subprocess.run(
        [sys.executable, "-m", "bench.worker_memory", "--quick", "--out", str(tmp_path)],
        cwd=ROOT, check=True, timeout=240, capture_output=True,
        env={**os.environ, "GENQ_MODEL_CACHE": str(MODEL_CACHE)},
    )  # fmt: skip
    report = json.loads((tmp_path / "worker_memory.json").read_text())
    assert report["quick"] is True and report["backend"] == "llamacpp"
    assert report["max_batch_size"] == 2 and report["generated_tokens"] == 2 * 4
    assert (report["llamacpp_kv_cells"], report["llamacpp_cache_tokens"]) == ("q8_0", 8192)  # the defaults
    stages = report["stages"]
    assert list(stages) == [
        "interpreter",
        "worker imported",
        "engine built",
        "engine started",
        "after 2 jobs",
        "after 1 waves",
        "after 2 long prompts",
        "after a response format",
    ]
    peaks = [stage["VmHWM"] for stage in stages.values()]
    assert peaks == sorted(peaks)  # a peak never falls
    assert report["peak_mib"] == stages["after 2 jobs"]["VmHWM"]
    assert report["peak_after_long_prompts_mib"] == stages["after 2 long prompts"]["VmHWM"]
    assert report["rss_after_waves_mib"] == stages["after 1 waves"]["VmRSS"]
    # The first response format builds llguidance's view of the tokenizer (tens of MiB).
    assert report["peak_with_response_format_mib"] == peaks[-1] > report["peak_mib"]
    assert [stage["seconds"] for stage in stages.values()] == sorted(
        stage["seconds"] for stage in stages.values()
    )
    assert any(m["mapping"].endswith(".gguf") for m in report["large_mappings"])  # the mapped weights
    assert report["model_code_imported"] == []
    assert (tmp_path / "worker_memory.png").stat().st_size > 0


def test_bench_sampling_quick(tmp_path: Path) -> None:
    """Token choice per decode step on the default model's logits: the nucleus search draws the
    tokens the whole-vocabulary sort (its baseline) draws, and each way is timed."""
    subprocess.run(
        [sys.executable, "-m", "bench.sampling", "--quick", "--out", str(tmp_path),
         "--model-cache", str(MODEL_CACHE)],
        cwd=ROOT, check=True, timeout=240, capture_output=True,
    )  # fmt: skip
    report = json.loads((tmp_path / "sampling.json").read_text())
    assert report["quick"] is True and report["rows_per_step"] == 16
    assert report["same_tokens_as_baseline"] is True
    assert report["positions"] >= 2 * 16 and report["steps_timed"] >= 2
    assert set(report["ways"]) == {
        "greedy",
        "temperature 0.8",
        "top_p 0.95, nucleus search",
        "top_p 0.95, whole sort (baseline)",
    }
    assert all(0 < way["median_ms"] <= way["p99_ms"] for way in report["ways"].values())
    assert report["forward_ms_median"] > 0
    assert (tmp_path / "sampling.png").stat().st_size > 0
