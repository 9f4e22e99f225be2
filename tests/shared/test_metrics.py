"""shared/metrics.py: the collectors expose the queue, memory and batch statistics under the
names the deployment files scale and alert on (k8s/, docs/operations.md), and every reaper
action's series exists at 0 before the first action."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from shared import metrics
from shared.metrics import (
    BatchSnapshot,
    BatchStatsCollector,
    QueueSnapshot,
    QueueStats,
    QueueStatsCollector,
    RedisMemory,
)
from tests.conftest import ROOT


def _samples(collector: QueueStatsCollector | BatchStatsCollector) -> dict[tuple[str, str], float]:
    registry = CollectorRegistry()
    registry.register(collector)
    text = generate_latest(registry).decode()
    return {
        (sample.name, sample.labels.get("queue", "")): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def test_queue_statistics_per_queue_and_redis_memory() -> None:
    snapshot = QueueSnapshot(
        [QueueStats("genq.a", length=3, running=1), QueueStats("webhooks", length=2, running=0)],
        unacked_total=4,
        memory=RedisMemory(used_bytes=100, max_bytes=400),
    )
    assert _samples(QueueStatsCollector(snapshot)) == {
        (metrics.QUEUE_LENGTH_METRIC, "genq.a"): 3, (metrics.QUEUE_LENGTH_METRIC, "webhooks"): 2,
        ("genq_jobs_running", "genq.a"): 1, ("genq_jobs_running", "webhooks"): 0,
        ("genq_queue_unacked", ""): 4,
        ("genq_redis_memory_used_bytes", ""): 100, ("genq_redis_memory_max_bytes", ""): 400,
    }  # fmt: skip


def test_memory_fraction_is_zero_without_a_limit() -> None:
    assert RedisMemory(100, 400).fraction() == 0.25
    assert RedisMemory(100, 0).fraction() == 0.0


def test_batch_statistics() -> None:
    assert _samples(BatchStatsCollector(BatchSnapshot(active=2, lines_inflight=7))) == {
        ("genq_batches_active", ""): 2, ("genq_batch_lines_inflight", ""): 7,
    }  # fmt: skip


def test_reaper_action_series_exist_from_the_start() -> None:
    text = generate_latest().decode()
    for action in metrics.REAPER_ACTION_NAMES:
        assert f'genq_reaper_actions_total{{action="{action}"}}' in text


def test_the_autoscaling_metric_name_is_the_one_the_deployment_uses() -> None:
    deployed = "\n".join(p.read_text() for p in (ROOT / "k8s").rglob("*.yaml"))
    assert metrics.QUEUE_LENGTH_METRIC in deployed
