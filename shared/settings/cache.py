"""Settings of the response cache: its two levels and who shares it (docs/cache.md)."""

from __future__ import annotations

from pydantic import BaseModel, Field, SecretStr


class CacheSettings(BaseModel):
    """The response cache."""

    cache_enabled: bool = True
    """Answer identical deterministic requests (temperature 0 or a fixed seed) from the response
    cache, and coalesce identical ones in flight into one generation (docs/cache.md)."""

    cache_shared_across_keys: bool = False
    """With API keys, each key has its own cache and coalescing (one tenant never learns, from
    `cached: true`, what another asked). Set it for a single-tenant install whose keys trust each
    other, to share hits across them. Without keys there is one scope anyway."""

    cache_ttl_s: int = Field(86_400, ge=1)
    """How long a response stays in the shared (Redis) cache level after it was generated."""

    cache_redis_url: SecretStr | None = None
    """A dedicated Redis for the shared cache level (recommended in production, with
    `maxmemory-policy allkeys-lru`); like redis_url, never shown in a repr, dump or log. Unset:
    the job store's Redis (TTL-bounded only)."""

    cache_l1_max_entries: int = Field(10_000, ge=0)
    """Most responses each API process keeps in memory (level 1); 0 turns level 1 off."""

    cache_l1_max_bytes: int = Field(64 << 20, ge=0)
    """Most bytes of responses each API process keeps in memory (level 1)."""

    cache_l1_ttl_s: float = Field(300.0, gt=0)
    """How long an API process keeps a response in memory (never longer than cache_ttl_s)."""

    cache_fingerprint_refresh_s: float = Field(5.0, gt=0)
    """How often an API process re-reads the models' fingerprints that workers publish (a new
    model revision gets new cache keys within this long)."""

    @property
    def cache_redis_address(self) -> str | None:
        """cache_redis_url's value, password included (for clients only: never log it)."""
        return self.cache_redis_url.get_secret_value() if self.cache_redis_url else None
