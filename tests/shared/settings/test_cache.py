"""Response cache settings (shared/settings/cache.py): the dedicated cache Redis's URL is a secret
(it may carry a password) that its clients still get whole."""

from __future__ import annotations

from collections.abc import Callable

from shared.config import Settings


def test_the_cache_redis_url_is_hidden_but_handed_to_clients_whole(from_env: Callable[..., Settings]) -> None:
    url = "redis://genq:cache-pass-1@cache.internal:6379/2"
    settings = from_env(cache_redis_url=url)
    assert settings.cache_redis_address == url
    assert "cache-pass-1" not in repr(settings) + settings.model_dump_json()
    assert from_env().cache_redis_address is None  # unset: the job store's Redis
