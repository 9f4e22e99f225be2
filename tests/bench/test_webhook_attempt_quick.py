"""`python -m bench.webhook_attempt --quick` runs as a user would run it, beside a base tree (here
this same tree, as a second side), and writes a sane report: every attempt answered, over http and
https, with a CPU cost and latencies for each side, and the ratios between them."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.webhook_attempt import SCHEMES, SHOWN
from tests.bench.test_quick import ROOT, run_quick

pytestmark = pytest.mark.slow


def test_webhook_attempt_quick(tmp_path: Path) -> None:
    report = run_quick("webhook_attempt", tmp_path, "--base", str(ROOT))
    assert {(run["side"], run["scheme"]) for run in report["runs"]} == {
        (side, scheme) for side in ("this", "base") for scheme in SCHEMES
    }
    for run in report["runs"]:
        assert run["failed"] == 0, run["errors"]
        assert run["cpu_us_per_attempt"] > 0 and 0 < run["latency_p50_us"] <= run["latency_p99_us"]
    assert set(report["ratios"]) == set(SCHEMES)
    assert all(report["ratios"][scheme][key] > 0 for scheme in SCHEMES for key in SHOWN)
