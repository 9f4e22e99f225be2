"""The cache benchmark runs end to end (--quick) and reports what it promises."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_bench_cache_quick(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "bench.cache", "--quick", "--out", str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=240, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads((tmp_path / "cache.json").read_text())
    assert (tmp_path / "cache.png").stat().st_size > 0
    assert abs(report["hit_ratio"]["total"] - report["ideal_hit_ratio"]) <= 0.01
    assert report["hit_ratio"]["l1"] > 0 and report["hit_ratio"]["l2"] > 0
    for level in ("l1", "l2", "miss", "l1_submit", "l2_submit", "miss_submit"):
        assert report["latency_ms"][level]["p50"] > 0
