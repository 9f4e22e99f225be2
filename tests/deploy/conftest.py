"""Fixtures of the deployment tests: the fake Kubernetes API server and clients pointed at it."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client

from tests.deploy.fake_kube import FakeKube, serve


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
