"""`genq submit` and `genq jobs ...` as a person and a script use them: real `genq` processes
against a real API process and worker. At a terminal (a pty) the answer appears while it is
generated, then one summary line; piped, the output is the JSON record; every way a job can end
has its own exit code."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import pty
import select
import signal
import socket
import struct
import subprocess
import sys
import termios
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis

from cli.client import ExitCode
from cli.redis_server import EmbeddedRedis
from tests.conftest import ROOT, ApiProcess, WorkerProcess, suite_settings

pytestmark = pytest.mark.slow

#: Seconds per generated word: a job of N tokens runs about N / 10 s.
STEP_S = 0.1
#: Long enough for a few CLI processes to start on a loaded machine while a job still runs.
JOB_TIMEOUT_S = 8.0
PROMPT = "one two three four five six seven eight nine ten eleven twelve"


@dataclass
class Run:
    code: int
    stdout: str
    stderr: str
    #: Seconds from the first byte of stdout to the process's exit (at a terminal only).
    first_output_before_exit_s: float = 0.0


@pytest.fixture(scope="module")
def stack(redis_server: EmbeddedRedis, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ApiProcess]:
    """One API and one worker for the whole module (each test has its own API key, so it lists
    only its own jobs)."""
    redis.Redis.from_url(redis_server.url).flushall()
    tmp = tmp_path_factory.mktemp("cli")
    # Jobs longer than JOB_TIMEOUT_S fail with `timeout`: how the tests get a failed job.
    settings = suite_settings(redis_server.url, tmp / "genq", placeholder_step_s=STEP_S,
                              job_timeout_s=JOB_TIMEOUT_S, api_keys=["key-a", "key-ls"])  # fmt: skip
    worker = WorkerProcess(settings, tmp / "worker.log").wait_ready()
    api = ApiProcess(settings, tmp / "api.log")
    try:
        yield api.wait_ready()
    finally:
        api.close()
        worker.close()


def cli_env(api: ApiProcess, key: str | None = "key-a") -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GENQ_")}
    env |= {"GENQ_API_URL": api.url, "PYTHONPATH": str(ROOT)}
    if key:
        env["GENQ_API_KEY"] = key
    return env


def genq(env: dict[str, str], *args: str) -> Run:
    """`genq ARGS` with stdout piped, as a script runs it."""
    done = subprocess.run(
        [sys.executable, "-m", "cli.main", *args], env=env, cwd=ROOT, capture_output=True, text=True,
        timeout=60, stdin=subprocess.DEVNULL, check=False,
    )  # fmt: skip
    return Run(done.returncode, done.stdout, done.stderr)


#: `python -m cli.main` with Ctrl-C raising KeyboardInterrupt, as when a person's shell starts it:
#: a suite started in the background by a shell without job control (`make test &` in a script)
#: runs with SIGINT ignored, every child inherits that, and Python then never raises
#: KeyboardInterrupt (the CLI ran on to exit 0). Reset in the child itself, not by a preexec_fn
#: (unsafe beside the suite's threads).
AS_AT_A_TERMINAL = (
    "import runpy, signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
    "sys.argv[0] = 'genq'; runpy.run_module('cli.main', run_name='__main__', alter_sys=True)"
)


def genq_at_terminal(env: dict[str, str], *args: str, ctrl_c_at_first_output: bool = False) -> Run:
    """`genq ARGS` with stdout on a pseudo-terminal, as a person runs it (stderr piped); with
    ctrl_c_at_first_output, SIGINT as soon as it has printed something."""
    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 50, 160, 0, 0))  # a roomy terminal
    process = subprocess.Popen(
        [sys.executable, "-c", AS_AT_A_TERMINAL, *args], env=env, cwd=ROOT, stdout=follower,
        stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    os.close(follower)
    chunks: list[tuple[float, bytes]] = []
    while True:
        ready, _, _ = select.select([leader], [], [], 60)
        assert ready, "genq wrote nothing for 60 s"
        try:
            data = os.read(leader, 4096)
        except OSError:  # EIO: the process closed the terminal
            break
        if not data:
            break
        chunks.append((time.monotonic(), data))
        if ctrl_c_at_first_output and len(chunks) == 1:
            process.send_signal(signal.SIGINT)
    process.wait(60)
    exited = time.monotonic()
    os.close(leader)
    assert process.stderr is not None
    text = b"".join(data for _, data in chunks).decode().replace("\r\n", "\n")
    first = exited - chunks[0][0] if chunks else 0.0
    return Run(process.returncode, text, process.stderr.read().decode(), first)


def echoed(tokens: int) -> str:
    """What the placeholder model answers PROMPT with: its words again, one per token."""
    return " ".join((PROMPT.split() * 2)[:tokens])


def submitted(env: dict[str, str], max_tokens: int) -> str:
    """A new job's id (submitted piped, without waiting)."""
    run = genq(env, "submit", PROMPT, "--max-tokens", str(max_tokens))
    assert run.code == ExitCode.OK, run.stderr
    return str(json.loads(run.stdout)["id"])


def test_submit_at_a_terminal_streams_the_answer_then_one_summary_line(stack: ApiProcess) -> None:
    run = genq_at_terminal(cli_env(stack), "submit", PROMPT, "--max-tokens", "20")
    assert run.code == ExitCode.OK, run.stderr
    assert run.stdout == echoed(20) + "\n"  # the answer, and nothing else
    # 20 words at 0.1 s each: the first ones were on the screen well before the job ended.
    assert run.first_output_before_exit_s > 1.0, run
    (line,) = run.stderr.strip().splitlines()
    assert " succeeded · 20 tokens · " in line and "tokens/s" in line, line
    assert "queue " in line and "inference " in line, line
    job_id = line.split()[1]
    record = json.loads(genq(cli_env(stack), "jobs", "get", job_id).stdout)
    assert record["status"] == "succeeded" and record["output"]["text"] == run.stdout.strip()


def test_piped_submit_prints_the_record_as_before(stack: ApiProcess) -> None:
    env = cli_env(stack)
    queued = genq(env, "submit", "hello there", "--max-tokens", "2")
    assert queued.code == ExitCode.OK
    assert json.loads(queued.stdout)["status"] in ("queued", "running", "succeeded")
    finished = genq(env, "submit", "hello there", "--max-tokens", "4", "--wait")
    assert finished.code == ExitCode.OK, finished.stderr
    job = json.loads(finished.stdout)
    assert (job["status"], job["output"]["text"]) == ("succeeded", "hello there hello there")
    # --json at a terminal: the record, not the text.
    at_terminal = genq_at_terminal(env, "submit", "hi", "--max-tokens", "1", "--json", "--wait")
    assert json.loads(at_terminal.stdout)["output"]["text"] == "hi"


def test_exit_codes_say_how_the_job_ended(stack: ApiProcess) -> None:
    env = cli_env(stack)
    failed = genq(env, "submit", PROMPT, "--max-tokens", "100", "--wait")  # 10 s > the 8 s job timeout
    assert failed.code == ExitCode.FAILED, failed
    assert json.loads(failed.stdout)["error"]["type"] == "timeout"

    long_job = submitted(env, 70)  # 7 s: running while the next CLI commands start
    still_running = genq(env, "jobs", "wait", long_job, "--timeout", "0.5")
    assert still_running.code == ExitCode.TIMED_OUT
    assert json.loads(still_running.stdout)["status"] in ("queued", "running")
    canceled = genq(env, "jobs", "cancel", long_job)
    assert (canceled.code, json.loads(canceled.stdout)["status"]) == (ExitCode.OK, "canceled")
    assert genq(env, "jobs", "wait", long_job).code == ExitCode.CANCELED
    assert genq(env, "jobs", "wait", submitted(env, 3)).code == ExitCode.OK


def test_usage_and_api_errors_have_their_own_exit_codes(stack: ApiProcess) -> None:
    env = cli_env(stack)
    assert genq(env, "jobs", "ls", "--status", "bogus").code == ExitCode.USAGE
    too_long = genq(env, "submit", "x", "--max-tokens", "999999")
    assert too_long.code == ExitCode.USAGE
    assert "invalid_request" in too_long.stderr
    assert genq(env, "jobs", "get", "0" * 26).code == ExitCode.API_ERROR
    no_key = genq(cli_env(stack, key=None), "jobs", "ls")
    assert (no_key.code, "unauthorized" in no_key.stderr) == (ExitCode.API_ERROR, True)
    assert genq(cli_env(stack, key=None), "jobs", "ls", "--api-key", "key-a").code == ExitCode.OK
    down = genq(env | {"GENQ_API_URL": "http://127.0.0.1:9"}, "jobs", "ls")
    assert (down.code, "cannot reach" in down.stderr) == (ExitCode.API_ERROR, True)


def test_ls_get_and_stream_for_people_and_scripts(stack: ApiProcess) -> None:
    env = cli_env(stack, key="key-ls")
    job_id = submitted(env, 3)
    assert genq(env, "jobs", "wait", job_id).code == ExitCode.OK
    canceled = submitted(env, 30)
    genq(env, "jobs", "cancel", canceled)

    page = json.loads(genq(env, "jobs", "ls", "--status", "canceled").stdout)
    assert [job["id"] for job in page["data"]] == [canceled]
    table = genq_at_terminal(env, "jobs", "ls")
    assert job_id in table.stdout and canceled in table.stdout and "STATUS" in table.stdout
    assert "succeeded" in genq_at_terminal(env, "jobs", "get", job_id).stdout

    # stream replays an ended job's output: as text, or as JSON lines of events.
    text = genq(env, "jobs", "stream", job_id)
    assert (text.code, text.stdout) == (ExitCode.OK, "one two three\n")
    events = [json.loads(line) for line in genq(env, "jobs", "stream", job_id, "--json").stdout.splitlines()]
    assert "".join(e["delta"] for e in events if e["event"] == "output").strip() == "one two three"
    assert events[-1]["event"] == "done" and events[-1]["job"]["id"] == job_id


def test_submit_reads_the_prompt_from_stdin(stack: ApiProcess, tmp_path: Path) -> None:
    prompt = tmp_path / "prompt.txt"
    prompt.write_text("from a file")
    with prompt.open() as stdin:
        done = subprocess.run(
            [sys.executable, "-m", "cli.main", "submit", "--wait", "--max-tokens", "3"], env=cli_env(stack),
            cwd=ROOT, stdin=stdin, capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
    assert json.loads(done.stdout)["output"]["text"] == "from a file"


def test_ctrl_c_stops_following_and_leaves_the_job_running(stack: ApiProcess) -> None:
    env = cli_env(stack)
    run = genq_at_terminal(env, "submit", PROMPT, "--max-tokens", "24", ctrl_c_at_first_output=True)
    assert run.code == 130, run
    assert "interrupted; the job goes on" in run.stderr
    (job,) = json.loads(genq(env, "jobs", "ls", "--limit", "1").stdout)["data"]
    # Not canceled: running still, or already done when this loaded machine ran `ls` late (the job
    # takes ~2.4 s; starting the CLI twice under load took longer once).
    assert job["status"] in ("running", "succeeded")
    assert genq(env, "jobs", "wait", job["id"]).code == ExitCode.OK


class CuttingProxy:
    """A TCP proxy in front of the API that drops the first job stream's connection right after
    it has carried an output event, as a flaky network or a restarted ingress would."""

    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self.stream_requests: list[bytes] = []
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self._listener.getsockname()[1]}"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        upstream = socket.create_connection(("127.0.0.1", self.upstream_port))
        cut = threading.Event()  # this connection carries the first stream: drop it

        def requests() -> None:  # client to API; httpx reuses connections, so read every request
            with contextlib.suppress(OSError):
                while data := client.recv(65536):
                    if b"/stream HTTP/1.1" in data:
                        self.stream_requests.append(data)
                        if len(self.stream_requests) == 1:
                            cut.set()
                    upstream.sendall(data)
            _close(client, upstream)

        threading.Thread(target=requests, daemon=True).start()
        with contextlib.suppress(OSError):
            while data := upstream.recv(65536):
                client.sendall(data)
                if cut.is_set() and b"event: output" in data:
                    break
        _close(client, upstream)

    def close(self) -> None:
        self._listener.close()


def _close(*ends: socket.socket) -> None:
    for end in ends:
        with contextlib.suppress(OSError):
            end.shutdown(socket.SHUT_RDWR)
        end.close()


def test_a_dropped_stream_resumes_where_it_stopped(stack: ApiProcess) -> None:
    proxy = CuttingProxy(stack.port)
    try:
        run = genq_at_terminal(
            cli_env(stack) | {"GENQ_API_URL": proxy.url}, "submit", PROMPT, "--max-tokens", "19"
        )
    finally:
        proxy.close()
    assert run.code == ExitCode.OK, run.stderr
    assert run.stdout == echoed(19) + "\n"  # nothing lost, nothing twice
    first, second = proxy.stream_requests
    assert b"last-event-id:" not in first.lower() and b"last-event-id:" in second.lower()
