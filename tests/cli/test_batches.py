"""`genq batch submit FILE.jsonl [--wait]`, `genq batch get|cancel` as a script runs them: real
`genq` processes against a real API process and worker."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from cli.client import ExitCode
from cli.redis_server import EmbeddedRedis
from tests.api.routes.test_batches import chat_line
from tests.cli.test_jobs import cli_env, genq
from tests.conftest import ApiProcess, WorkerProcess, suite_settings

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def stack(redis_server: EmbeddedRedis, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ApiProcess]:
    redis.Redis.from_url(redis_server.url).flushall()
    tmp = tmp_path_factory.mktemp("cli-batch")
    settings = suite_settings(redis_server.url, tmp / "genq", api_keys=["key-a"])
    worker = WorkerProcess(settings, tmp / "worker.log").wait_ready()
    api = ApiProcess(settings, tmp / "api.log")
    try:
        yield api.wait_ready()
    finally:
        api.close()
        worker.close()


def test_submit_and_wait_saves_the_output(stack: ApiProcess, tmp_path: Path) -> None:
    requests = tmp_path / "requests.jsonl"
    requests.write_bytes(b"".join(chat_line(f"r{i}", f"hello {i}") for i in range(5)) + b"{broken\n")
    saved = tmp_path / "results.jsonl"
    run = genq(cli_env(stack), "batch", "submit", str(requests), "--wait", "--output", str(saved))
    assert run.code == ExitCode.OK, run.stderr
    batch = json.loads(run.stdout)
    assert batch["status"] == "completed" and batch["request_counts"] == {
        "total": 6,
        "completed": 5,
        "failed": 1,
    }
    assert sorted(json.loads(line)["custom_id"] for line in saved.read_text().splitlines()) == [
        f"r{i}" for i in range(5)
    ]
    errors = tmp_path / "results.errors.jsonl"
    assert [json.loads(line)["error"]["code"] for line in errors.read_text().splitlines()] == [
        "invalid_json_line"
    ]
    again = genq(cli_env(stack), "batch", "get", batch["id"])
    assert again.code == ExitCode.OK and json.loads(again.stdout)["id"] == batch["id"]


def test_without_wait_and_a_failed_batch(stack: ApiProcess, tmp_path: Path) -> None:
    requests = tmp_path / "requests.jsonl"
    requests.write_bytes(b"\n\n")  # no request lines: the batch fails validation
    started = genq(cli_env(stack), "batch", "submit", str(requests))
    assert started.code == ExitCode.OK and json.loads(started.stdout)["status"] == "validating"
    failed = genq(cli_env(stack), "batch", "submit", str(requests), "--wait")
    assert failed.code == ExitCode.FAILED
    assert json.loads(failed.stdout)["errors"]["data"][0]["code"] == "empty_file"
    cancelled = genq(cli_env(stack), "batch", "cancel", json.loads(started.stdout)["id"])
    assert cancelled.code == ExitCode.OK  # an ended batch comes back as it is
    wrong = tmp_path / "requests.txt"
    wrong.write_text("x")
    refused = genq(cli_env(stack), "batch", "submit", str(wrong))
    assert refused.code == ExitCode.USAGE and "jsonl" in refused.stderr
