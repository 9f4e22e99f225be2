"""cli/main.py, the `genq` command: it refuses to serve the API or Flower unauthenticated off
loopback (exit 2, saying what to set), `genq health worker` answers from the worker's ready file,
`genq drain` signals the worker in the pidfile and waits for it, and `genq settings` prints or
rewrites the README's table. (Submitting and following jobs: tests/cli/test_jobs.py; `genq up`:
tests/test_local_stack.py.)"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner, Result

from cli.main import app
from cli.settings_doc import END_MARK, START_MARK, markdown_table
from shared.settings.types import is_loopback as _is_loopback


def _genq(tmp_path: Path, *args: str, **env: str) -> Result:
    values = {"GENQ_DATA_DIR": str(tmp_path), "GENQ_REDIS_URL": "redis://127.0.0.1:1/0"} | env
    return CliRunner().invoke(app, list(args), env=values)


LOOPBACK = [("localhost", True), ("127.0.0.1", True), ("::1", True), ("0.0.0.0", False), ("10.0.0.5", False),
            ("example.com", False)]  # fmt: skip


@pytest.mark.parametrize(("host", "loopback"), LOOPBACK)
def test_loopback_hosts(host: str, loopback: bool) -> None:
    assert _is_loopback(host) is loopback


def test_the_api_refuses_to_serve_anonymously_off_loopback(tmp_path: Path) -> None:
    result = _genq(tmp_path, "api", "--host", "0.0.0.0")
    assert result.exit_code == 2
    assert "refusing to serve anonymously on 0.0.0.0: set GENQ_API_KEYS" in result.output


def test_flower_refuses_to_run_off_loopback_without_basic_auth(tmp_path: Path) -> None:
    result = _genq(tmp_path, "flower", "--address", "0.0.0.0")
    assert result.exit_code == 2
    assert "without GENQ_FLOWER_BASIC_AUTH" in result.output


def test_health_worker_follows_the_ready_file(tmp_path: Path) -> None:
    not_ready = _genq(tmp_path, "health", "worker")
    assert (not_ready.exit_code, not_ready.output.strip()) == (1, "not ready")
    (tmp_path / "worker.pid").write_text("4242\n")
    ready = tmp_path / "worker-4242.ready"
    ready.touch()
    healthy = _genq(tmp_path, "health", "worker", GENQ_HEARTBEAT_TTL_S="30")
    assert (healthy.exit_code, healthy.output.strip()) == (0, "ok")
    stale = time.time() - 60  # the heartbeat stopped touching it
    os.utime(ready, (stale, stale))
    assert _genq(tmp_path, "health", "worker", GENQ_HEARTBEAT_TTL_S="30").exit_code == 1


def test_drain_without_a_worker_says_so(tmp_path: Path) -> None:
    result = _genq(tmp_path, "drain")
    assert result.exit_code == 0 and f"no worker pidfile at {tmp_path / 'worker.pid'}" in result.output


#: A stand-in worker that takes a moment to drain after SIGTERM, as a real one finishes its jobs.
#: Started by a parent that exits at once, so that, as with a real worker, it is not this test's
#: child: a child of ours that exited would stay a zombie, which `kill 0` still finds.
DRAINING_WORKER = """
import subprocess, sys
body = "import signal, sys, time\\n"
body += "signal.signal(signal.SIGTERM, lambda *_: (time.sleep(0.5), sys.exit(0)))\\n"
body += "open(sys.argv[1], 'w').close()\\ntime.sleep(60)"
print(subprocess.Popen([sys.executable, "-c", body, sys.argv[1]], start_new_session=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).pid)
"""


def test_drain_signals_the_worker_and_waits_for_it(tmp_path: Path) -> None:
    armed = tmp_path / "armed"
    pid = int(subprocess.check_output([sys.executable, "-c", DRAINING_WORKER, str(armed)], text=True))
    deadline = time.monotonic() + 10
    while not armed.exists() and time.monotonic() < deadline:  # its SIGTERM handler is installed
        time.sleep(0.05)
    (tmp_path / "worker.pid").write_text(str(pid))
    started = time.monotonic()
    result = _genq(tmp_path, "drain", "--timeout", "10")
    assert result.exit_code == 0 and time.monotonic() - started >= 0.5
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


def test_settings_prints_and_rewrites_the_readme_table(tmp_path: Path) -> None:
    printed = _genq(tmp_path, "settings")
    assert printed.exit_code == 0 and printed.output.strip() == markdown_table()
    readme = tmp_path / "README.md"
    readme.write_text(f"intro\n{START_MARK}\nold\n{END_MARK}\nrest\n")
    assert _genq(tmp_path, "settings", "--readme", str(readme)).exit_code == 0
    assert readme.read_text() == f"intro\n{START_MARK}\n{markdown_table()}\n{END_MARK}\nrest\n"
