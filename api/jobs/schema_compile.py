"""Whether a `response_format`'s JSON schema compiles: asked once the caller is known, answered off
the event loop within a time and a memory budget, and once per distinct schema.

A few KB of allOf x anyOf take llguidance (shared/structured.py) most of a second of CPU and a
hundred MB to compile, and a thread cannot be stopped. So a schema is compiled in a small pool of
compile processes (`python -m api.jobs.schema_compile`), each under an address-space limit
(RLIMIT_AS) and a lower CPU priority (nice) it sets itself, so the event loop, the workers and
Redis win the CPU over a compile; one that overruns its time budget, or dies of its memory budget,
is killed and replaced, and the schema refused. llguidance's own bounds (grammar size, lexer) apply
inside. A key may have only so many compiles in flight (queued or running) at once, and spend only
so many CPU seconds compiling a minute (each compile process reports what its compile took): past
either it is refused (429 naming response_format), so one tenant cannot occupy the compile pool
nor a core with schemas made to miss the cache. Verdicts
are kept in an LRU keyed by the SHA-256 of the schema's canonical JSON, so a repeated schema costs
a hash, whoever sends it. The engine compiles its matchers itself (workers/engine/sampling/structured.py).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import select
import subprocess
import sys
import threading
import time
from collections import Counter, OrderedDict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import IO, TYPE_CHECKING, Any

from shared.errors import ConcurrencyLimited, InvalidRequest, RateLimited

if TYPE_CHECKING:
    from shared.config import Settings
    from shared.structured import ResponseFormat

#: What a new compile process may take to start (import llguidance) before it is given up on.
START_TIMEOUT_S = 60.0
#: The line a compile process writes once it is ready for schemas.
READY = b'"ready"'


@dataclass(frozen=True, slots=True)
class CompileBudget:
    """What one schema's compile may take, how many compile at once and at what CPU priority,
    how many one key may have in flight (0: any), how many verdicts are kept."""

    timeout_s: float
    memory_bytes: int
    workers: int = 1
    cache_entries: int = 4096
    nice: int = 10
    per_key: int = 1
    cpu_s_per_key_minute: float = 0.0

    @classmethod
    def of(cls, settings: Settings) -> CompileBudget:
        return cls(
            settings.schema_compile_timeout_s,
            settings.schema_compile_memory_mb << 20,
            settings.schema_compile_workers,
            settings.schema_cache_entries,
            settings.schema_compile_nice,
            settings.schema_compiles_per_key,
            settings.schema_compile_cpu_s_per_key_minute,
        )


def schema_digest(schema: dict[str, Any]) -> str:
    """The SHA-256 of the schema's canonical JSON (sorted keys, no whitespace, ASCII)."""
    canonical = json.dumps(schema, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


def schema_to_compile(response_format: ResponseFormat | None) -> dict[str, Any] | None:
    """The JSON schema a response format asks to be compiled; None for free text and any object
    (a constant grammar)."""
    if response_format is None or response_format.json_schema is None:
        return None
    return response_format.json_schema.json_schema


class CompileProcess:
    """One compile process and its pipes: started on first use, killed when it overruns."""

    def __init__(self, budget: CompileBudget) -> None:
        self._budget = budget
        self._process: subprocess.Popen[bytes] | None = None
        self._buffer = b""

    def verdict(self, schema: str) -> tuple[str | None, bool, float]:
        """Why `schema` (serialized) cannot be enforced (None: it can), whether the compile kept
        to its budget (one that did not is refused, and this process killed), and the CPU
        seconds it took (the whole time budget for one killed)."""
        try:
            self._send(schema)
        except BrokenPipeError:  # it died while idle: once more, in a new one
            self.stop()
            self._send(schema)
        try:
            line = self._line(time.monotonic() + self._budget.timeout_s)
        except EOFError:
            self.stop()
            memory_mb = self._budget.memory_bytes >> 20
            return (
                f"the JSON schema needs more than {memory_mb} MiB to compile",
                False,
                self._budget.timeout_s,
            )
        if line is None:
            self.stop()
            timeout_s = self._budget.timeout_s
            return f"the JSON schema is too complex to compile within {timeout_s:g} s", False, timeout_s
        error, cpu_s = json.loads(line)
        return (None if error is None else f"the JSON schema cannot be enforced: {error}"), True, cpu_s

    @property
    def pid(self) -> int | None:
        """The process's id while it runs."""
        return None if self._process is None else self._process.pid

    def stop(self) -> None:
        """Kill the process (a compile cannot be interrupted any other way)."""
        process, self._process, self._buffer = self._process, None, b""
        if process is not None:
            process.kill()
            process.wait()
            for pipe in (process.stdin, process.stdout):
                if pipe is not None:
                    pipe.close()

    def _send(self, schema: str) -> None:
        stdin = self._started().stdin
        assert stdin is not None
        stdin.write(json.dumps(schema).encode() + b"\n")
        stdin.flush()

    def _started(self) -> subprocess.Popen[bytes]:
        if self._process is None:
            budget = self._budget
            command = [
                sys.executable,
                "-m",
                "api.jobs.schema_compile",
                str(budget.memory_bytes),
                str(budget.nice),
            ]
            self._process = subprocess.Popen(
                command,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                bufsize=0,
                start_new_session=True,  # a scheduler group of its own (`lower_priority`)
            )
            try:
                ready = self._line(time.monotonic() + START_TIMEOUT_S)
            except EOFError:
                ready = None
            if ready != READY:
                self.stop()
                raise RuntimeError(
                    "no schema compile process started (GENQ_SCHEMA_COMPILE_MEMORY_MB too low?)"
                )
        return self._process

    def _line(self, deadline: float) -> bytes | None:
        """The process's next line, None past the deadline; EOFError when it died."""
        assert self._process is not None and self._process.stdout is not None
        out = self._process.stdout.fileno()
        while b"\n" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([out], [], [], left)[0]:
                return None
            chunk = os.read(out, 1 << 16)
            if not chunk:
                raise EOFError("the compile process exited")
            self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        return line


class CompileAllowance:
    """CPU seconds of compiling each key may still spend: `per_minute` of them, refilled evenly
    over a minute and held up to a minute's worth. A compile is charged what it took once it
    ends, so a key may run into debt by one compile; it is refused until the debt is repaid."""

    def __init__(self, per_minute: float) -> None:
        self._most, self._per_s = per_minute, per_minute / 60
        self._left: dict[str, tuple[float, float]] = {}  # key -> (seconds left, when)

    def check(self, owner: str) -> None:
        """RateLimited (naming response_format, with Retry-After) when `owner` has none left."""
        left = self._now_left(owner)
        if self._most and left <= 0:
            raise RateLimited(
                f"response_format: this key spent its {self._most:g} CPU seconds a minute of schema "
                "compiling (GENQ_SCHEMA_COMPILE_CPU_S_PER_KEY_MINUTE); schemas already compiled "
                "need none",
                limit=round(self._most),
                remaining=0,
                reset_s=(self._most - left) / self._per_s,
                retry_after_s=-left / self._per_s,
                param="response_format",
            )

    def charge(self, owner: str, cpu_s: float) -> None:
        if self._most and cpu_s > 0:
            self._left[owner] = (self._now_left(owner) - cpu_s, time.monotonic())

    def _now_left(self, owner: str) -> float:
        left, when = self._left.get(owner, (self._most, 0.0))
        return min(self._most, left + (time.monotonic() - when) * self._per_s)


class SchemaChecker:
    """Verdicts on response formats' schemas for one API process: cached, else compiled in one of
    `budget.workers` compile processes. `check` is for the event loop, `verdict` for a thread."""

    def __init__(self, budget: CompileBudget) -> None:
        self.budget = budget
        #: Schemas sent to a compile process (cache misses), and those of them stopped over a
        #: budget: what tests and operators count.
        self.compiles = 0
        self.overruns = 0
        #: Compiles each key has in flight from check() (queued or running); the event loop's only.
        self._in_flight: Counter[str] = Counter()
        #: Compiles in flight by schema digest: a request for a schema being compiled waits for
        #: that compile, whoever asked first, and takes no slot of its own (the event loop's only).
        self._pending: dict[str, asyncio.Future[tuple[str | None, float]]] = {}
        self._allowance = CompileAllowance(budget.cpu_s_per_key_minute)
        self._lock = threading.Lock()
        self._verdicts: OrderedDict[str, str | None] = OrderedDict()
        self._processes = tuple(CompileProcess(budget) for _ in range(budget.workers))
        self._idle = list(self._processes)
        self._free = threading.Semaphore(budget.workers)
        self._threads = ThreadPoolExecutor(budget.workers, thread_name_prefix="genq-schema-compile")

    async def check(self, response_format: ResponseFormat | None, owner: str) -> None:
        """Raise InvalidRequest naming response_format unless its schema compiles within budget;
        ConcurrencyLimited (429) when it must be compiled and `owner` has its most in flight."""
        schema = schema_to_compile(response_format)
        if schema is None:
            return
        digest = schema_digest(schema)
        found, verdict = self._cached(digest)
        if not found:
            pending = self._pending.get(digest)
            if pending is not None:
                verdict, _ = await asyncio.shield(pending)
            else:
                verdict = await self._compiled_for(owner, schema, digest)
        if verdict is not None:
            raise InvalidRequest(f"response_format: {verdict}", param="response_format")

    async def _compiled_for(self, owner: str, schema: dict[str, Any], digest: str) -> str | None:
        """The verdict of a compile counted as `owner`'s until it ends, even when the request
        waiting for it goes away first (a thread's compile cannot be stopped)."""
        most = self.budget.per_key
        if most and self._in_flight[owner] >= most:
            raise ConcurrencyLimited(
                f"response_format: this key already has {most} schema compile(s) in flight "
                "(GENQ_SCHEMA_COMPILES_PER_KEY); retry once they end",
                limit_name="response_format",
                limit=most,
            )
        self._allowance.check(owner)
        self._in_flight[owner] += 1
        loop = asyncio.get_running_loop()
        compiled = loop.run_in_executor(self._threads, self._compiled, schema, digest)
        self._pending[digest] = compiled
        compiled.add_done_callback(lambda done: self._ended(owner, digest, done))
        verdict, _ = await asyncio.shield(compiled)
        return verdict

    def _ended(self, owner: str, digest: str, compiled: asyncio.Future[tuple[str | None, float]]) -> None:
        self._pending.pop(digest, None)
        if not compiled.cancelled() and compiled.exception() is None:
            self._allowance.charge(owner, compiled.result()[1])
        self._in_flight[owner] -= 1
        if self._in_flight[owner] <= 0:
            del self._in_flight[owner]

    def verdict(self, response_format: ResponseFormat | None) -> str | None:
        """Why the response format's schema cannot be enforced, None when it can. Blocking: for a
        thread (a batch's validation)."""
        schema = schema_to_compile(response_format)
        if schema is None:
            return None
        digest = schema_digest(schema)
        found, verdict = self._cached(digest)
        return verdict if found else self._compiled(schema, digest)[0]

    def pids(self) -> list[int]:
        """The ids of the compile processes running now (started on first use)."""
        return [pid for process in self._processes if (pid := process.pid) is not None]

    def close(self) -> None:
        """Stop the compile processes (the API process is shutting down)."""
        self._threads.shutdown(wait=False, cancel_futures=True)
        for process in self._processes:
            process.stop()

    def _cached(self, digest: str) -> tuple[bool, str | None]:
        with self._lock:
            if digest not in self._verdicts:
                return False, None
            self._verdicts.move_to_end(digest)
            return True, self._verdicts[digest]

    def _compiled(self, schema: dict[str, Any], digest: str) -> tuple[str | None, float]:
        """Compile in an idle process (waiting for one), and keep the verdict: it, and the CPU
        seconds the compile took (0 when the request ahead compiled it meanwhile)."""
        with self._free:
            found, verdict = self._cached(digest)  # compiled meanwhile, by the request ahead
            if found:
                return verdict, 0.0
            with self._lock:
                process = self._idle.pop()
                self.compiles += 1
            try:
                verdict, kept_to_budget, cpu_s = process.verdict(json.dumps(schema))
            finally:
                with self._lock:
                    self._idle.append(process)
        self._keep(digest, verdict, kept_to_budget)
        return verdict, cpu_s

    def _keep(self, digest: str, verdict: str | None, kept_to_budget: bool) -> None:
        with self._lock:
            self.overruns += not kept_to_budget
            if self.budget.cache_entries:
                self._verdicts[digest] = verdict
                while len(self._verdicts) > self.budget.cache_entries:
                    self._verdicts.popitem(last=False)


def lower_priority(nice: int) -> None:
    """Add `nice` to this process's niceness, and give its session's scheduler group (Linux's
    autogroup, one per session) the same: where autogroups are on, a niceness counts only against
    processes of the same session, so the compile process leads a session of its own (it is
    started with one) whose group yields the CPU to the API's, the workers' and Redis's."""
    niceness = os.nice(nice)
    try:
        with open("/proc/self/autogroup", "w") as group:
            group.write(str(niceness))
    except OSError:  # no autogroups here (another OS, or a kernel without them): the nice is enough
        pass


def serve(memory_bytes: int, nice: int, source: IO[bytes], sink: IO[bytes]) -> None:
    """A compile process: under its memory budget and `nice` more niceness than the API process,
    answers each schema line with its verdict."""
    import resource

    lower_priority(nice)
    resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))
    from shared.structured import grammar_error

    sink.write(READY + b"\n")
    sink.flush()
    for line in source:
        started = time.process_time()
        error = grammar_error(json.loads(line))
        sink.write(json.dumps([error, time.process_time() - started]).encode() + b"\n")
        sink.flush()


if __name__ == "__main__":
    serve(int(sys.argv[1]), int(sys.argv[2]), sys.stdin.buffer, sys.stdout.buffer)
