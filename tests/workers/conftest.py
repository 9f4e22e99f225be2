"""Fixtures of the scale-in tests (workers/scalein.py): the fake Kubernetes API server (tests/kube.py)."""

from tests.kube import core_api, kube

__all__ = ["core_api", "kube"]
