"""What one webhook attempt costs the worker: CPU and latency of one POST on a kept connection.

    python -m bench.webhook_attempt                          # this tree alone: 3,000 attempts, 5 rounds
    python -m bench.webhook_attempt --base /tmp/base-h2      # and another tree's client beside it
    python -m bench.webhook_attempt --quick [--base DIR]     # 200 attempts, one round: a smoke test

Each side is one process running the webhook client of its tree (`post`, as a delivery calls it:
the SSRF check with its fresh resolution, the pinned kept-alive connection, the capped answer),
which makes its attempts one after another to a loopback receiver in this process (HTTP/1.1
keep-alive, answering 200 at once), over http and over https (a throwaway CA's certificate for
127.0.0.1, trusted by the side's TLS settings). Measured in the side's process: its CPU per attempt
(time.process_time) and each attempt's latency, after a warm-up. `--base` runs a second tree (e.g.
`git worktree add /tmp/base-h2 180958b`) in the same run, the sides alternating, the order flipped
each round; the ratios are this tree over the base. Writes <out>/webhook_attempt.json and a plot.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import socket
import ssl
import statistics
import subprocess
import sys
import tempfile
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import trustme

from bench.common import ROOT, machine, parse_args, print_table, ratio, write_report

FULL_ATTEMPTS, FULL_ROUNDS = 3000, 5
QUICK_ATTEMPTS, QUICK_ROUNDS = 200, 1
#: Attempts made before the measured ones (the first connection, imports warmed).
WARM_UP = 50
SCHEMES = ("http", "https")
#: What the receiver answers every request.
ANSWER = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok"
#: A `job.completed` body about as large as a short job's.
BODY = json.dumps(
    {"type": "job.completed", "timestamp": "2026-12-07T00:00:00Z",
     "data": {"id": "job_" + "x" * 22, "status": "succeeded", "output": "word " * 100}}
).encode()  # fmt: skip
HEADERS = {"webhook-id": "msg_job_xxxxxxxxxxxxxxxxxxxxxx_completed", "webhook-timestamp": "1765000000",
           "webhook-signature": "v1," + "A" * 43 + "="}  # fmt: skip

#: One side's attempts, run with the side's tree first on the path: argv is the client module, its
#: TLS settings (module:function), the URL, the CA file, the attempts and the warm-up.
ATTEMPTS = """
import importlib, json, sys, time
module, tls, url, cafile, count, warm = sys.argv[1:7]
from shared.ssrf import TargetPolicy
client = importlib.import_module(module)
tls_module, _, tls_name = tls.partition(":")
getattr(importlib.import_module(tls_module), tls_name)().load_verify_locations(cafile)
policy = TargetPolicy(allow_private=True, allowed_ports=frozenset())
body, headers = sys.stdin.buffer.read(), json.loads(sys.argv[7])
errors, latencies = [], []
def attempt():
    started = time.perf_counter()
    result = client.post(url, body, headers, policy, 10.0)
    latencies.append(time.perf_counter() - started)
    if result.status_code != 200:
        errors.append(result.error or str(result.status_code))
for _ in range(int(warm)):
    attempt()
errors.clear(); latencies.clear()
cpu = time.process_time()
for _ in range(int(count)):
    attempt()
cpu = time.process_time() - cpu
print(json.dumps({"cpu_s": cpu, "latencies_s": latencies, "errors": errors[:5], "failed": len(errors)}))
"""


class Receiver:
    """A loopback receiver answering ANSWER to every request, each connection kept alive on a thread
    of its own; over TLS when given a server context."""

    def __init__(self, tls: ssl.SSLContext | None) -> None:
        self._tls = tls
        self._listener = socket.create_server(("127.0.0.1", 0), backlog=128)
        self.port = int(self._listener.getsockname()[1])
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        try:
            if self._tls is not None:
                conn = self._tls.wrap_socket(conn, server_side=True)
            with conn:
                buffered = b""
                while (request := _next_request(conn, buffered)) is not None:
                    buffered = request
                    conn.sendall(ANSWER)
        except OSError:  # the client closed, or its handshake failed
            return

    def close(self) -> None:
        self._listener.close()


def _next_request(conn: socket.socket, buffered: bytes) -> bytes | None:
    """Read one whole request (its head, then content-length bytes of body); what came after it,
    or None when the client closed."""
    while b"\r\n\r\n" not in buffered:
        if not (chunk := conn.recv(65536)):
            return None
        buffered += chunk
    head, _, rest = buffered.partition(b"\r\n\r\n")
    found = re.search(rb"(?im)^content-length:\s*(\d+)", head)
    length = int(found.group(1)) if found else 0
    while len(rest) < length:
        if not (chunk := conn.recv(65536)):
            return None
        rest += chunk
    return rest[length:]


def client_of(tree: Path) -> tuple[str, str]:
    """The webhook client module of `tree` and where its TLS settings come from (module:function)."""
    if (tree / "workers" / "webhooks" / "client.py").exists():
        return "workers.webhooks.client", "workers.webhooks.connections:tls_context"
    return "workers.webhook_http", "workers.webhook_http:_tls_context"  # before workers/webhooks/


def run_side(tree: Path, url: str, cafile: Path, attempts: int) -> dict[str, Any]:
    """One side's measured attempts to `url`, made by a process on `tree`'s code."""
    module, tls = client_of(tree)
    env = {**os.environ, "PYTHONPATH": str(tree), "PYTHONSAFEPATH": "1"}
    argv = [sys.executable, "-c", ATTEMPTS, module, tls, url, str(cafile), str(attempts), str(WARM_UP),
            json.dumps(HEADERS)]  # fmt: skip
    done = subprocess.run(argv, input=BODY, env=env, capture_output=True, check=False, timeout=600)
    if done.returncode != 0:
        raise RuntimeError(f"{tree}: {done.stderr.decode()[-2000:]}")
    measured = json.loads(done.stdout)
    latencies_us = sorted(seconds * 1e6 for seconds in measured["latencies_s"])
    return {
        "attempts": attempts,
        "failed": measured["failed"],
        "errors": measured["errors"],
        "cpu_us_per_attempt": round(measured["cpu_s"] * 1e6 / attempts, 1),
        "latency_p50_us": round(statistics.median(latencies_us), 1),
        "latency_p99_us": round(latencies_us[int(len(latencies_us) * 0.99) - 1], 1),
    }


def measure(trees: dict[str, Path], attempts: int, rounds: int, scratch: Path) -> dict[str, Any]:
    ca = trustme.CA()
    cafile = scratch / "ca.pem"
    ca.cert_pem.write_to_path(str(cafile))
    server_tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1").configure_cert(server_tls)
    receivers = {"http": Receiver(None), "https": Receiver(server_tls)}
    runs = []
    try:
        for number in range(rounds):
            order = list(trees) if number % 2 == 0 else list(reversed(trees))
            for side in order:
                for scheme, receiver in receivers.items():
                    url = f"{scheme}://127.0.0.1:{receiver.port}/hook"
                    run = {"round": number + 1, "side": side, "scheme": scheme,
                           **run_side(trees[side], url, cafile, attempts)}  # fmt: skip
                    print(f"  round {number + 1} {side} {scheme}: {run['cpu_us_per_attempt']} us CPU, "
                          f"p50 {run['latency_p50_us']} us", flush=True)  # fmt: skip
                    runs.append(run)
    finally:
        for receiver in receivers.values():
            receiver.close()
    return {"runs": runs, "medians": medians(runs, list(trees))}


#: What each side's medians hold, per scheme.
SHOWN = ("cpu_us_per_attempt", "latency_p50_us", "latency_p99_us")


def medians(runs: list[dict[str, Any]], sides: list[str]) -> dict[str, Any]:
    return {
        side: {
            scheme: {
                key: statistics.median(r[key] for r in runs if (r["side"], r["scheme"]) == (side, scheme))
                for key in SHOWN
            }
            for scheme in SCHEMES
        }
        for side in sides
    }


def ratios(report: dict[str, Any]) -> dict[str, Any]:
    """This tree's medians over the base's, per scheme (below 1: this tree costs less)."""
    ours, base = report["medians"]["this"], report["medians"]["base"]
    return {scheme: {key: ratio(ours[scheme][key], base[scheme][key]) for key in SHOWN} for scheme in SCHEMES}


def plot(report: dict[str, Any], path: Path) -> None:
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(1, 2, figsize=(9, 3.6))
    sides = list(report["medians"])
    for axis, key, label in zip(axes, ("cpu_us_per_attempt", "latency_p50_us"), ("CPU", "latency p50"),
                                strict=True):  # fmt: skip
        width = 0.8 / len(sides)
        for offset, side in enumerate(sides):
            values = [report["medians"][side][scheme][key] for scheme in SCHEMES]
            positions = [index + (offset - (len(sides) - 1) / 2) * width for index in range(len(SCHEMES))]
            axis.bar(positions, values, width=width, label=f"{side} ({report['trees'][side]})")
        axis.set_xticks(range(len(SCHEMES)), SCHEMES)
        axis.set(ylabel="µs", title=f"Webhook attempt {label}, median of {report['rounds']}")
        axis.legend(fontsize=7)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def add_base_option(parser: argparse.ArgumentParser) -> None:
    """--base DIR: another tree (a `git worktree` of the commit before a change) measured beside this one."""
    parser.add_argument("--base", type=Path, default=None, help="another tree, measured beside this one")


def tree_commit(tree: Path) -> str:
    """The commit `tree` is checked out at (short), or its path when it is no git tree."""
    done = subprocess.run(["git", "-C", str(tree), "rev-parse", "--short", "HEAD"], capture_output=True,
                          text=True, check=False)  # fmt: skip
    return done.stdout.strip() or str(tree)


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    args = parse_args(__doc__, "webhook_attempt", argv, add_base_option)
    attempts, rounds = (QUICK_ATTEMPTS, QUICK_ROUNDS) if args.quick else (FULL_ATTEMPTS, FULL_ROUNDS)
    trees = {"this": ROOT} | ({"base": args.base.resolve()} if args.base else {})
    report: dict[str, Any] = {
        "quick": args.quick, "machine": machine(), "attempts": attempts, "rounds": rounds,
        "trees": {side: tree_commit(tree) for side, tree in trees.items()},
    }  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="genq-bench-webhook-attempt-") as scratch:
        report.update(measure(trees, attempts, rounds, Path(scratch)))
    if args.base:
        report["ratios"] = ratios(report)
    rows = [[side, scheme, *(m[scheme][key] for key in SHOWN)]
            for side, m in report["medians"].items() for scheme in SCHEMES]  # fmt: skip
    print_table(f"One webhook attempt on a kept connection (medians of {rounds} round(s))",
                ["side", "scheme", "CPU µs", "p50 µs", "p99 µs"], rows)  # fmt: skip
    if args.base:
        print("this / base:", json.dumps(report["ratios"]))
    write_report(args.out, "webhook_attempt", report, plot)
    return report


if __name__ == "__main__":
    main()
