"""Every query of the Grafana dashboard (deploy/grafana/genq.json) parses and returns data from a
real Prometheus scraping a live stack (API, model worker, webhook worker) after traffic that
exercises each panel: jobs, cache hits, webhooks delivered and failing, shed and rate-limited
requests. kube-state-metrics is not part of a local stack: a static target serves its HPA series
under their real names, as the autoscaler panel expects them."""

from __future__ import annotations

import json
import math
import re
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import pytest
import redis

from cli.redis_server import free_port
from shared.config import Settings
from tests.conftest import ApiProcess, WorkerProcess
from tests.deploy.tools import ROOT, load
from tests.monitoring.prometheus import Prometheus, scrape_job

pytestmark = pytest.mark.slow

NAMESPACE = "genq"
#: What Grafana puts in place of the dashboard's variables.
VARIABLES = {"$namespace": NAMESPACE, "$__rate_interval": "1m"}
KUBE_STATE_METRICS = "".join(
    f'kube_horizontalpodautoscaler_{name}{{namespace="genq",horizontalpodautoscaler="genq-worker"}} {value}\n'
    for name, value in (
        ("status_desired_replicas", 3),
        ("status_current_replicas", 2),
        ("spec_max_replicas", 10),
    )
)


def dashboard_queries() -> list[tuple[str, str]]:
    """(panel title, PromQL) for every target of every panel, rows' panels included."""
    dashboard = json.loads((ROOT / "deploy/grafana/genq.json").read_text())
    panels = [p for top in dashboard["panels"] for p in [top, *top.get("panels", [])]]
    return [(panel["title"], target["expr"]) for panel in panels for target in panel.get("targets", [])]


def filled(expr: str) -> str:
    for name, value in VARIABLES.items():
        expr = expr.replace(name, value)
    assert "$" not in expr, f"a variable the test does not fill: {expr}"
    return expr


def test_replicated_series_aggregate_with_max() -> None:
    """Every API replica reports the same queue length and Redis memory: a sum would multiply
    them by the replica count, in the dashboard and in the alerts alike."""
    rules = load("deploy/prometheus/genq-rules.yaml")["groups"][0]["rules"]
    exprs = [expr for _, expr in dashboard_queries()] + [rule["expr"] for rule in rules]
    for expr in exprs:
        for aggregation in re.findall(
            r"(\w+)(?: by \([^)]*\))? \((?:deriv\()?genq_(?:queue_length|redis_memory)", expr
        ):
            assert aggregation == "max", expr


@contextmanager
def answering(status: int, body: bytes = b"") -> Iterator[str]:
    """A loopback HTTP server answering every GET and POST with this status and body."""

    class Handler(BaseHTTPRequestHandler):
        def answer(self) -> None:
            self.rfile.read(int(self.headers.get("content-length", 0)))
            self.send_response(status)
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_GET = do_POST = answer

        def log_message(self, *_: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def kube_state_metrics() -> Iterator[str]:
    with answering(200, KUBE_STATE_METRICS.encode()) as url:
        yield url


@pytest.fixture
def receiver() -> Iterator[str]:
    """A webhook receiver that accepts every delivery."""
    with answering(204) as url:
        yield url + "/hooks"


@pytest.fixture
def maxmemory(redis_client: redis.Redis) -> Iterator[None]:
    """A maxmemory on the suite's Redis, as production sets one (the memory panel's limit)."""
    redis_client.config_set("maxmemory", str(2**30))
    yield
    redis_client.config_set("maxmemory", "0")


def traffic(api: str, receiver: str, wave: int) -> None:
    """Jobs with webhooks that deliver and that fail, a cache hit, shed and rate-limited requests."""
    dead = f"http://127.0.0.1:{free_port()}/hooks"  # nothing listens: every attempt fails
    ids = []
    for i in range(3):  # fewer than max_queue_length: none of these is shed
        job = {"prompt": f"hello {wave} {i}", "max_tokens": 4, "webhook": dead if i == 0 else receiver}
        reply = httpx.post(f"{api}/v1/jobs", json=job)
        assert reply.status_code == 202, reply.text
        ids.append(reply.json()["id"])
    for _ in range(2):  # the second is answered from the cache
        reply = httpx.post(f"{api}/v1/jobs", json={"prompt": "cached", "max_tokens": 4},
                           headers={"Prefer": "wait=30"}, timeout=40)  # fmt: skip
        job = reply.json()
        ids.append(job["id"])
    for job_id in ids:
        assert (
            httpx.get(f"{api}/v1/jobs/{job_id}", params={"wait": 30}, timeout=40).json()["status"]
            == "succeeded"
        )
    statuses: list[int] = []
    while 503 not in statuses:  # long jobs until admission control sheds
        assert len(statuses) < 60, statuses
        job = {"prompt": f"long job {wave} {len(statuses)}", "max_tokens": 60}  # distinct: none coalesce
        statuses.append(httpx.post(f"{api}/v1/jobs", json=job).status_code)
        time.sleep(0.1)
    with httpx.Client(base_url=api) as client:  # reads until the read bucket runs dry
        assert any(client.get("/v1/jobs", params={"limit": 1}).status_code == 429 for _ in range(400))


def test_every_dashboard_query_returns_data_from_a_live_stack(
    make_settings: Callable[..., Settings],
    maxmemory: None,
    start_api: Callable[[Settings], ApiProcess],
    start_worker: Callable[..., WorkerProcess],
    start_prometheus: Callable[[list[dict[str, Any]]], Prometheus],
    kube_state_metrics: str,
    receiver: str,
) -> None:
    settings = make_settings(
        placeholder_step_s=0.02, max_batch_size=2, max_queue_length=4, rate_limit_read="40/20",
        webhook_allow_private=True, webhook_retry_delays_s=["0.2"], worker_metrics_port=free_port(),
    )  # fmt: skip
    hooks = settings.model_copy(update={"worker_metrics_port": free_port()})
    start_worker(settings)
    start_worker(hooks, "--queues", "webhooks")
    api = start_api(settings)
    workers = {"genq-worker": settings, "genq-webhook-worker": hooks}
    prometheus = start_prometheus([
        scrape_job("genq-api", [api.url], namespace=NAMESPACE),
        *(scrape_job(job, [f"http://127.0.0.1:{each.worker_metrics_port}"], namespace=NAMESPACE)
          for job, each in workers.items()),
        scrape_job("kube-state-metrics", [kube_state_metrics]),
    ])  # fmt: skip
    prometheus.wait_for(
        'count(up{job=~"genq.*"} == 1)', lambda result: bool(result) and result[0]["value"][1] == "3"
    )
    # Two waves: rates need a counter to rise between two scrapes, and the first wave's counters
    # may first appear in a scrape with their final values.
    traffic(api.url, receiver, wave=1)
    # ... and the second starts once the first's jobs ran and its read bucket has refilled.
    prometheus.wait_for('genq_webhook_attempts_total{outcome="failed"}', bool)
    _until_queue_empty(api.url)  # as the API's admission control sees it, not an older scrape
    time.sleep(2)
    traffic(api.url, receiver, wave=2)

    def has_data(result: list[dict[str, Any]]) -> bool:
        return any(not math.isnan(float(sample["value"][1])) for sample in result)

    missing = []
    for title, expr in dashboard_queries():
        try:
            prometheus.wait_for(filled(expr), has_data, timeout_s=20)
        except AssertionError as exc:
            missing.append(f"{title}: {exc}")
    assert not missing, "\n".join(missing)
    # The alerts read series of the same stack: each genq series they name exists.
    exported = {s["metric"]["__name__"] for s in prometheus.query('{__name__=~"genq_.+"}')}
    assert alert_series() <= exported


def _until_queue_empty(api: str, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    empty = 'genq_queue_length{queue="genq.placeholder-echo"} 0.0'
    while empty not in httpx.get(f"{api}/metrics").text:
        assert time.monotonic() < deadline, "the long jobs never drained"
        time.sleep(0.5)


def alert_series() -> set[str]:
    rules = load("deploy/prometheus/genq-rules.yaml")["groups"][0]["rules"]
    return {name for rule in rules for name in re.findall(r"\bgenq_\w+", rule["expr"])}


def test_the_dashboard_is_well_formed() -> None:
    """Grafana needs unique panel ids; every panel reads the chosen data source and says what it
    shows; every query fills the namespace variable."""
    dashboard = json.loads((ROOT / "deploy/grafana/genq.json").read_text())
    panels = [p for p in dashboard["panels"] if p["type"] != "row"]
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    for panel in panels:
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel["title"]
        assert panel["description"], panel["title"]
    for title, expr in dashboard_queries():
        assert 'namespace=~"$namespace"' in expr, title
