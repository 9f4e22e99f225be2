"""cli/stack.py: a part of `genq up` that cannot start stops the whole stack: the others get their
SIGTERM, Redis stops last, and `genq up` exits 1, leaving nothing running. (Webhooks and Ctrl-C on
a running stack: tests/test_local_stack.py.) Real processes: here the API cannot bind its port."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from cli.redis_server import free_port
from tests.conftest import ROOT

pytestmark = pytest.mark.slow


def test_a_part_that_cannot_start_stops_the_stack(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        env = {k: v for k, v in os.environ.items() if not k.startswith("GENQ_")} | {
            "GENQ_DATA_DIR": str(tmp_path / "genq"), "GENQ_MODEL": "placeholder-echo",
            "GENQ_API_HOST": "127.0.0.1", "GENQ_API_PORT": str(taken.getsockname()[1]),
            "GENQ_FLOWER_PORT": str(free_port()), "GENQ_WORKER_METRICS_PORT": "0",
            "GENQ_DRAIN_TIMEOUT_S": "10",
        }  # fmt: skip
        up = subprocess.Popen(
            [sys.executable, "-m", "cli.main", "up"], env=env, cwd=ROOT, text=True,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
        try:
            output, _ = up.communicate(timeout=120)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(up.pid, signal.SIGKILL)
    assert up.returncode == 1, output[-3000:]
    redis_port = int(output.split("embedded Redis on redis://127.0.0.1:")[1].split("/")[0])
    with socket.socket() as probe:
        assert probe.connect_ex(("127.0.0.1", redis_port)) != 0, "Redis still running"
    # Every child of the stack is gone (they run in process groups of their own, so the group
    # kill above would not have reached them).
    assert _running_with(f"GENQ_DATA_DIR={tmp_path / 'genq'}") == [], output[-3000:]


def _running_with(variable: str) -> list[int]:
    """Processes whose environment holds `variable` (the stack's children inherit its env)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            if variable.encode() in (entry / "environ").read_bytes().split(b"\0"):
                found.append(int(entry.name))
    return found
