"""The autoscaling queries exactly as shipped (prometheus-adapter's metricsQuery, filled in as the
adapter fills it, and the KEDA trigger's query), run by a real Prometheus scraping two real API
processes with the namespace label a ServiceMonitor adds: both read a known backlog once, although
each API process reports all of it."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from shared.config import Settings
from tests.conftest import ApiProcess
from tests.deploy.tools import load
from tests.monitoring.prometheus import Prometheus, scrape_job, value

pytestmark = pytest.mark.slow

BACKLOG = 37
QUEUE = "genq.placeholder-echo"
NAMESPACE = "genq"


def adapter_query(queue: str) -> str:
    """The adapter's metricsQuery for the HPA's request (`queue=<queue>` in namespace genq)."""
    (rule,) = load("deploy/prometheus-adapter/config.yaml")["externalRules"]
    series = rule["name"]["as"]
    # The adapter joins the namespace it is asked in (resources.overrides) and the HPA's selector.
    matchers = f'namespace="{NAMESPACE}",queue="{queue}"'
    return str(rule["metricsQuery"]).replace("<<.Series>>", series).replace("<<.LabelMatchers>>", matchers)


def keda_query(queue: str) -> str:
    """The ScaledObject's query, pointed at the test's queue instead of the shipped model's."""
    scaled = load("k8s/components/keda/scaledobject.yaml")
    query = str(scaled["spec"]["triggers"][0]["metadata"]["query"])
    return re.sub(r'queue="[^"]*"', f'queue="{queue}"', query)


def test_shipped_autoscaling_queries_count_the_backlog_once(
    make_settings: Callable[..., Settings],
    redis_client: object,
    start_api: Callable[[Settings], ApiProcess],
    start_prometheus: Callable[[list[dict[str, Any]]], Prometheus],
) -> None:
    settings = make_settings()  # no worker: every accepted job stays queued
    apis = [start_api(settings), start_api(settings)]
    for index in range(BACKLOG):
        reply = httpx.post(f"{apis[index % 2].url}/v1/jobs", json={"prompt": f"job {index}"})
        assert reply.status_code == 202, reply.text
    prometheus = start_prometheus([scrape_job("genq-api", [api.url for api in apis], namespace=NAMESPACE)])

    both = f'genq_queue_length{{queue="{QUEUE}"}}'
    prometheus.wait_for(both, lambda result: [float(s["value"][1]) for s in result] == [BACKLOG] * 2)
    assert value(prometheus.query(f"sum({both})")) == 2 * BACKLOG  # what a sum would wrongly read
    assert value(prometheus.query(adapter_query(QUEUE))) == BACKLOG
    assert value(prometheus.query(keda_query(QUEUE))) == BACKLOG
    # Another namespace's queue of the same name is not this one's.
    assert prometheus.query(adapter_query(QUEUE).replace(f'"{NAMESPACE}"', '"elsewhere"')) == []
