"""Fuzz the API with Schemathesis against its own OpenAPI document, over real HTTP to a real
`genq api` process: no 5xx, and every response matches the documented status codes and schemas."""

from __future__ import annotations

import random
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from cli.redis_server import EmbeddedRedis
from shared.config import Settings
from tests.conftest import ApiProcess, WorkerProcess

CHECKS = [
    "not_a_server_error",
    "status_code_conformance",
    "content_type_conformance",
    "response_schema_conformance",
]


@pytest.fixture(scope="module")
def api_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    data = tmp_path_factory.mktemp("fuzz")
    redis_server = EmbeddedRedis(data / "redis", appendonly=False)
    redis_server.start()
    settings = Settings(
        _env_file=None,
        redis_url=redis_server.url,
        model="placeholder-echo",
        data_dir=data,
        rate_limit_submit="",
        rate_limit_read="",
        max_wait_s=1,
        placeholder_step_s=0,
        worker_metrics_port=0,
    )
    worker = WorkerProcess(settings, data / "worker.log").wait_ready()  # jobs end; OpenAI calls answer
    api = ApiProcess(settings, data / "api.log").wait_ready()
    yield api.url
    api.close()
    worker.close()
    redis_server.stop()


#: Fixed seeds (207200094770492595203603346250873041724 found a cursor that `str.isdigit()`
#: accepted and int() refused), plus one drawn per run: a fixed seed alone tests the same 30
#: examples forever, a random one alone passes or fails by luck. A failure prints its seed.
SEEDS = [1, 207200094770492595203603346250873041724, random.SystemRandom().getrandbits(64)]


@pytest.mark.parametrize("seed", SEEDS, ids=["1", "cursor", "random"])
def test_api_conforms_to_its_openapi_document(api_url: str, tmp_path: Path, seed: int) -> None:
    # Schemathesis's CLI (its pytest plugin does not load under pytest 9): a non-zero exit is a
    # failed check; its output names the operation and a reproducing curl command.
    result = subprocess.run(
        [str(Path(sys.executable).parent / "schemathesis"), "run", f"{api_url}/openapi.json",
         "--checks", ",".join(CHECKS), "--max-examples", "30", "--seed", str(seed),
         "--suppress-health-check", "all", "--report-dir", str(tmp_path),
         # Its 503 is the designed answer while no worker is ready (tests/api/routes/test_ops.py).
         "--exclude-path", "/readyz"],
        cwd=tmp_path, capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert result.returncode == 0, f"--seed {seed}\n" + result.stdout[-6000:] + result.stderr[-2000:]
