"""Fixtures of the worker tests: the fake Kubernetes API server of the scale-in tests
(tests/kube.py). The webhook receivers are in tests/workers/webhooks/conftest.py."""

from __future__ import annotations

from tests.kube import core_api, kube

__all__ = ["core_api", "kube"]
