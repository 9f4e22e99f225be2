"""Per-key webhook signing secrets: which secrets sign a job's deliveries.

A key's deliveries are signed with its own secret when it has one: made through the API (kept in
Redis, keys.webhook_key_secrets), else given in GENQ_WEBHOOK_KEY_SECRETS; only a key with
neither falls back to the deployment's GENQ_WEBHOOK_SECRET (single-tenant installs). So a tenant's
receiver, holding only its own secret, can verify nothing signed for another tenant. With
GENQ_WEBHOOK_REQUIRE_KEY_SECRET a key with neither may not ask for webhooks at all.
"""

from __future__ import annotations

import base64
import os
from collections.abc import Sequence

import redis.asyncio as aioredis

from shared import keys, signing
from shared.config import Settings
from shared.errors import InvalidRequest

#: Random bytes in a new secret (Standard Webhooks recommends 24 to 64).
SECRET_BYTES = 32


def new_secret() -> str:
    return signing.SECRET_PREFIX + base64.b64encode(os.urandom(SECRET_BYTES)).decode()


async def rotate(client: aioredis.Redis, owner: str) -> tuple[str, bool]:
    """Give the owner a new secret; return it (the only time it is shown) and whether it replaced
    one, which keeps signing for keys.WEBHOOK_SECRET_GRACE_S."""
    current, previous = keys.webhook_key_secrets(owner)
    secret = new_secret()
    replaced = await client.set(current, secret, get=True)
    if replaced:
        await client.set(previous, replaced, ex=keys.WEBHOOK_SECRET_GRACE_S)
    return secret, bool(replaced)


def signing_keys(
    stored: Sequence[object], owner: str, settings: Settings, default: tuple[bytes, ...]
) -> tuple[bytes, ...]:
    """The HMAC keys that sign this owner's deliveries, newest first, given `stored`: the values of
    the owner's keys.webhook_key_secrets as MGET reads them (the delivery worker reads them in the
    pipeline of its attempt)."""
    texts = [_text(value) for value in stored if value]
    if texts:
        return tuple(key for text in texts for key in signing.parse_secrets(text))
    return settings.key_secrets.get(owner, default)


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


async def has_own_secret(client: aioredis.Redis, owner: str, settings: Settings) -> bool:
    """Whether the owner's deliveries are signed with a secret of its own (made through the API,
    or in GENQ_WEBHOOK_KEY_SECRETS), not the shared GENQ_WEBHOOK_SECRET."""
    if owner in settings.key_secrets:
        return True
    current, _previous = keys.webhook_key_secrets(owner)
    return bool(await client.exists(current))


async def require_own_secret(client: aioredis.Redis, owner: str, settings: Settings, param: str) -> None:
    """At submit, with GENQ_WEBHOOK_REQUIRE_KEY_SECRET: refuse a webhook (`param`) from an owner
    that would be signed with the shared secret."""
    if settings.webhook_require_key_secret and not await has_own_secret(client, owner, settings):
        raise InvalidRequest(
            "this API key has no webhook signing secret of its own, and this API signs no webhook with "
            "the shared one (GENQ_WEBHOOK_REQUIRE_KEY_SECRET): create yours with POST /v1/webhook-secret",
            param=param,
        )
