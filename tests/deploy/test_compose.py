"""docker-compose.yml and deploy/prometheus.yml: schema-valid, consistent, secrets required.

The Compose Specification JSON schema comes vendored in check-jsonschema (vendor.compose-spec);
no Docker engine is needed.
"""

from __future__ import annotations

import importlib.resources
import json
import re
from typing import Any

import pytest

from tests.deploy.tools import ROOT, load

jsonschema = pytest.importorskip("jsonschema", reason="jsonschema is not installed (dev extras)")

REQUIRED_SECRETS = {"GENQ_API_KEYS", "GENQ_WEBHOOK_SECRET", "GENQ_FLOWER_BASIC_AUTH", "GENQ_METRICS_TOKEN"}


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    data: dict[str, Any] = load("docker-compose.yml")
    return data


def test_validates_against_the_compose_specification(compose: dict[str, Any]) -> None:
    pytest.importorskip("check_jsonschema", reason="check-jsonschema (compose-spec schema) not installed")
    text = (
        importlib.resources.files("check_jsonschema.builtin_schemas.vendor") / "compose-spec.json"
    ).read_text()
    schema = json.loads(text)
    validator = jsonschema.validators.validator_for(schema)(schema)
    errors = [f"{e.message} at {list(e.path)}" for e in validator.iter_errors(compose)]
    assert not errors, "\n".join(errors)


def test_depends_on_names_defined_services_and_waits_for_health(compose: dict[str, Any]) -> None:
    services = compose["services"]
    for name, service in services.items():
        for dependency, rule in service.get("depends_on", {}).items():
            assert dependency in services, f"{name} depends on undefined service {dependency}"
            if rule["condition"] == "service_healthy":
                assert "healthcheck" in services[dependency], (
                    f"{name} waits for {dependency}'s missing healthcheck"
                )
    assert services["api"]["depends_on"]["redis"] == {"condition": "service_healthy"}
    assert services["worker"]["depends_on"]["redis"] == {"condition": "service_healthy"}


def test_required_secrets_fail_fast(compose: dict[str, Any]) -> None:
    """Each secret is `${VAR:?message}`: compose refuses to start without it."""
    text = (ROOT / "docker-compose.yml").read_text()
    required = set(re.findall(r"\$\{(\w+):\?[^}]+\}", text))
    assert required >= REQUIRED_SECRETS
    for service in compose["services"].values():
        for key, value in service.get("environment", {}).items():
            if key in REQUIRED_SECRETS:
                assert value.startswith(f"${{{key}:?"), key


def test_every_service_has_a_healthcheck_and_pinned_image(compose: dict[str, Any]) -> None:
    for name, service in compose["services"].items():
        assert "healthcheck" in service, name
        image = service["image"]
        assert ":" in image.rsplit("/", 1)[-1] and not image.endswith(":latest"), f"{name}: {image}"


def test_servers_listen_on_all_interfaces(compose: dict[str, Any]) -> None:
    api = compose["services"]["api"]["command"]
    flower = compose["services"]["flower"]["command"]
    assert api[api.index("--host") + 1] == "0.0.0.0"
    assert flower[flower.index("--address") + 1] == "0.0.0.0"


def test_redis_keeps_an_append_only_file(compose: dict[str, Any]) -> None:
    command = compose["services"]["redis"]["command"]
    assert command[command.index("--appendonly") + 1] == "yes"
    assert command[command.index("--maxmemory-policy") + 1] == "noeviction"


def test_the_model_worker_sends_the_task_events_flower_shows(compose: dict[str, Any]) -> None:
    assert "flower" in compose["services"]
    assert compose["services"]["worker"]["environment"]["GENQ_WORKER_TASK_EVENTS"] == "true"


def test_stop_grace_period_covers_the_drain(compose: dict[str, Any]) -> None:
    for name in ("worker", "webhook-worker"):
        service = compose["services"][name]
        grace = int(service["stop_grace_period"].removesuffix("s"))
        assert grace > float(service["environment"]["GENQ_DRAIN_TIMEOUT_S"]), name


def test_prometheus_scrapes_every_metrics_endpoint(compose: dict[str, Any]) -> None:
    mounts = compose["services"]["prometheus"]["volumes"]
    assert "./deploy/prometheus.yml:/etc/prometheus/prometheus.yml:ro" in mounts
    config = load("deploy/prometheus.yml")
    # The alert rules, mounted where rule_files (relative to the config file) finds them.
    assert config["rule_files"] == ["genq-rules.yaml"]
    assert "./deploy/prometheus/genq-rules.yaml:/etc/prometheus/genq-rules.yaml:ro" in mounts
    targets = set()
    for job in config["scrape_configs"]:
        assert job.get("metrics_path", "/metrics") == "/metrics"
        for static in job.get("static_configs", []):
            targets |= set(static["targets"])
        for dns in job.get("dns_sd_configs", []):
            targets |= {f"{name}:{dns['port']}" for name in dns["names"]}
    assert targets == {"api:8000", "worker:9100", "webhook-worker:9100", "flower:5555"}
    for target in targets:
        assert target.split(":")[0] in compose["services"], target


def test_prometheus_sends_the_api_metrics_token(compose: dict[str, Any]) -> None:
    """The API binds 0.0.0.0, so it serves /metrics only with GENQ_METRICS_TOKEN: Prometheus
    reads the same variable, mounted as a Compose secret, as its bearer token."""
    (api_job,) = [
        job for job in load("deploy/prometheus.yml")["scrape_configs"] if job["job_name"] == "genq-api"
    ]
    assert api_job["authorization"] == {"type": "Bearer", "credentials_file": "/run/secrets/metrics_token"}
    assert compose["services"]["prometheus"]["secrets"] == ["metrics_token"]
    assert compose["secrets"]["metrics_token"] == {"environment": "GENQ_METRICS_TOKEN"}
    assert compose["services"]["api"]["environment"]["GENQ_METRICS_TOKEN"].startswith(
        "${GENQ_METRICS_TOKEN:?"
    )
