"""`genq k8s`: look at a genq deployment on Kubernetes.

`genq k8s status` prints one screen: the worker HPA (current / desired replicas and its metric),
each worker pod with its readiness and in-flight jobs (read from its pod-deletion-cost annotation,
which the worker keeps equal to its in-flight count), and the queue length from the API's
/metrics (or from Prometheus with --prometheus-url).

The screen is built by pure functions from the client's API objects (``hpa_view``,
``worker_views``, ``queue_lengths``, ``render_status``); only ``status`` does I/O.
"""

from __future__ import annotations

import json
import os
import urllib.parse
import urllib.request
from dataclasses import dataclass
from typing import Annotated, Any

import typer
from prometheus_client.parser import text_string_to_metric_families

from shared.metrics import QUEUE_LENGTH_METRIC

DELETION_COST_ANNOTATION = "controller.kubernetes.io/pod-deletion-cost"
WORKER_SELECTOR = "app.kubernetes.io/name=genq,app.kubernetes.io/component=worker"
DEFAULT_API_URL = "http://127.0.0.1:8000"
HTTP_TIMEOUT_S = 5.0

app = typer.Typer(
    help="Inspect genq on Kubernetes: autoscaler, worker pods, queue length.",
    no_args_is_help=True,
)


@app.callback()
def _group() -> None:
    """Inspect genq on Kubernetes."""


@dataclass(frozen=True, slots=True)
class HpaView:
    """What the worker autoscaler is doing."""

    name: str
    current_replicas: int | None
    desired_replicas: int | None
    min_replicas: int | None
    max_replicas: int | None
    #: e.g. "genq_queue_length 60 per worker (target 50)"; None before the first sync.
    metric: str | None
    #: Message of a False AbleToScale / ScalingActive condition (why it is not scaling).
    problem: str | None


@dataclass(frozen=True, slots=True)
class WorkerView:
    """One worker pod."""

    name: str
    phase: str
    ready: bool
    terminating: bool
    #: In-flight jobs from the pod-deletion-cost annotation; None when the pod has none yet.
    inflight: int | None
    restarts: int
    node: str | None


def hpa_view(hpa: Any) -> HpaView:
    """Summarise an autoscaling/v2 HorizontalPodAutoscaler (``V2HorizontalPodAutoscaler``)."""
    spec, status = hpa.spec, hpa.status
    return HpaView(
        name=hpa.metadata.name,
        current_replicas=status.current_replicas if status else None,
        desired_replicas=status.desired_replicas if status else None,
        min_replicas=spec.min_replicas,
        max_replicas=spec.max_replicas,
        metric=_external_metric_line(spec, status),
        problem=_scaling_problem(status),
    )


def _external_metric_line(spec: Any, status: Any) -> str | None:
    targets = {
        m.external.metric.name: m.external.target
        for m in spec.metrics or []
        if m.type == "External" and m.external is not None
    }
    for current in (status.current_metrics or []) if status else []:
        if current.type != "External" or current.external is None:
            continue
        name = current.external.metric.name
        value = current.external.current
        shown = value.average_value if value.average_value is not None else value.value
        target = targets.get(name)
        wanted = target.average_value or target.value if target is not None else None
        per = " per worker" if value.average_value is not None else ""
        return f"{name} {shown}{per} (target {wanted})"
    return None


def _scaling_problem(status: Any) -> str | None:
    for condition in (status.conditions or []) if status else []:
        if condition.type in ("AbleToScale", "ScalingActive") and condition.status == "False":
            return f"{condition.type}: {condition.reason}: {condition.message}"
    return None


def worker_views(pods: Any) -> list[WorkerView]:
    """One row per pod of a ``V1PodList`` (or a list of ``V1Pod``), sorted by name."""
    items = pods.items if hasattr(pods, "items") else pods
    return sorted((_worker_view(pod) for pod in items), key=lambda w: w.name)


def _worker_view(pod: Any) -> WorkerView:
    status = pod.status
    conditions = (status.conditions or []) if status else []
    statuses = (status.container_statuses or []) if status else []
    annotations = pod.metadata.annotations or {}
    return WorkerView(
        name=pod.metadata.name,
        phase=(status.phase if status else None) or "Unknown",
        ready=any(c.type == "Ready" and c.status == "True" for c in conditions),
        terminating=pod.metadata.deletion_timestamp is not None,
        inflight=_parse_int(annotations.get(DELETION_COST_ANNOTATION)),
        restarts=sum(s.restart_count or 0 for s in statuses),
        node=pod.spec.node_name if pod.spec else None,
    )


def _parse_int(text: str | None) -> int | None:
    try:
        return int(text) if text is not None else None
    except ValueError:
        return None


def queue_lengths(metrics_text: str) -> dict[str, float]:
    """``genq_queue_length`` per queue label from a Prometheus text exposition."""
    queues: dict[str, float] = {}
    for family in text_string_to_metric_families(metrics_text):
        for sample in family.samples:
            if sample.name == QUEUE_LENGTH_METRIC:
                queues[sample.labels.get("queue", "")] = sample.value
    return queues


def prometheus_queue_lengths(response: dict[str, Any]) -> dict[str, float]:
    """``genq_queue_length`` per queue from a Prometheus /api/v1/query vector response."""
    return {
        item["metric"].get("queue", ""): float(item["value"][1])
        for item in response.get("data", {}).get("result", [])
    }


def render_status(
    namespace: str,
    hpa: HpaView | None,
    workers: list[WorkerView],
    queues: dict[str, float] | None,
    *,
    queue_source: str,
    problems: list[str] | None = None,
) -> str:
    """The whole screen as text."""
    lines = [f"genq in namespace {namespace}", ""]
    lines += _hpa_lines(hpa)
    lines += _queue_lines(queues, queue_source)
    lines += _worker_lines(workers)
    if problems:
        lines += ["", "Problems:"] + [f"  {p}" for p in problems]
    return "\n".join(lines) + "\n"


def _hpa_lines(hpa: HpaView | None) -> list[str]:
    if hpa is None:
        return ["Autoscaler: not found", ""]

    def shown(value: int | None) -> str:
        return "?" if value is None else str(value)

    lines = [
        f"Autoscaler {hpa.name}: {shown(hpa.current_replicas)} current -> "
        f"{shown(hpa.desired_replicas)} desired (min {shown(hpa.min_replicas)}, "
        f"max {shown(hpa.max_replicas)})",
        f"  metric: {hpa.metric or 'no value yet'}",
    ]
    if hpa.problem:
        lines.append(f"  not scaling: {hpa.problem}")
    return [*lines, ""]


def _queue_lines(queues: dict[str, float] | None, source: str) -> list[str]:
    if queues is None:
        return [f"Queue length ({source}): unavailable", ""]
    if not queues:
        return [f"Queue length ({source}): no {QUEUE_LENGTH_METRIC} samples", ""]
    lines = [f"Queue length ({source}):"]
    lines += [f"  {queue}  {value:g}" for queue, value in sorted(queues.items())]
    return [*lines, ""]


def _worker_lines(workers: list[WorkerView]) -> list[str]:
    ready = sum(w.ready for w in workers)
    inflight = sum(w.inflight or 0 for w in workers)
    header = ("NAME", "READY", "STATUS", "IN-FLIGHT", "RESTARTS", "NODE")
    rows = [header] + [
        (
            w.name,
            "yes" if w.ready else "no",
            "Draining" if w.terminating else w.phase,
            "-" if w.inflight is None else str(w.inflight),
            str(w.restarts),
            w.node or "-",
        )
        for w in workers
    ]
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    table = ["  " + "  ".join(c.ljust(n) for c, n in zip(row, widths, strict=True)).rstrip() for row in rows]
    title = f"Workers: {len(workers)} pods, {ready} ready, {inflight} jobs in flight"
    return [title] + (table if workers else ["  (no worker pods)"])


def _load_kube_config(kubeconfig: str | None, context: str | None) -> None:
    """In a pod (and no kubeconfig or context asked for): the service account; else kubeconfig."""
    from kubernetes import config

    if kubeconfig is None and context is None and os.environ.get("KUBERNETES_SERVICE_HOST"):
        config.load_incluster_config()
    else:
        config.load_kube_config(config_file=kubeconfig, context=context)


def _http_get(url: str, headers: dict[str, str]) -> bytes:
    if urllib.parse.urlsplit(url).scheme not in ("http", "https"):
        raise ValueError(f"not an http(s) URL: {url}")
    request = urllib.request.Request(url, headers=headers)  # noqa: S310 - scheme checked above
    with urllib.request.urlopen(request, timeout=HTTP_TIMEOUT_S) as response:  # noqa: S310
        body: bytes = response.read()
    return body


def _fetch_queues(api_url: str, api_key: str | None, prometheus_url: str | None) -> dict[str, float]:
    if prometheus_url:
        query = urllib.parse.urlencode({"query": f"max by (queue) ({QUEUE_LENGTH_METRIC})"})
        body = _http_get(f"{prometheus_url.rstrip('/')}/api/v1/query?{query}", {})
        return prometheus_queue_lengths(json.loads(body))
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    return queue_lengths(_http_get(f"{api_url.rstrip('/')}/metrics", headers).decode())


@app.command()
def status(
    *,
    namespace: Annotated[str, typer.Option(help="Namespace genq runs in.")] = "genq",
    hpa_name: Annotated[
        str, typer.Option(help="Worker HPA name (KEDA's is keda-hpa-genq-worker).")
    ] = "genq-worker",
    selector: Annotated[str, typer.Option(help="Label selector of the worker pods.")] = WORKER_SELECTOR,
    api_url: Annotated[
        str,
        typer.Option(envvar="GENQ_API_URL", help="genq API base URL; its /metrics gives the queue length."),
    ] = DEFAULT_API_URL,
    api_key: Annotated[
        str | None, typer.Option(envvar="GENQ_API_KEY", help="API key, if /metrics needs one.")
    ] = None,
    prometheus_url: Annotated[
        str | None, typer.Option(help="Read the queue length from this Prometheus instead of the API.")
    ] = None,
    kubeconfig: Annotated[
        str | None, typer.Option(envvar="KUBECONFIG", help="kubeconfig file(s) (default ~/.kube/config).")
    ] = None,
    context: Annotated[str | None, typer.Option(help="kubeconfig context (default: current).")] = None,
) -> None:
    """One screen: HPA replicas, worker pods with in-flight jobs, queue length."""
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    problems: list[str] = []
    try:
        _load_kube_config(kubeconfig, context)
    except Exception as exc:  # shown to the operator, then exit 1
        typer.echo(f"cannot load a Kubernetes config: {exc}", err=True)
        raise typer.Exit(1) from exc

    hpa: HpaView | None = None
    try:
        hpa = hpa_view(
            client.AutoscalingV2Api().read_namespaced_horizontal_pod_autoscaler(hpa_name, namespace)
        )
    except ApiException as exc:
        if exc.status != 404:
            problems.append(f"HPA {hpa_name}: HTTP {exc.status} {exc.reason}")

    workers: list[WorkerView] = []
    try:
        workers = worker_views(client.CoreV1Api().list_namespaced_pod(namespace, label_selector=selector))
    except ApiException as exc:
        problems.append(f"worker pods: HTTP {exc.status} {exc.reason}")

    source = prometheus_url or f"{api_url.rstrip('/')}/metrics"
    queues: dict[str, float] | None = None
    try:
        queues = _fetch_queues(api_url, api_key, prometheus_url)
    except Exception as exc:  # network or parse error: show it, keep the screen
        problems.append(f"queue length from {source}: {exc}")

    typer.echo(
        render_status(namespace, hpa, workers, queues, queue_source=source, problems=problems), nl=False
    )
    if problems and hpa is None and not workers:
        raise typer.Exit(1)
