"""bench/http_reference.py's llama-server start on a CPU where llama.cpp's repacked weight kernels
crash (seen: SIGILL and SIGSEGV on a 2-core VM reporting AMX): it is started again with -nr and the
report says so. The stand-in for llama-server is a small Python script (no llama.cpp build here):
killed by SIGILL as it starts without -nr, else it answers /health as llama-server does once its
model is loaded. (The whole comparison with the real tools: tests/bench/test_engine_reference_quick.py.)"""

from __future__ import annotations

import signal
import sys
from pathlib import Path
from typing import Any
from urllib.request import urlopen

from bench.common import bench_stack
from bench.http_reference import start_llama_server
from bench.llamacpp_reference import REPACK_CRASHED, Reference

STAND_IN = """\
import http.server, os, signal, sys
if "-nr" not in sys.argv:
    os.kill(os.getpid(), signal.SIGILL)
class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.send_header("content-length", "15")
        self.end_headers()
        self.wfile.write(b'{"status":"ok"}')
    def log_message(self, *_):
        pass
port = int(sys.argv[sys.argv.index("--port") + 1])
http.server.HTTPServer(("127.0.0.1", port), Health).serve_forever()
"""


def test_a_llama_server_killed_by_a_signal_as_it_starts_is_started_with_no_repack(tmp_path: Path) -> None:
    tool = tmp_path / "llama-server"
    tool.write_text(f"#!{sys.executable}\n{STAND_IN}")
    tool.chmod(0o755)
    reference = Reference(tool, tool, tmp_path, "given")
    report: dict[str, Any] = {}
    with bench_stack("http-reference-test") as (stack, scratch):
        port, pids = start_llama_server(stack, scratch, reference, tmp_path / "model.gguf", 1, report)
        with urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as answer:
            assert answer.status == 200
        cmdline = Path(f"/proc/{pids[0]}/cmdline").read_bytes().split(b"\0")
    assert b"-nr" in cmdline
    assert report == {"llama_server_fallback": REPACK_CRASHED.format(code=-signal.SIGILL)}
