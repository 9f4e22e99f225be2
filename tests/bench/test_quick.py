"""Each service benchmark runs with --quick, as a user would run it, and writes a sane report:
a smoke test so the benchmarks cannot rot. The numbers themselves are not judged here."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow


def run_quick(name: str, out: Path, *more: str) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GENQ_")}
    completed = subprocess.run(
        [sys.executable, "-m", f"bench.{name}", "--quick", "--out", str(out), *more],
        check=False, cwd=ROOT, env=env, capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    assert completed.returncode == 0, completed.stdout[-3000:] + completed.stderr[-3000:]
    assert (out / f"{name}.png").stat().st_size > 0
    report: dict[str, Any] = json.loads((out / f"{name}.json").read_text())
    assert report["quick"] is True
    return report


def assert_latencies(values: dict[str, Any], prefix: str = "") -> None:
    p50, p99 = values[f"{prefix}p50_ms"], values[f"{prefix}p99_ms"]
    assert 0 < p50 <= p99, values


def test_gateway_quick(tmp_path: Path) -> None:
    report = run_quick("gateway", tmp_path)
    (config,) = report["configs"]
    endpoints = config["endpoints"]
    assert set(endpoints) == {"bare_get", "bare_post", "enqueue", "cache_hit", "get_job"}
    for name, result in endpoints.items():
        if "n/a" in result:  # the cache hit, when the cache answers nothing
            assert name == "cache_hit"
            continue
        assert result["max"]["rate"] > 0
        assert_latencies(result["max"])
        for point in result["sweep"]:
            assert point["achieved_rate"] > 0 and point["errors"] == 0
            assert_latencies(point)
            cpu = point["cpu_us_per_request"]
            assert cpu["server"] > 0 and cpu["load_generator"] > 0, cpu
            assert (cpu["redis"] > 0) == name.startswith(("enqueue", "cache_hit", "get_job")), cpu
    assert endpoints["enqueue"]["ratio_to_ceiling"] > 0
    assert endpoints["get_job"]["ratio_to_ceiling"] > 0
    assert set(config["targets"]) >= {"enqueue_2350_with_p99_under_50ms", "get_at_least_half_of_ceiling"}


def test_end_to_end_quick(tmp_path: Path) -> None:
    report = run_quick("end_to_end", tmp_path)
    assert [run["concurrency"] for run in report["runs"]] == [1, 4]
    for run in report["runs"]:
        genq, celery = run["genq"], run["celery"]
        assert genq["succeeded"] == genq["jobs"] and genq["failed_or_unfinished"] == 0
        assert genq["jobs_per_s"] > 0 and celery["tasks_per_s"] > 0
        assert_latencies(genq, "latency_")
        assert_latencies(celery, "round_trip_")
        assert genq["inference_p50_ms"] > 0
        assert genq["latency_p50_ms"] >= genq["inference_p50_ms"]
        assert set(genq["cpu_ms_per_item"]) == {"api", "worker", "redis"}
        assert run["rate_ratio"] > 0
    assert set(report["targets"]) >= {"genq_rate_at_least_celery", "overhead_p50_under_2x_celery_round_trip"}


def test_machinery_quick(tmp_path: Path) -> None:
    flags = ["--modes", "poll,prefer,sse", "--webhooks", "20", "--webhook-threads", "3", "--script-times"]
    report = run_quick("machinery", tmp_path, *flags)
    assert report["modes"] == ["poll", "prefer", "sse"]
    assert [run["concurrency"] for run in report["runs"]] == [1, 4]
    for run in report["runs"]:
        celery = run["celery"]
        assert celery["tasks_per_s"] > 0 and celery["redis_commands_per_item"] > 0
        for mode in ("poll", "prefer", "sse"):
            genq = run[mode]
            assert genq["succeeded"] == genq["jobs"] and genq["failed_or_unfinished"] == 0
            # Every job answered: poll and sse = one 202 and one 200 each, prefer = one 200 each.
            both = {"202": genq["jobs"], "200": genq["jobs"]}
            expected = both if mode in ("poll", "sse") else {"200": genq["jobs"]}
            assert genq["http_statuses"] == expected
            assert genq["jobs_per_s"] > 0 and genq["rate_ratio"] > 0
            assert_latencies(genq, "latency_")
            assert genq["queueing_ms"] > 0 and genq["p99_to_queueing"] > 0
            assert set(genq["cpu_ms_per_item"]) == {"api", "worker", "redis"}
            # Read from the API's /metrics before and after the run: every generation, none negative.
            passes = genq["api_gc_passes_per_1000"]
            assert set(passes) == {"0", "1", "2"} and min(passes.values()) >= 0
            assert genq["redis_commands_per_item"] > 0 and genq["client_cpu_ms_per_job"] > 0
            # Each job's Redis round trips alone make the worker's threads wait several times.
            assert genq["worker_switches_per_job"] >= 2
            if mode != "sse":  # a stream's reads can push the store's scripts out of the top ten
                assert "evalsha" in genq["redis_top_commands_per_item"]
            assert "evalsha" in genq["redis_top_usec_per_item"]
            # Each job: one submit and one finish; claimed from a delivery or taken by a thread.
            scripts = genq["redis_scripts"]
            assert scripts["submit"]["calls_per_item"] == scripts["finish"]["calls_per_item"] == 1
            claims = sum(scripts[name]["calls_per_item"] for name in ("claim", "take") if name in scripts)
            assert claims >= 1 and all(t["median_us"] > 0 for t in scripts.values())
    hooks = report["webhooks"]
    assert {"webhook_take", "webhook_claim"} & set(hooks["redis_scripts"])
    assert hooks["accepted"] == hooks["delivered_jobs"] == 20 and hooks["all_delivered"]
    assert hooks["redundant_deliveries"] == 0 and hooks["deliveries_per_s"] > 0
    assert hooks["bench_cpu_ms_per_job"] > 0 and hooks["webhook_threads"] == 3
    # Against bare Celery measured just before the deliveries (not the run's first baseline).
    assert hooks["celery_tasks_per_s"] > 0
    assert hooks["rate_ratio"] == round(hooks["deliveries_per_s"] / hooks["celery_tasks_per_s"], 3)
    assert set(report["targets"]["poll"]) == {
        "rate_at_least_celery_from_c16",
        "rate_never_falls",
        "p99_within_2x_queueing_at_top",
    }


def test_webhook_drain_quick(tmp_path: Path) -> None:
    report = run_quick("webhook_drain", tmp_path)
    assert [run["threads"] for run in report["runs"]] == [1, 16]
    for run in report["runs"]:
        assert run["all_delivered"] and run["redundant_deliveries"] == 0
        assert run["deliveries_per_s"] > 0 and run["cpu_ms_per_delivery"] > 0
    assert set(report["medians"]) == {"1", "16"}


def test_scale_quick(tmp_path: Path) -> None:
    report = run_quick("scale", tmp_path)
    levels = report["levels"]
    assert [level["level"] for level in levels] == [100, 1000]
    for level in levels:
        assert level["queued"] >= level["level"]
        assert level["bytes_per_queued_job"] > 0 and level["job_record_bytes"] > 0
        assert level["post_errors"] == 0 and level["get_errors"] == 0
        assert_latencies(level, "post_")
        assert_latencies(level, "get_")
    polling = report["polling"]
    assert polling["pollers"] == 50
    assert polling["answered_before_their_wait"] == 0  # every long-poll was still held
    for phase in ("idle", "load", "idle_with_pollers", "load_with_pollers"):
        assert polling["phases"][phase]["api_rss_mb"] > 0
    assert polling["phases"]["load_with_pollers"]["post_rate"] > 0


def test_pubsub_quick(tmp_path: Path) -> None:
    """Both ways in one run: this tree's listener against another checkout's (here, this one)."""
    report = run_quick("pubsub", tmp_path, "--base", str(ROOT))
    assert [run["batch"] for run in report["runs"]] == [1, 2, 16]
    for run in report["runs"]:
        assert run["messages"] == 1_000
        for side in ("base", "new"):
            assert len(run[side]["rounds"]) == 1
            # a real CPU cost: not the ~0.2 us of a run whose wait ended before its messages came
            assert run[side]["cpu_us_per_message_median"] > 1.0, run
        assert run["new_over_base"] > 0


def test_redis_io_quick(tmp_path: Path) -> None:
    """The wire and redis-py's pipelines, and another checkout's API (here, this one), in one run."""
    report = run_quick("redis_io", tmp_path, "--base", str(ROOT))
    steps = [(run["endpoint"], run["connections"]) for run in report["runs"]]
    assert steps == [("enqueue", 1), ("enqueue", 4), ("get_job", 1), ("get_job", 4)]
    for run in report["runs"]:
        assert set(run["sides"]) == {"wire", "pipelines", "base"}
        assert set(run["over_wire"]) == {"pipelines", "base"}
        for side in run["sides"].values():
            assert side["rate"] > 0 and side["cpu_us"] > 0
            assert_latencies(side)


def test_take_path_quick(tmp_path: Path) -> None:
    """bench/take_path.py: the take path and kombu's public consumer on this tree, side by side."""
    report = run_quick("take_path", tmp_path)
    assert set(report["medians"]) == {"take", "public"} and set(report["take_vs"]) == {"public"}
    for runs in report["runs"].values():
        for run in runs:
            assert run["failed_or_unfinished"] == 0 and run["jobs_per_s"] > 0 and run["rate_ratio"] > 0
            assert run["worker_cpu_ms"] >= 0 and 0 < run["latency_p50_ms"] <= run["latency_p99_ms"]
