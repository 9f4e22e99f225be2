"""Writes k8s/components/alerts/prometheusrule.yaml: the rule groups of genq-rules.yaml wrapped in
a Prometheus Operator PrometheusRule (kustomize cannot wrap a file into a resource itself).

Run it after editing genq-rules.yaml: python deploy/prometheus/render_prometheusrule.py
(tests/monitoring/test_alerts.py fails while the two differ)."""

from __future__ import annotations

from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "deploy/prometheus/genq-rules.yaml"
TARGET = ROOT / "k8s/components/alerts/prometheusrule.yaml"
HEADER = """\
# GENERATED from deploy/prometheus/genq-rules.yaml by deploy/prometheus/render_prometheusrule.py:
# edit that file, then run the script. Runbooks: docs/operations.md, "Alerts".
"""


class _Dumper(yaml.SafeDumper):
    """Multi-line strings (the PromQL) as `|` blocks, as people write them."""


def _string(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style="|" if "\n" in value else None)


_Dumper.add_representer(str, _string)


def render() -> str:
    rule = {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": {"name": "genq", "labels": {"app.kubernetes.io/name": "genq"}},
        "spec": {"groups": yaml.safe_load(RULES.read_text())["groups"]},
    }
    return HEADER + yaml.dump(rule, Dumper=_Dumper, sort_keys=False, width=200, allow_unicode=True)


if __name__ == "__main__":
    TARGET.write_text(render())
