"""Fixtures of the `genq k8s` tests (cli/k8s.py): the fake Kubernetes API server (tests/kube.py)."""

from tests.kube import core_api, kube

__all__ = ["core_api", "kube"]
