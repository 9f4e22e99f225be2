"""llama-batched-bench's output, parsed (bench/engine_reference.py), against REAL output recorded from
the binary bench/llamacpp_reference.py builds (llama-cpp-python 0.3.36, llama.cpp 0c1e570) on the
2-core VM, on the default GGUF (SmolLM2-135M-Instruct Q4_1), unedited:

- fixtures/batched_bench_md.txt: `llama-batched-bench -m GGUF -t 2 -tb 2 -npp 45 -ntg 64
  -npl 1,4,16,32` (stdout: its default markdown table; another agent's benchmark running beside it
  slowed C=1);
- fixtures/batched_bench_jsonl.txt: the same with `--output-format jsonl -lv 4`, stdout and stderr
  together (its model-loading log lines around the jsonl rows), as bench.engine --reference reads it.
"""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from bench.engine_reference import ReferenceCrashed, Sizes, parse_batched_bench, run_defaults_or_plain
from bench.llamacpp_reference import REPACK_CRASHED

FIXTURES = Path(__file__).parent / "fixtures"


def test_the_markdown_table_parses_to_one_row_per_batch() -> None:
    rows = parse_batched_bench((FIXTURES / "batched_bench_md.txt").read_text())
    assert [row["batch"] for row in rows] == [1, 4, 16, 32]
    assert rows[3] == {
        "pp": 45, "tg": 64, "batch": 32, "n_kv": 3488, "t_pp_s": 3.542, "pp_tokens_per_s": 406.57,
        "t_tg_s": 6.411, "tg_tokens_per_s": 319.47, "t_s": 9.952, "tokens_per_s": 350.47,
        "generated_tokens_per_s": 205.79,  # 32 * 64 / 9.952: generated tokens over prefill + generation
    }  # fmt: skip


def test_the_jsonl_rows_parse_among_the_log_lines() -> None:
    rows = parse_batched_bench((FIXTURES / "batched_bench_jsonl.txt").read_text())
    assert [(row["batch"], row["pp"], row["tg"], row["n_kv"]) for row in rows] == [
        (1, 45, 64, 109), (4, 45, 64, 436), (16, 45, 64, 1744), (32, 45, 64, 3488),
    ]  # fmt: skip
    first = rows[0]
    assert first["tg_tokens_per_s"] == pytest.approx(156.228638)
    assert first["t_s"] == pytest.approx(first["t_pp_s"] + first["t_tg_s"], abs=1e-5)
    assert first["generated_tokens_per_s"] == round(64 / 0.560898, 2)
    # S_TG is the batch's generated tokens over the generation time, as the report reads it.
    assert all(
        row["tg_tokens_per_s"] == pytest.approx(row["batch"] * 64 / row["t_tg_s"], rel=1e-4) for row in rows
    )


def test_text_without_results_parses_to_nothing() -> None:
    assert parse_batched_bench("error: unable to load model\n|    PP |     TG |    B |\n") == []


def test_defaults_killed_by_a_signal_are_run_again_with_no_repack(tmp_path: Path) -> None:
    """On a CPU where llama.cpp's repacked weight kernels crash (seen: SIGSEGV and SIGILL on a 2-core
    VM reporting AMX), the defaults run is made again with -nr and the result says so; a crash of a
    run that has -nr already is an error. The stand-in for llama-batched-bench is a shell script (no
    llama.cpp build here): killed by SIGSEGV without -nr, else it replays the recorded real output."""
    tool = tmp_path / "llama-batched-bench"
    recorded = FIXTURES / "batched_bench_jsonl.txt"
    tool.write_text(f'#!/bin/sh\ncase " $* " in *" -nr "*) cat "{recorded}";; *) kill -SEGV $$;; esac\n')
    tool.chmod(0o755)
    sizes = Sizes(concurrency=(1, 4, 16, 32), tokens=64, rounds=1)
    argv = [str(tool), "-npl", "1,4,16,32"]
    result = run_defaults_or_plain("llamacpp_defaults", argv, sizes)
    assert result["argv"] == [*argv, "-nr"] and [row["batch"] for row in result["rows"]] == [1, 4, 16, 32]
    assert result["fallback"] == REPACK_CRASHED.format(code=-signal.SIGSEGV)
    with pytest.raises(ReferenceCrashed):
        run_defaults_or_plain("llamacpp_genq_settings", argv, sizes)
