"""`genq bench abuse --quick` runs as a user would run it and writes a sane report: every attack ran
and was answered, the API and worker lived through it, and key B's accepted jobs all succeeded (a
smoke test so the benchmark cannot rot; its timing targets are not judged here)."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.abuse_attacks import phase2_requests
from tests.bench.test_quick import assert_latencies, run_quick

pytestmark = pytest.mark.slow

#: How httpx reports a connection the server closed while the request's body was still being sent.
CLOSED = {"ReadError", "WriteError", "RemoteProtocolError"}


def test_abuse_quick(tmp_path: Path) -> None:
    report = run_quick("abuse", tmp_path)
    assert report["schema_compile_s"] > 0
    phases = report["phases"]
    assert set(phases) == {"alone", "attack", "full_redis"}
    for phase in phases.values():
        b = phase["b"]
        assert b["accepted"] > 0 and b["succeeded"] == b["accepted"], b
        assert_latencies(b, "submit_")
        assert_latencies(b, "finish_")
        assert phase["healthz"]["probes"] > 0
    uploads = report["setup"]["uploads"]
    ran = phases["attack"]["a"]
    # Every attack ran; a batch attack runs on its file unless the upload of that file was refused.
    expected = {name for name in phase2_requests({}) if not name.startswith("3_batch_")}
    expected |= {f"3_batch_{name}" for name, code in uploads.items() if code == 200}
    assert set(ran) == expected, set(ran) ^ expected
    for name, attack in ran.items():
        assert attack["requests"] >= 1, name
        # An upload refused before its body was read may be answered by closing the connection.
        closed = CLOSED if "upload" in name else set()
        answers = {code for code in attack["codes"] if code.isdigit() or code in closed}
        assert answers, (name, attack)
    fill = phases["full_redis"]["a"]
    assert fill["first_503_s"] is not None and "503" in fill["attacks"]["8_fill_redis"]["codes"]
    assert report["setup"]["metadata_jobs_seeded"] > 0
    for state in report["processes"].values():
        assert state["alive"] and state["same_pids"], state
    resources = report["resources"]
    assert resources["api_rss_mb_peak"] > 0 and resources["worker_rss_mb_peak"] > 0
    assert resources["redis_used_mb_peak"] > 0
    assert report["targets"]["b_accepted_jobs_succeeded"]["pass"]
