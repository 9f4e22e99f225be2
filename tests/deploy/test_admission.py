"""The worker's admission policy is cluster-scoped: installs of genq in two namespaces must get
two policies and two bindings (no name shared, so neither overwrites or deletes the other's),
each matching only its own install's worker."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import yaml

from tests.deploy.test_manifests import of_kind, render
from tests.deploy.tools import ROOT, load, load_all, run, tool

ADMISSION_KINDS = ("ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding")


def render_into(namespace: str, overlay: str, where: Path) -> tuple[dict[str, Any], ...]:
    """An overlay of the operator's own that installs `overlay` into another namespace, with the
    replacements docs/operations.md tells it to copy (the ones every shipped overlay carries)."""
    folder = where / namespace
    folder.mkdir()
    shipped = load(f"k8s/overlays/{overlay}/kustomization.yaml")
    kustomization = {
        "namespace": namespace,
        "resources": [os.path.relpath(ROOT / "k8s" / "overlays" / overlay, folder)],
        "replacements": shipped["replacements"],
    }
    (folder / "kustomization.yaml").write_text(yaml.safe_dump(kustomization))
    return tuple(load_all(run(tool("kubectl"), "kustomize", str(folder))))


def cluster_scoped_names(docs: tuple[dict[str, Any], ...]) -> set[tuple[str, str]]:
    kinds = {"Namespace", "ClusterRole", "ClusterRoleBinding", *ADMISSION_KINDS}
    return {(d["kind"], d["metadata"]["name"]) for d in docs if d["kind"] in kinds}


def worker_policy(docs: tuple[dict[str, Any], ...]) -> tuple[dict[str, Any], dict[str, Any]]:
    (policy,) = of_kind(docs, "ValidatingAdmissionPolicy")
    (binding,) = of_kind(docs, "ValidatingAdmissionPolicyBinding")
    return policy, binding


def matches_worker_of(docs: tuple[dict[str, Any], ...], username: str, namespace: str) -> bool:
    """Whether the install's policy applies to a pod update by `username` in `namespace`: the
    binding's namespace selector, then the match condition (its one CEL expression evaluated on
    the two strings it reads; the test below pins its exact text)."""
    policy, binding = worker_policy(docs)
    selector = binding["spec"]["matchResources"]["namespaceSelector"]["matchLabels"]
    if selector != {"kubernetes.io/metadata.name": namespace}:
        return False
    (condition,) = policy["spec"]["matchConditions"]
    prefix, account = "request.userInfo.username == 'system:serviceaccount:' + request.namespace + ':", "'"
    expression = condition["expression"]
    assert expression.startswith(prefix) and expression.endswith(account), expression
    return username == f"system:serviceaccount:{namespace}:{expression[len(prefix) : -1]}"


def test_two_installs_share_no_cluster_scoped_name(tmp_path: Path) -> None:
    team_a = render_into("team-a", "prod", tmp_path)
    team_b = render_into("team-b", "prod", tmp_path)
    assert not cluster_scoped_names(team_a) & cluster_scoped_names(team_b)
    for namespace, docs in (("team-a", team_a), ("team-b", team_b)):
        policy, binding = worker_policy(docs)
        assert policy["metadata"]["name"] == f"genq-worker-pod-deletion-cost.{namespace}"
        assert binding["metadata"]["name"] == policy["metadata"]["name"] == binding["spec"]["policyName"]


def test_each_install_policy_matches_only_its_own_worker(tmp_path: Path) -> None:
    team_a = render_into("team-a", "prod", tmp_path)
    team_b = render_into("team-b", "prod", tmp_path)
    worker_a, worker_b = (
        "system:serviceaccount:team-a:genq-worker",
        "system:serviceaccount:team-b:genq-worker",
    )
    assert matches_worker_of(team_a, worker_a, "team-a")
    assert not matches_worker_of(team_a, worker_b, "team-b")
    assert matches_worker_of(team_b, worker_b, "team-b")
    assert not matches_worker_of(team_b, worker_a, "team-a")
    assert not matches_worker_of(team_a, "system:serviceaccount:team-a:default", "team-a")
    for namespace, docs in (("team-a", team_a), ("team-b", team_b)):
        (binding,) = of_kind(docs, "RoleBinding")
        assert binding["subjects"] == [
            {"kind": "ServiceAccount", "name": "genq-worker", "namespace": namespace}
        ]


def test_no_namespace_is_written_into_the_policy() -> None:
    """The shipped overlays name their namespace once (`namespace:`); the policy's text names none."""
    for overlay in ("dev", "prod", "prod-keda"):
        policy, binding = worker_policy(render(overlay))
        assert "genq:" not in str(policy["spec"]) and "serviceaccount:genq" not in str(policy["spec"])
        assert binding["metadata"]["name"].endswith(".genq")
