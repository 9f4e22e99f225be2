"""The chaos soak, quick: a real stack under every kind of fault for 35 s, then its independent
checker. Passes only when the stack kept genq's promise: 0 lost, 0 stuck, 0 duplicate completions,
0 bare 500s, nothing left dead (issue 14)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow


def run_chaos(out: Path) -> tuple[int, str, dict[str, Any]]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GENQ_")}
    completed = subprocess.run(
        [sys.executable, "-m", "bench.chaos", "--quick", "--out", str(out)],
        check=False, cwd=ROOT, env=env, capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    output = completed.stdout[-4000:] + completed.stderr[-4000:]
    report: dict[str, Any] = json.loads((out / "chaos.json").read_text())
    return completed.returncode, output, report


def test_chaos_quick(tmp_path: Path) -> None:
    code, output, report = run_chaos(tmp_path)
    assert (tmp_path / "chaos.png").stat().st_size > 0
    assert report["quick"] is True
    faults = report["faults"]
    assert faults["total"] >= 8, faults["by_kind"]
    assert set(faults["by_kind"]) == set(report["fault_kinds"])  # every kind was injected
    jobs = report["jobs"]
    assert jobs["accepted"] >= 100 and jobs["with_webhook"] > 0 and jobs["cancel_requested"] > 0
    assert jobs["by_status"].get("succeeded", 0) > 0 and jobs["cached"] > 0
    assert len(report["timeline"]["in_flight"]) > 0
    assert set(report["invariants"]) >= {
        "no_lost_jobs",
        "no_stuck_jobs",
        "one_completion_webhook",
        "no_bare_5xx",
    }
    # The promise itself: an invariant violated is a failure, with the checker's evidence shown.
    violated = {name: item for name, item in report["invariants"].items() if not item["ok"]}
    assert not violated, json.dumps(violated, indent=1)[:6000] + "\n" + output
    assert report["violations"] == 0 and code == 0, output
