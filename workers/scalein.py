"""Safe scale-in: keep this pod's deletion cost equal to the worker's in-flight job count.

When a ReplicaSet scales in it deletes the pods with the lowest
``controller.kubernetes.io/pod-deletion-cost`` first. A worker that keeps the annotation equal to
the number of jobs it is running makes the HPA (or KEDA) remove idle workers before busy ones; the
ones it does remove still drain in their ``preStop`` hook.

The worker calls :meth:`PodDeletionCost.update` whenever its in-flight count changes and on every
heartbeat tick: a change that arrives inside the throttle interval is sent by a later call.
Patching is best effort and never raises into the worker: a failure is logged and retried later.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from shared.logging import fields

if TYPE_CHECKING:
    from kubernetes.client import CoreV1Api

DELETION_COST_ANNOTATION = "controller.kubernetes.io/pod-deletion-cost"
MERGE_PATCH = "application/merge-patch+json"
#: (connect, read) seconds for one PATCH: a slow API server must not stall the worker for long.
REQUEST_TIMEOUT_S = (2.0, 5.0)
_INT32_MAX = 2**31 - 1

log = logging.getLogger(__name__)


class PodDeletionCost:
    """Keeps one pod's deletion-cost annotation equal to an in-flight job count."""

    def __init__(
        self,
        namespace: str,
        pod_name: str,
        api: CoreV1Api | None = None,
        min_interval_s: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``api`` None builds a client from the in-cluster service account on first use.

        ``clock`` is for tests.
        """
        self.namespace = namespace
        self.pod_name = pod_name
        self.min_interval_s = min_interval_s
        self._api = api
        self._clock = clock
        self._sent: int | None = None
        self._last_attempt: float | None = None

    def update(self, inflight: int) -> bool:
        """Patch the annotation to ``inflight`` if it changed and the interval has passed.

        Returns True when this call patched the pod. Never raises.
        """
        cost = min(max(int(inflight), 0), _INT32_MAX)
        if cost == self._sent:
            return False
        now = self._clock()
        if self._last_attempt is not None and now - self._last_attempt < self.min_interval_s:
            return False
        self._last_attempt = now
        try:
            self._core_api().patch_namespaced_pod(
                name=self.pod_name,
                namespace=self.namespace,
                body={"metadata": {"annotations": {DELETION_COST_ANNOTATION: str(cost)}}},
                _content_type=MERGE_PATCH,
                _request_timeout=REQUEST_TIMEOUT_S,
            )
        except Exception as exc:  # best effort: the worker must keep serving
            log.warning(
                "pod_deletion_cost_patch_failed",
                extra=fields(
                    pod=self.pod_name,
                    namespace=self.namespace,
                    inflight=cost,
                    retry_in_s=self.min_interval_s,
                    error=_describe(exc),
                ),
            )
            return False
        self._sent = cost
        return True

    def _core_api(self) -> CoreV1Api:
        if self._api is None:
            from kubernetes import client, config

            config.load_incluster_config()
            self._api = client.CoreV1Api()
        return self._api


def from_env(
    enabled: bool,
    namespace: str | None,
    pod_name: str | None,
    *,
    min_interval_s: float = 5.0,
    environ: Mapping[str, str] | None = None,
) -> PodDeletionCost | None:
    """Build a :class:`PodDeletionCost` from settings values, or None when it cannot apply.

    ``enabled``, ``namespace`` and ``pod_name`` are GENQ_POD_DELETION_COST, GENQ_POD_NAMESPACE and
    GENQ_POD_NAME. None is returned when disabled (the default), when the pod's name or namespace is
    unknown, or outside a cluster (no KUBERNETES_SERVICE_HOST, which the kubelet sets in every pod).
    """
    env = os.environ if environ is None else environ
    if not enabled or not namespace or not pod_name:
        return None
    if not env.get("KUBERNETES_SERVICE_HOST"):
        log.warning(
            "pod_deletion_cost_disabled",
            extra=fields(reason="GENQ_POD_DELETION_COST is on but this is not a Kubernetes pod"),
        )
        return None
    return PodDeletionCost(namespace, pod_name, min_interval_s=min_interval_s)


def _describe(exc: Exception) -> str:
    status = getattr(exc, "status", None)
    reason = getattr(exc, "reason", None)
    if status is not None:
        return f"{type(exc).__name__}: HTTP {status} {reason or ''}".strip()
    return f"{type(exc).__name__}: {exc}"
