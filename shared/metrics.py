"""Prometheus metric names shared by the API, the workers and the deployment files."""

from __future__ import annotations

#: Jobs accepted and not yet running, wherever their message sits (the autoscaling signal).
QUEUE_LENGTH_METRIC = "genq_queue_length"
