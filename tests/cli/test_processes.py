"""cli/processes.py: a child of `genq up` is stopped by its supervisor alone. It runs in a process
group of its own (a terminal's Ctrl-C reaches only the supervisor), and it is sent SIGTERM when
its supervisor dies (a killed `genq up` leaves nothing running). Real processes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from cli.processes import start_supervised
from tests.conftest import ROOT

#: A supervisor that starts a sleeping child the supervised way, says its pid, and waits.
SUPERVISOR = """
import sys, time
from cli.processes import start_supervised
from tests.conftest import ROOT
child = start_supervised([sys.executable, "-c", "import time; time.sleep(60)"])
print(child.pid, flush=True)
time.sleep(60)
"""


def _gone(pid: int, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.05)
    return False


def test_a_child_runs_in_a_process_group_of_its_own() -> None:
    child = start_supervised([sys.executable, "-c", "import time; time.sleep(60)"], quiet=True)
    try:
        assert os.getpgid(child.pid) == child.pid != os.getpgid(0)
    finally:
        child.terminate()
        child.wait(10)


@pytest.mark.skipif(sys.platform != "linux", reason="PR_SET_PDEATHSIG is Linux's")
def test_a_child_ends_when_its_supervisor_is_killed() -> None:
    supervisor = subprocess.Popen([sys.executable, "-c", SUPERVISOR], stdout=subprocess.PIPE, text=True,
                                  env=os.environ | {"PYTHONPATH": str(ROOT)})  # fmt: skip
    assert supervisor.stdout is not None
    child_pid = int(supervisor.stdout.readline())
    os.kill(child_pid, 0)  # running
    supervisor.send_signal(signal.SIGKILL)
    supervisor.wait(10)
    assert _gone(child_pid, 10)
