"""A local stand-in for the few Kubernetes API endpoints genq's scale-in code and `genq k8s` use.

No API server can run in CI, so the tests point the official `kubernetes` client at this stdlib
HTTP server (127.0.0.1, free port, a thread). It speaks:

  GET   /api/v1/namespaces/{ns}/pods/{name}
  PATCH /api/v1/namespaces/{ns}/pods/{name}        (application/merge-patch+json only, RFC 7386)
  GET   /api/v1/namespaces/{ns}/pods?labelSelector=k=v,...
  GET   /apis/autoscaling/v2/namespaces/{ns}/horizontalpodautoscalers/{name}
  GET   /metrics                                     (the genq API's Prometheus exposition)

with bodies shaped like the real ones (kind, apiVersion, metadata.resourceVersion, status
conditions, Status objects for errors), records every request, and can be told to fail the next
requests with a given HTTP status.
"""

from __future__ import annotations

import copy
import json
import re
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
from kubernetes import client

POD_PATH = re.compile(r"^/api/v1/namespaces/(?P<ns>[^/]+)/pods/(?P<name>[^/]+)$")
PODS_PATH = re.compile(r"^/api/v1/namespaces/(?P<ns>[^/]+)/pods$")
HPA_PATH = re.compile(
    r"^/apis/autoscaling/v2/namespaces/(?P<ns>[^/]+)/horizontalpodautoscalers/(?P<name>[^/]+)$"
)
REASONS = {
    403: "Forbidden",
    404: "NotFound",
    409: "Conflict",
    415: "UnsupportedMediaType",
    500: "InternalError",
}
T0 = "2026-01-05T10:00:00Z"


@dataclass
class Recorded:
    method: str
    path: str
    query: dict[str, list[str]]
    headers: dict[str, str]  # names lower-cased
    body: Any


@dataclass
class FakeKube:
    """State of the fake cluster; tests read and change it directly."""

    pods: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    hpas: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    metrics_text: str = ""
    requests: list[Recorded] = field(default_factory=list)
    #: HTTP statuses to answer the next requests with (FIFO), whatever they ask.
    fail_next: list[int] = field(default_factory=list)
    resource_version: int = 1000
    url: str = ""
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add_pod(self, pod: dict[str, Any]) -> None:
        meta = pod["metadata"]
        self.pods[(meta["namespace"], meta["name"])] = pod

    def add_hpa(self, hpa: dict[str, Any]) -> None:
        meta = hpa["metadata"]
        self.hpas[(meta["namespace"], meta["name"])] = hpa

    def patches(self) -> list[Recorded]:
        return [r for r in self.requests if r.method == "PATCH"]

    def next_version(self) -> str:
        self.resource_version += 1
        return str(self.resource_version)


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def status_body(code: int, message: str, name: str = "", kind: str = "pods") -> dict[str, Any]:
    """A metav1.Status as the API server returns it for errors."""
    reason = REASONS.get(code, "Unknown")
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "details": {"name": name, "kind": kind},
        "code": code,
    }


def make_pod(
    name: str,
    namespace: str = "genq",
    *,
    ready: bool = True,
    inflight: int | None = None,
    labels: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
    restarts: int = 0,
    node: str = "gpu-node-1",
    deleting: bool = False,
) -> dict[str, Any]:
    """A Pod as GET returns it (fields the client's models require are all present)."""
    notes = dict(annotations or {})
    if inflight is not None:
        notes["controller.kubernetes.io/pod-deletion-cost"] = str(inflight)
    metadata: dict[str, Any] = {
        "name": name,
        "namespace": namespace,
        "uid": f"0000-{name}",
        "resourceVersion": "1000",
        "creationTimestamp": T0,
        "labels": labels or {"app.kubernetes.io/name": "genq", "app.kubernetes.io/component": "worker"},
        "annotations": notes,
    }
    if deleting:
        metadata["deletionTimestamp"] = "2026-01-05T10:05:00Z"
        metadata["deletionGracePeriodSeconds"] = 180
    flag = "True" if ready else "False"
    return {
        "kind": "Pod",
        "apiVersion": "v1",
        "metadata": metadata,
        "spec": {
            "containers": [{"name": "worker", "image": "registry.example.com/genq/genq-worker:0.1.0"}],
            "nodeName": node,
            "serviceAccountName": "genq-worker",
        },
        "status": {
            "phase": "Running",
            "conditions": [
                {"type": "Initialized", "status": "True", "lastTransitionTime": T0},
                {"type": "Ready", "status": flag, "lastTransitionTime": T0},
                {"type": "ContainersReady", "status": flag, "lastTransitionTime": T0},
                {"type": "PodScheduled", "status": "True", "lastTransitionTime": T0},
            ],
            "containerStatuses": [
                {
                    "name": "worker",
                    "ready": ready,
                    "restartCount": restarts,
                    "image": "registry.example.com/genq/genq-worker:0.1.0",
                    "imageID": "registry.example.com/genq/genq-worker@sha256:" + "0" * 64,
                    "started": True,
                    "state": {"running": {"startedAt": T0}},
                }
            ],
        },
    }


def make_hpa(
    name: str = "genq-worker",
    namespace: str = "genq",
    *,
    current: int = 3,
    desired: int = 4,
    average_value: str | None = "60",
    able_to_scale: bool = True,
) -> dict[str, Any]:
    """An autoscaling/v2 HorizontalPodAutoscaler on genq_queue_length, as GET returns it."""
    metric = {
        "name": "genq_queue_length",
        "selector": {"matchLabels": {"queue": "genq.smollm2-135m-instruct"}},
    }
    current_metrics = (
        [{"type": "External", "external": {"metric": metric, "current": {"averageValue": average_value}}}]
        if average_value is not None
        else []
    )
    conditions = [
        {
            "type": "AbleToScale",
            "status": "True" if able_to_scale else "False",
            "lastTransitionTime": T0,
            "reason": "ReadyForNewScale" if able_to_scale else "FailedGetScale",
            "message": "recommended size matches current size"
            if able_to_scale
            else "the HPA controller was unable to get the target's current scale",
        },
        {
            "type": "ScalingActive",
            "status": "True",
            "lastTransitionTime": T0,
            "reason": "ValidMetricFound",
            "message": "the HPA was able to successfully calculate a replica count from external metric "
            "genq_queue_length(&LabelSelector{MatchLabels:map[string]string{queue: "
            "genq.smollm2-135m-instruct,},MatchExpressions:[]LabelSelectorRequirement{},})",
        },
    ]
    return {
        "kind": "HorizontalPodAutoscaler",
        "apiVersion": "autoscaling/v2",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "uid": f"0000-{name}",
            "resourceVersion": "2000",
            "creationTimestamp": T0,
        },
        "spec": {
            "scaleTargetRef": {"kind": "Deployment", "name": name, "apiVersion": "apps/v1"},
            "minReplicas": 2,
            "maxReplicas": 10,
            "metrics": [
                {
                    "type": "External",
                    "external": {"metric": metric, "target": {"type": "AverageValue", "averageValue": "50"}},
                }
            ],
        },
        "status": {
            "currentReplicas": current,
            "desiredReplicas": desired,
            "lastScaleTime": T0,
            "currentMetrics": current_metrics,
            "conditions": conditions,
        },
    }


def _selector_matches(selector: str, labels: dict[str, str]) -> bool:
    for term in filter(None, selector.split(",")):
        key, _, value = term.partition("=")
        if labels.get(key) != value:
            return False
    return True


def _handler(state: FakeKube) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:  # quiet test output
            pass

        def do_GET(self) -> None:
            self._serve("GET")

        def do_PATCH(self) -> None:
            self._serve("PATCH")

        def _serve(self, method: str) -> None:
            url = urlsplit(self.path)
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            body = json.loads(raw) if raw else None
            with state.lock:
                state.requests.append(
                    Recorded(
                        method,
                        url.path,
                        parse_qs(url.query),
                        {k.lower(): v for k, v in self.headers.items()},
                        body,
                    )
                )
                if state.fail_next:
                    code = state.fail_next.pop(0)
                    self._reply(code, status_body(code, f"injected failure {code}"))
                    return
                self._route(method, url.path, parse_qs(url.query), body)

        def _route(self, method: str, path: str, query: dict[str, list[str]], body: Any) -> None:
            if path == "/metrics" and method == "GET":
                self._reply(200, state.metrics_text, content_type="text/plain; version=0.0.4")
            elif match := POD_PATH.match(path):
                self._pod(method, match["ns"], match["name"], body)
            elif (match := PODS_PATH.match(path)) and method == "GET":
                self._pod_list(match["ns"], query.get("labelSelector", [""])[0])
            elif (match := HPA_PATH.match(path)) and method == "GET":
                hpa = state.hpas.get((match["ns"], match["name"]))
                if hpa is None:
                    name = match["name"]
                    message = f'horizontalpodautoscalers.autoscaling "{name}" not found'
                    self._reply(404, status_body(404, message, name, "horizontalpodautoscalers"))
                else:
                    self._reply(200, hpa)
            else:
                self._reply(404, status_body(404, f"the server could not find the requested resource {path}"))

        def _pod(self, method: str, namespace: str, name: str, body: Any) -> None:
            pod = state.pods.get((namespace, name))
            if pod is None:
                self._reply(404, status_body(404, f'pods "{name}" not found', name))
                return
            if method == "PATCH":
                content_type = self.headers.get("Content-Type", "")
                if content_type != "application/merge-patch+json":
                    self._reply(415, status_body(415, f"unsupported patch type {content_type!r} here", name))
                    return
                pod = merge_patch(pod, body)
                pod["metadata"]["resourceVersion"] = state.next_version()
                state.pods[(namespace, name)] = pod
            self._reply(200, pod)

        def _pod_list(self, namespace: str, selector: str) -> None:
            items = [
                {k: v for k, v in pod.items() if k not in ("kind", "apiVersion")}
                for (ns, _), pod in sorted(state.pods.items())
                if ns == namespace and _selector_matches(selector, pod["metadata"].get("labels", {}))
            ]
            self._reply(
                200,
                {
                    "kind": "PodList",
                    "apiVersion": "v1",
                    "metadata": {"resourceVersion": str(state.resource_version)},
                    "items": items,
                },
            )

        def _reply(self, code: int, body: Any, content_type: str = "application/json") -> None:
            data = body.encode() if isinstance(body, str) else json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    return Handler


@contextmanager
def serve() -> Iterator[FakeKube]:
    """Run a FakeKube on 127.0.0.1 (free port) in a thread for the duration of the block."""
    state = FakeKube()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(state))
    state.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), name="fake-kube", daemon=True)
    thread.start()
    try:
        yield state
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


@pytest.fixture
def kube() -> Iterator[FakeKube]:
    with serve() as state:
        yield state


@pytest.fixture
def core_api(kube: FakeKube) -> Any:
    """The official CoreV1Api, talking to the fake server over HTTP."""
    configuration = client.Configuration()
    configuration.host = kube.url
    return client.CoreV1Api(client.ApiClient(configuration))
