"""workers/scalein.py: the pod-deletion-cost annotation follows the worker's in-flight count.

Every test here runs the official `kubernetes` client against tests/kube.py, a local
HTTP server (127.0.0.1, free port, thread) that speaks GET/PATCH /api/v1/namespaces/{ns}/pods/{name}
with real-shaped Pod and Status bodies and applies merge patches; no cluster is needed.
"""

from __future__ import annotations

import logging
from typing import Any

import pytest

from shared.logging import FIELDS
from tests.kube import FakeKube, make_pod
from workers.scalein import DELETION_COST_ANNOTATION, PodDeletionCost, from_env

NS, POD = "genq", "genq-worker-7d9f8-abcde"


class FakeClock:
    """A monotonic clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def cost(kube: FakeKube, core_api: Any, clock: FakeClock) -> PodDeletionCost:
    kube.add_pod(make_pod(POD, NS, annotations={"prometheus.io/scrape": "true"}))
    return PodDeletionCost(NS, POD, api=core_api, min_interval_s=5.0, clock=clock)


def annotation(kube: FakeKube) -> str | None:
    value: str | None = kube.pods[(NS, POD)]["metadata"]["annotations"].get(DELETION_COST_ANNOTATION)
    return value


def test_patch_is_a_merge_patch_of_the_annotation(kube: FakeKube, cost: PodDeletionCost) -> None:
    """The fake API server receives one PATCH of the pod, typed merge-patch, setting only the
    annotation (as a string); the server merges it, keeps the other annotations, bumps the
    resourceVersion."""
    assert cost.update(3) is True

    (patch,) = kube.patches()
    assert patch.path == f"/api/v1/namespaces/{NS}/pods/{POD}"
    assert patch.headers["content-type"] == "application/merge-patch+json"
    assert patch.body == {"metadata": {"annotations": {DELETION_COST_ANNOTATION: "3"}}}
    pod = kube.pods[(NS, POD)]
    assert annotation(kube) == "3"
    assert pod["metadata"]["annotations"]["prometheus.io/scrape"] == "true"
    assert pod["metadata"]["resourceVersion"] != "1000"


def test_patches_only_when_the_value_changes(kube: FakeKube, cost: PodDeletionCost, clock: FakeClock) -> None:
    """Against the fake API server: the same count again, even long after, sends nothing."""
    assert cost.update(2) is True
    clock.advance(60)
    assert cost.update(2) is False
    assert len(kube.patches()) == 1


def test_at_most_one_patch_per_interval(kube: FakeKube, cost: PodDeletionCost, clock: FakeClock) -> None:
    """Against the fake API server: changes inside min_interval_s wait; the next call after the
    interval sends the latest value."""
    assert cost.update(1) is True
    clock.advance(1)
    assert cost.update(2) is False
    clock.advance(1)
    assert cost.update(3) is False
    assert len(kube.patches()) == 1
    clock.advance(3)
    assert cost.update(3) is True
    assert [p.body["metadata"]["annotations"][DELETION_COST_ANNOTATION] for p in kube.patches()] == ["1", "3"]
    assert annotation(kube) == "3"


def test_back_to_a_sent_value_within_interval_sends_nothing(
    kube: FakeKube, cost: PodDeletionCost, clock: FakeClock
) -> None:
    """Against the fake API server: 1 -> 2 (throttled) -> 1 leaves the pod at 1 with one PATCH."""
    cost.update(1)
    clock.advance(1)
    cost.update(2)
    clock.advance(10)
    assert cost.update(1) is False
    assert len(kube.patches()) == 1


@pytest.mark.parametrize("code", [403, 500])
def test_api_errors_are_logged_and_retried_later(
    kube: FakeKube, cost: PodDeletionCost, clock: FakeClock, caplog: pytest.LogCaptureFixture, code: int
) -> None:
    """The fake API server answers the first PATCH with a Status 403 (RBAC) or 500: update()
    returns False without raising, logs one JSON warning, waits the interval, then succeeds."""
    kube.fail_next = [code]
    with caplog.at_level(logging.WARNING, logger="workers.scalein"):
        assert cost.update(4) is False
    (record,) = caplog.records
    event = getattr(record, FIELDS)
    assert record.getMessage() == "pod_deletion_cost_patch_failed"
    assert event["pod"] == POD and event["inflight"] == 4
    assert f"HTTP {code}" in event["error"]
    assert annotation(kube) is None

    clock.advance(1)
    assert cost.update(4) is False, "retried before the interval"
    assert len(kube.patches()) == 1
    clock.advance(5)
    assert cost.update(4) is True
    assert annotation(kube) == "4"


def test_unreachable_api_server_does_not_raise(core_api: Any, clock: FakeClock) -> None:
    """The client points at a port nothing listens on (the fake server's address after a
    throwaway bind): connection refused is logged, not raised."""
    import socket

    from kubernetes import client

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    configuration = client.Configuration()
    configuration.host = f"http://127.0.0.1:{port}"
    configuration.retries = 0
    api = client.CoreV1Api(client.ApiClient(configuration))
    assert PodDeletionCost(NS, POD, api=api, clock=clock).update(1) is False


def test_missing_in_cluster_config_does_not_raise(
    monkeypatch: pytest.MonkeyPatch, clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    """No api given and no service account: loading the in-cluster config fails inside update(),
    which logs and returns False (no server involved)."""
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.delenv("KUBERNETES_SERVICE_PORT", raising=False)
    with caplog.at_level(logging.WARNING, logger="workers.scalein"):
        assert PodDeletionCost(NS, POD, clock=clock).update(1) is False
    assert "pod_deletion_cost_patch_failed" in caplog.text


def test_count_is_clamped_to_a_valid_cost(kube: FakeKube, cost: PodDeletionCost) -> None:
    """Against the fake API server: a negative count is sent as 0 (the annotation is an int32)."""
    assert cost.update(-2) is True
    assert annotation(kube) == "0"


def test_from_env() -> None:
    """from_env returns None unless enabled, named and inside a pod (no server involved)."""
    in_pod = {"KUBERNETES_SERVICE_HOST": "10.96.0.1"}
    assert from_env(False, NS, POD, environ=in_pod) is None
    assert from_env(True, NS, None, environ=in_pod) is None
    assert from_env(True, None, POD, environ=in_pod) is None
    assert from_env(True, NS, POD, environ={}) is None
    made = from_env(True, NS, POD, environ=in_pod, min_interval_s=2.0)
    assert made is not None
    assert (made.namespace, made.pod_name, made.min_interval_s) == (NS, POD, 2.0)
