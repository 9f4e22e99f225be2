"""cli/k8s.py: `genq k8s status` and the pure functions that build its screen.

The command tests run the official `kubernetes` client, configured from a kubeconfig file, against
tests/kube.py: a local HTTP server (127.0.0.1, free port, thread) that speaks GET
pods (list with labelSelector), GET autoscaling/v2 horizontalpodautoscalers and the API's /metrics,
with real-shaped bodies. The pure-function tests deserialize the same bodies with the client's own
ApiClient, so they see the client's model objects.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client
from typer.testing import CliRunner

from cli.k8s import (
    HpaView,
    WorkerView,
    app,
    hpa_view,
    prometheus_queue_lengths,
    queue_lengths,
    render_status,
    worker_views,
)
from tests.kube import FakeKube, make_hpa, make_pod

METRICS = """\
# HELP genq_queue_length Jobs accepted and not yet running.
# TYPE genq_queue_length gauge
genq_queue_length{queue="genq.smollm2-135m-instruct"} 180.0
genq_queue_length{queue="webhooks"} 2.0
# HELP genq_jobs_total Jobs accepted.
# TYPE genq_jobs_total counter
genq_jobs_total{model="smollm2-135m-instruct"} 1234.0
"""


class _Body:
    def __init__(self, body: dict[str, Any]) -> None:
        self.data = json.dumps(body)


def model(body: dict[str, Any], kind: str) -> Any:
    """A response body as the client deserializes it (e.g. kind "V1PodList")."""
    return client.ApiClient().deserialize(_Body(body), kind)


def pod_list(*pods: dict[str, Any]) -> dict[str, Any]:
    return {"kind": "PodList", "apiVersion": "v1", "metadata": {"resourceVersion": "1"}, "items": list(pods)}


# ---------------------------------------------------------------------------------- pure functions


def test_hpa_view_reads_replicas_and_external_metric() -> None:
    """From a deserialized V2HorizontalPodAutoscaler (no server)."""
    view = hpa_view(model(make_hpa(current=3, desired=4, average_value="60"), "V2HorizontalPodAutoscaler"))
    assert view == HpaView(
        name="genq-worker",
        current_replicas=3,
        desired_replicas=4,
        min_replicas=2,
        max_replicas=10,
        metric="genq_queue_length 60 per worker (target 50)",
        problem=None,
    )


def test_hpa_view_before_first_sync_and_when_stuck() -> None:
    """No current metric yet, and an AbleToScale=False condition (no server)."""
    body = make_hpa(average_value=None, able_to_scale=False)
    view = hpa_view(model(body, "V2HorizontalPodAutoscaler"))
    assert view.metric is None
    assert view.problem is not None and view.problem.startswith("AbleToScale: FailedGetScale")


def test_worker_views_read_readiness_inflight_and_draining() -> None:
    """From a deserialized V1PodList (no server): in-flight comes from the deletion-cost annotation."""
    pods = model(
        pod_list(
            make_pod("w-b", inflight=5, restarts=1),
            make_pod("w-a", ready=False),
            make_pod("w-c", inflight=0, deleting=True, annotations={"x": "y"}),
        ),
        "V1PodList",
    )
    assert worker_views(pods) == [
        WorkerView(
            "w-a", "Running", ready=False, terminating=False, inflight=None, restarts=0, node="gpu-node-1"
        ),
        WorkerView(
            "w-b", "Running", ready=True, terminating=False, inflight=5, restarts=1, node="gpu-node-1"
        ),
        WorkerView("w-c", "Running", ready=True, terminating=True, inflight=0, restarts=0, node="gpu-node-1"),
    ]


def test_queue_lengths_parse_the_exposition() -> None:
    assert queue_lengths(METRICS) == {"genq.smollm2-135m-instruct": 180.0, "webhooks": 2.0}
    assert queue_lengths("# nothing here\n") == {}


def test_prometheus_queue_lengths() -> None:
    response = {
        "status": "success",
        "data": {
            "resultType": "vector",
            "result": [{"metric": {"queue": "genq.smollm2-135m-instruct"}, "value": [1767607200.0, "42"]}],
        },
    }
    assert prometheus_queue_lengths(response) == {"genq.smollm2-135m-instruct": 42.0}


def test_render_status_screen() -> None:
    hpa = HpaView("genq-worker", 3, 4, 2, 10, "genq_queue_length 60 per worker (target 50)", None)
    workers = [
        WorkerView("genq-worker-1", "Running", True, False, 7, 0, "gpu-a"),
        WorkerView("genq-worker-2", "Running", False, True, None, 2, None),
    ]
    screen = render_status(
        "genq", hpa, workers, {"genq.smollm2-135m-instruct": 180.0}, queue_source="http://api/metrics"
    )
    assert "Autoscaler genq-worker: 3 current -> 4 desired (min 2, max 10)" in screen
    assert "genq.smollm2-135m-instruct  180" in screen
    assert "Workers: 2 pods, 1 ready, 7 jobs in flight" in screen
    rows = [line.split() for line in screen.splitlines() if line.startswith("  genq-worker-")]
    assert rows == [
        ["genq-worker-1", "yes", "Running", "7", "0", "gpu-a"],
        ["genq-worker-2", "no", "Draining", "-", "2", "-"],
    ]


def test_render_status_without_data() -> None:
    screen = render_status("genq", None, [], None, queue_source="x", problems=["HPA: HTTP 403 Forbidden"])
    assert "Autoscaler: not found" in screen
    assert "Queue length (x): unavailable" in screen
    assert "(no worker pods)" in screen
    assert "HPA: HTTP 403 Forbidden" in screen


# ------------------------------------------------------------------------- the command, end to end


@pytest.fixture
def kubeconfig(kube: FakeKube, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A kubeconfig whose only cluster is the fake server; restores the client's default config."""
    path = tmp_path / "kubeconfig"
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "fake", "cluster": {"server": kube.url}}],
                "users": [{"name": "tester", "user": {"token": "test-token"}}],
                "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "tester"}}],
                "current-context": "fake",
            }
        )
    )
    monkeypatch.setenv("KUBECONFIG", str(path))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.delenv("GENQ_API_URL", raising=False)
    monkeypatch.delenv("GENQ_API_KEY", raising=False)
    yield path
    client.Configuration.set_default(client.Configuration())


def test_status_command_shows_one_screen(kube: FakeKube, kubeconfig: Path) -> None:
    """Against the fake API server: the HPA, the worker pods selected by label (an API pod in the
    same namespace and a worker in another namespace are left out), and /metrics."""
    kube.add_hpa(make_hpa(current=3, desired=4, average_value="60"))
    kube.add_pod(make_pod("genq-worker-1", inflight=7, node="gpu-a"))
    kube.add_pod(make_pod("genq-worker-2", inflight=0, node="gpu-b"))
    kube.add_pod(make_pod("genq-worker-3", ready=False))
    kube.add_pod(
        make_pod(
            "genq-api-1", labels={"app.kubernetes.io/name": "genq", "app.kubernetes.io/component": "api"}
        )
    )
    kube.add_pod(make_pod("genq-worker-x", namespace="other"))
    kube.metrics_text = METRICS

    result = CliRunner().invoke(app, ["status", "--namespace", "genq", "--api-url", kube.url])

    assert result.exit_code == 0, result.output
    out = result.output
    assert "Autoscaler genq-worker: 3 current -> 4 desired (min 2, max 10)" in out
    assert "genq_queue_length 60 per worker (target 50)" in out
    assert f"Queue length ({kube.url}/metrics):" in out
    assert "genq.smollm2-135m-instruct  180" in out
    assert "Workers: 3 pods, 2 ready, 7 jobs in flight" in out
    assert "genq-api-1" not in out and "genq-worker-x" not in out

    (pods,) = [r for r in kube.requests if r.path == "/api/v1/namespaces/genq/pods"]
    assert pods.query["labelSelector"] == ["app.kubernetes.io/name=genq,app.kubernetes.io/component=worker"]
    assert pods.headers["authorization"] == "Bearer test-token"
    assert any(
        r.path == "/apis/autoscaling/v2/namespaces/genq/horizontalpodautoscalers/genq-worker"
        for r in kube.requests
    )


def test_status_command_sends_the_api_key_for_metrics(kube: FakeKube, kubeconfig: Path) -> None:
    """Against the fake server: --api-key goes to /metrics as a bearer token."""
    kube.metrics_text = METRICS
    result = CliRunner().invoke(app, ["status", "--api-url", kube.url, "--api-key", "k1"])
    assert result.exit_code == 0, result.output
    (metrics,) = [r for r in kube.requests if r.path == "/metrics"]
    assert metrics.headers["authorization"] == "Bearer k1"


def test_status_command_reports_partial_failures(kube: FakeKube, kubeconfig: Path) -> None:
    """Against the fake API server: no HPA (404) and an unreachable API still print the pods;
    a 403 on the pod list is reported as a problem."""
    kube.add_pod(make_pod("genq-worker-1", inflight=1))
    result = CliRunner().invoke(app, ["status", "--api-url", "http://127.0.0.1:9"])
    assert result.exit_code == 0, result.output
    assert "Autoscaler: not found" in result.output
    assert "Queue length (http://127.0.0.1:9/metrics): unavailable" in result.output
    assert "genq-worker-1" in result.output

    kube.fail_next = [403, 403]
    result = CliRunner().invoke(app, ["status", "--api-url", "http://127.0.0.1:9"])
    assert result.exit_code == 1
    assert "HPA genq-worker: HTTP 403 Forbidden" in result.output
    assert "worker pods: HTTP 403 Forbidden" in result.output


def test_status_command_without_kubeconfig(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No cluster configuration at all: a message and exit 1 (no server involved)."""
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "missing"))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    result = CliRunner().invoke(app, ["status"])
    assert result.exit_code == 1
    assert "cannot load a Kubernetes config" in result.output
