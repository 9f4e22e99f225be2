"""Child processes of `genq up` (cli/stack.py), Redis included (cli/redis_server.py)."""

from __future__ import annotations

import ctypes
import signal
import subprocess
import sys
from collections.abc import Mapping, Sequence


def start_supervised(
    args: Sequence[str], env: Mapping[str, str] | None = None, quiet: bool = False
) -> subprocess.Popen[bytes]:
    """Start a child that its supervisor alone stops: in a process group of its own, so a
    terminal's Ctrl-C (SIGINT to the whole foreground group) reaches only the supervisor, which
    then stops its children in order; and, on Linux, sent SIGTERM when the supervisor dies, so a
    supervisor that is killed outright leaves nothing running."""
    output = subprocess.DEVNULL if quiet else None
    # preexec_fn is unsafe only in a process with other threads; `genq up` has none, and prctl is
    # a single system call.
    return subprocess.Popen(
        list(args), env=env, stdout=output, stderr=output, process_group=0,
        preexec_fn=_terminate_with_parent if sys.platform == "linux" else None,  # noqa: PLW1509
    )  # fmt: skip


def _terminate_with_parent() -> None:
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # 1 = PR_SET_PDEATHSIG
