"""genq's alert rules: valid PromQL (promtool check rules), each alert fires on the series that
should fire it and stays quiet on the others (promtool test rules, deploy/prometheus/
genq-rules.test.yaml), each has a runbook in docs/operations.md, and the PrometheusRule that
Kubernetes gets carries exactly these rules."""

from __future__ import annotations

import runpy
import shutil
from pathlib import Path
from typing import Any

from tests.deploy.tools import ROOT, load, run
from tests.monitoring.prometheus import binary

RULES = "deploy/prometheus/genq-rules.yaml"
RULE_TESTS = "deploy/prometheus/genq-rules.test.yaml"


def alerts() -> list[dict[str, Any]]:
    return [rule for group in load(RULES)["groups"] for rule in group["rules"] if "alert" in rule]


def promtool(*args: str) -> str:
    return run(binary("promtool"), *args)


def test_rules_parse_and_pass_their_unit_tests() -> None:
    assert f"SUCCESS: {len(alerts())} rules found" in promtool("check", "rules", RULES)
    assert "SUCCESS" in promtool("test", "rules", RULE_TESTS)


def test_the_compose_prometheus_config_loads_the_rules(tmp_path: Path) -> None:
    """docker-compose.yml mounts both files side by side; rule_files is relative to the config.
    The scrape's bearer token is compose's `metrics_token` secret: promtool checks that its file
    exists, so here it is a file of the test's own at the path compose mounts it."""
    token = tmp_path / "metrics_token"
    token.write_text("a-metrics-token\n")
    config = (ROOT / "deploy/prometheus.yml").read_text()
    assert "credentials_file: /run/secrets/metrics_token" in config
    (tmp_path / "prometheus.yml").write_text(config.replace("/run/secrets/metrics_token", str(token)))
    shutil.copy(ROOT / RULES, tmp_path / "genq-rules.yaml")
    checked = promtool("check", "config", str(tmp_path / "prometheus.yml"))
    assert f"SUCCESS: {len(alerts())} rules found" in checked


def test_every_alert_is_tested_firing() -> None:
    """promtool compares the whole set of alerts at each eval_time, so a test that lists one
    firing alert also proves the other series in it leave the alert quiet."""
    fired = {
        case["alertname"]
        for test in load(RULE_TESTS)["tests"]
        for case in test.get("alert_rule_test", [])
        if case.get("exp_alerts")
    }
    assert {alert["alert"] for alert in alerts()} <= fired


def test_every_alert_has_a_runbook() -> None:
    operations = (ROOT / "docs/operations.md").read_text()
    for alert in alerts():
        assert f"\n#### {alert['alert']}\n" in operations, f"no runbook heading for {alert['alert']}"
        assert alert["annotations"]["runbook_url"] == f"docs/operations.md#{alert['alert'].lower()}"
        assert alert["labels"]["severity"] in ("warning", "critical")


def test_the_prometheusrule_is_generated_from_the_rules() -> None:
    script = runpy.run_path(str(ROOT / "deploy/prometheus/render_prometheusrule.py"))
    shipped = (ROOT / "k8s/components/alerts/prometheusrule.yaml").read_text()
    assert shipped == script["render"](), "run: python deploy/prometheus/render_prometheusrule.py"
    assert load("k8s/components/alerts/prometheusrule.yaml")["spec"]["groups"] == load(RULES)["groups"]
