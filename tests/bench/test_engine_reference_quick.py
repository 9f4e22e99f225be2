"""`bench.engine --reference --quick` runs genq's side whether or not llama.cpp's reference tools are
built, and says so when they are not: a smoke test never builds them (minutes). On a machine where
they are built (python -m bench.llamacpp_reference), it runs a tiny llama-batched-bench and
llama-server beside genq too; on a clean clone only genq's side."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from bench.llamacpp_reference import ENV_VAR, locate
from tests.workers.engine.conftest import MODEL_CACHE, ROOT


def test_bench_engine_reference_quick(tmp_path: Path) -> None:
    env = {name: value for name, value in os.environ.items() if name != ENV_VAR}
    completed = subprocess.run(
        [sys.executable, "-m", "bench.engine", "--reference", "--quick", "--threads", "1",
         "--out", str(tmp_path), "--model-cache", str(MODEL_CACHE)],
        cwd=ROOT, env=env, check=True, timeout=300, capture_output=True, text=True,
    )  # fmt: skip
    report = json.loads((tmp_path / "engine_reference.json").read_text())
    built = locate(build=False, say=lambda _: None) is not None
    assert report["quick"] is True and (report["reference"] is not None) == built
    for round_ in report["rounds"]:  # genq's side: every job ran, its rates measured
        assert [row["batch"] for row in round_["genq"]] == [1, 4]
        for row in round_["genq"]:
            assert row["generated_tokens"] == row["batch"] * report["tokens_per_sequence"]
            assert row["tg_tokens_per_s"] > 0 and row["generated_tokens_per_s"] > 0
            assert 0 < row["llama_decode_share"] <= 1  # llama.cpp's part of the run's wall time
    for row in report["http"]["rounds"][0]:  # genq with its prefix cache, and without it
        for side in ("genq", "genq_whole_prefill"):
            assert row[side]["failed_or_unfinished"] == 0 and row[side]["completion_tokens"] > 0
    sides = {"llamacpp_defaults", "llamacpp_genq_settings"}
    if built:
        assert sides <= set(report["rounds"][0]) and "llama_server" in report["http"]["medians"][0]
        assert all(row["tokens_per_s_ratio"] > 0 for row in report["http"]["medians"])
    else:
        assert "skipping llama.cpp's side: no runnable reference tools are built" in completed.stdout
        assert not sides & set(report["rounds"][0]) and "llama_server" not in report["http"]["medians"][0]
        assert report["medians"][0].keys() == {"batch", "genq"}
    assert (tmp_path / "engine_reference.png").stat().st_size > 0
