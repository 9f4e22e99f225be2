"""What the API pods of each overlay are told, checked against the settings that read it: several
replicas share their files through S3 (genq refuses local storage with GENQ_API_REPLICAS > 1),
and /metrics is served only with a token that the ServiceMonitor sends."""

from __future__ import annotations

from typing import Any, cast

import pydantic
import pytest

from shared.config import Settings
from tests.deploy.test_manifests import OVERLAYS, env_value, named, render

FILE_SETTINGS = ("GENQ_FILE_STORAGE", "GENQ_S3_BUCKET", "GENQ_S3_ENDPOINT_URL", "GENQ_API_REPLICAS")


def api_container(docs: tuple[dict[str, Any], ...]) -> dict[str, Any]:
    (container,) = named(docs, "Deployment", "genq-api")["spec"]["template"]["spec"]["containers"]
    return cast(dict[str, Any], container)


def secret_refs(container: dict[str, Any]) -> set[str]:
    return {source["secretRef"]["name"] for source in container.get("envFrom", []) if "secretRef" in source}


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_api_replicas_declared_are_the_deployments(overlay: str) -> None:
    docs = render(overlay)
    replicas = named(docs, "Deployment", "genq-api")["spec"]["replicas"]
    assert env_value(api_container(docs), "GENQ_API_REPLICAS", docs) == str(replicas)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_api_pods_file_settings_start(overlay: str) -> None:
    """The settings each overlay gives its API pods pass genq's start-up checks; prod's replicas
    use a bucket, with the credentials from the Secret genq-s3."""
    docs = render(overlay)
    container = api_container(docs)
    values: dict[str, Any] = {name: env_value(container, name, docs) for name in FILE_SETTINGS}
    given = {name.removeprefix("GENQ_").lower(): value for name, value in values.items() if value}
    settings = Settings(_env_file=None, **given)
    if settings.api_replicas > 1:
        assert settings.file_storage == "s3" and settings.s3_bucket
        assert "genq-s3" in secret_refs(container)


def test_local_storage_with_several_replicas_is_refused_naming_both() -> None:
    with pytest.raises(pydantic.ValidationError) as refused:
        Settings(_env_file=None, file_storage="local", api_replicas=3)
    assert "GENQ_FILE_STORAGE is local but GENQ_API_REPLICAS is 3" in str(refused.value)
    Settings(_env_file=None, file_storage="local", api_replicas=1)
    Settings(_env_file=None, file_storage="s3", s3_bucket="files", api_replicas=3)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_metrics_need_a_token_the_service_monitor_sends(overlay: str) -> None:
    docs = render(overlay)
    (token,) = [var for var in api_container(docs)["env"] if var["name"] == "GENQ_METRICS_TOKEN"]
    reference = token["valueFrom"]["secretKeyRef"]
    pod = named(docs, "Deployment", "genq-api")["spec"]["template"]["metadata"]
    assert "prometheus.io/scrape" not in pod.get("annotations", {}), "annotation scrapers send no token"
    if overlay != "dev":
        (endpoint,) = named(docs, "ServiceMonitor", "genq-api")["spec"]["endpoints"]
        assert endpoint["authorization"] == {"type": "Bearer", "credentials": reference}
