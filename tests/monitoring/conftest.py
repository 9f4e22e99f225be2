"""Fixtures of the monitoring tests: a real Prometheus, stopped after the test."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.monitoring.prometheus import Prometheus


@pytest.fixture
def start_prometheus(tmp_path: Path) -> Iterator[Callable[[list[dict[str, Any]]], Prometheus]]:
    started: list[Prometheus] = []

    def start(scrape_configs: list[dict[str, Any]]) -> Prometheus:
        prometheus = Prometheus(tmp_path, scrape_configs)
        started.append(prometheus)
        return prometheus.wait_ready()

    yield start
    for prometheus in started:
        prometheus.close()
