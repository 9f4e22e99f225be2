"""shared/key_secrets.py: which secrets sign a key's deliveries. A secret made through the API
wins over GENQ_WEBHOOK_KEY_SECRETS, which wins over the deployment's GENQ_WEBHOOK_SECRET; a
rotation keeps the previous secret signing for the grace period (real Redis)."""

from __future__ import annotations

import base64
import hashlib
import json
from collections.abc import Callable

import pytest
import redis
import redis.asyncio as aioredis

from cli.redis_server import EmbeddedRedis
from shared import keys, signing
from shared.config import Settings
from shared.key_secrets import new_secret, rotate
from shared.key_secrets import signing_keys as signing_keys_of

CONFIGURED = "whsec_" + base64.b64encode(b"configured for key-a, 24 bytes").decode()
DEFAULT = (b"the deployment's secret",)


@pytest.fixture
def configured(make_settings: Callable[..., Settings]) -> Settings:
    return make_settings(webhook_key_secrets=json.dumps({"key-a": CONFIGURED}))


def test_new_secrets_are_whsec_random_32_bytes() -> None:
    made = {new_secret() for _ in range(50)}
    assert len(made) == 50
    for secret in made:
        assert secret.startswith(signing.SECRET_PREFIX)
        assert len(signing.parse_secrets(secret)[0]) == 32


def signing_keys(
    client: redis.Redis, owner: str, settings: Settings, default: tuple[bytes, ...]
) -> tuple[bytes, ...]:
    """As the delivery worker reads them: MGET of the owner's secrets, then signing_keys."""
    return signing_keys_of(client.mget(keys.webhook_key_secrets(owner)), owner, settings, default)


def test_without_a_stored_secret_the_configured_one_then_the_default_signs(
    redis_client: redis.Redis, configured: Settings
) -> None:
    assert signing_keys(redis_client, "key-a", configured, DEFAULT) == signing.parse_secrets(CONFIGURED)
    assert signing_keys(redis_client, "key-b", configured, DEFAULT) == DEFAULT


@pytest.mark.anyio
async def test_a_rotated_secret_signs_with_the_previous_one_during_the_grace_period(
    redis_client: redis.Redis, redis_server: EmbeddedRedis, configured: Settings
) -> None:
    client = aioredis.Redis.from_url(redis_server.url, decode_responses=True)
    try:
        first, replaced = await rotate(client, "key-a")
        assert not replaced
        assert signing_keys(redis_client, "key-a", configured, DEFAULT) == signing.parse_secrets(first)
        second, replaced = await rotate(client, "key-a")
        assert replaced and second != first
        # Newest first: both sign while receivers move to the new one.
        both = signing.parse_secrets(f"{second} {first}")
        assert signing_keys(redis_client, "key-a", configured, DEFAULT) == both
        _, previous = keys.webhook_key_secrets("key-a")
        assert 0 < await client.ttl(previous) <= keys.WEBHOOK_SECRET_GRACE_S
        # Another owner is unaffected by key-a's secrets.
        assert signing_keys(redis_client, "key-b", configured, DEFAULT) == DEFAULT
    finally:
        await client.aclose()


def owner_of_key(key: str) -> str:
    """The owner id the API gives an API key (api/edge/auth.py)."""
    return "key-" + hashlib.sha256(key.encode()).hexdigest()[:16]


@pytest.mark.anyio
async def test_required_key_secrets_refuse_a_webhook_from_a_key_without_one(
    make_settings: Callable[..., Settings], redis_client: redis.Redis
) -> None:
    """Real HTTP. With GENQ_WEBHOOK_REQUIRE_KEY_SECRET a key whose deliveries would be signed with
    the shared GENQ_WEBHOOK_SECRET gets a 422 `invalid_request` naming `webhook` (as a webhook
    the target policy refuses does), and nothing is queued; one made
    through the API or configured in GENQ_WEBHOOK_KEY_SECRETS lets it in."""
    from tests.api.live_server import live_client

    settings = make_settings(
        api_keys=["key-a", "key-b", "key-c"], webhook_allow_private=True, webhook_require_key_secret=True,
        webhook_secret=CONFIGURED, webhook_key_secrets=json.dumps({owner_of_key("key-c"): CONFIGURED}),
    )  # fmt: skip
    job = {"prompt": "x", "cache": False, "webhook": "http://127.0.0.1:9/hook"}
    async with live_client(settings, "key-a") as a, live_client(settings, "key-c") as c:
        refused = await a.post("/v1/jobs", json=job)
        assert refused.status_code == 422, refused.text
        error = refused.json()["error"]
        assert (error["type"], error["param"]) == ("invalid_request", "webhook")
        assert (
            "GENQ_WEBHOOK_REQUIRE_KEY_SECRET" in error["message"] and "/v1/webhook-secret" in error["message"]
        )
        assert (await a.get("/v1/jobs")).json()["data"] == []
        assert (
            await a.post("/v1/jobs", json={"prompt": "x", "cache": False})
        ).status_code == 202  # no webhook
        assert (await a.post("/v1/webhook-secret")).status_code == 201
        assert (await a.post("/v1/jobs", json=job)).status_code == 202
        assert (await c.post("/v1/jobs", json=job)).status_code == 202  # configured for its owner


@pytest.mark.anyio
async def test_without_the_requirement_a_key_without_a_secret_uses_the_shared_one(
    make_settings: Callable[..., Settings], redis_client: redis.Redis
) -> None:
    from tests.api.live_server import live_client

    settings = make_settings(api_keys=["key-a"], webhook_allow_private=True, webhook_secret=CONFIGURED)
    async with live_client(settings, "key-a") as a:
        job = {"prompt": "x", "cache": False, "webhook": "http://127.0.0.1:9/hook"}
        assert (await a.post("/v1/jobs", json=job)).status_code == 202
    assert signing_keys_of([], owner_of_key("key-a"), settings, DEFAULT) == DEFAULT
