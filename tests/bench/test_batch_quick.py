"""`genq bench batch --quick` runs as a user would run it and writes a sane report (a smoke test
so the benchmark cannot rot; its numbers are not judged here)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.bench.test_quick import assert_latencies, run_quick

pytestmark = pytest.mark.slow


def test_batch_quick(tmp_path: Path) -> None:
    report = run_quick("batch", tmp_path)
    assert report["status"] == "completed" and report["lines"] == 300
    assert report["request_counts"] == {"total": 300, "completed": 300, "failed": 0}
    assert report["output"] == {"lines": 300, "distinct_custom_ids": 300, "completion_tokens": 300 * 8}
    assert report["completion_tokens_per_s"] > 0
    assert report["lines_per_s"] > 0 and report["upload_s"] > 0 and report["validation_s"] >= 0
    assert report["redis_peak_mb"] >= report["redis_idle_mb"] > 0 and report["api_rss_peak_mb"] > 0
    assert_latencies(report["interactive_idle"])
    assert_latencies(report["interactive_during"])
    assert report["interactive_p50_ratio"] > 0 and report["samples"]
