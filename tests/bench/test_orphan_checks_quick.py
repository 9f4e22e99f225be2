"""The orphan-check benchmark runs end to end (--quick) and reports what it promises: one pass over a
queue that is not draining, every check finding its message in the list."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_bench_orphan_checks_quick(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "bench.orphan_checks", "--quick", "--out", str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads((tmp_path / "orphan_checks.json").read_text())
    assert (tmp_path / "orphan_checks.png").stat().st_size > 0
    assert [run["queued"] for run in report["runs"]] == [200, 400]
    for run in report["runs"]:
        assert run["actions"] == 0  # every message is in its list: nothing pushed again or failed
        assert run["still_held_in_list"] == run["queued"]  # each rescheduled, none dropped
        assert run["redis_cpu_s"] > 0 and run["redis_cpu_ms_per_check"] > 0
    assert len(report["growth_per_doubling"]) == 1
