"""Response-cache keys: which requests may be answered from the cache, and the key of one.

The key is the SHA-256 of a canonical encoding of everything that determines a generation's
output: the model id and fingerprint (a digest of its weights and chat template), the prompt or
the chat messages, and every sampling parameter. The API (lookups, coalescing) and the workers
(writing results) both compute it here, from the job's spec (defaults filled in), so they always
agree. Nothing here imports FastAPI or torch.
"""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass

import orjson
import redis
import redis.exceptions

from shared import keys
from shared.jobspec import JobSpec, Sampling
from shared.logging import fields

log = logging.getLogger("genq.cache")

#: Part of every key: bump it when the encoding changes, and every old entry becomes unreachable.
KEY_VERSION = 1


@dataclass(frozen=True, slots=True)
class CacheEntry:
    """One cached response: the job's `output` field (JSON text) and what produced it."""

    output: str
    model_label: str

    @property
    def nbytes(self) -> int:
        return len(self.output.encode()) + len(self.model_label.encode())


def is_cacheable(spec: JobSpec) -> bool:
    """Deterministic requests only (greedy, or sampled with a fixed seed), and not opted out."""
    return spec.cache and (spec.temperature == 0.0 or spec.seed is not None)


def canonical_request(model_id: str, fingerprint: str, spec: JobSpec, scope: str = "") -> bytes:
    """The bytes that are hashed: sorted keys, no whitespace, numbers in one form.

    `scope` (the owner, when the cache is per key) is part of the document, so one key's
    requests never find, or coalesce with, another's; unscoped keys are as they always were.

    Stop strings keep their order and repeats: an engine may apply them in order, so a different
    list is conservatively a different request. Text is hashed exactly as given (no trimming or
    Unicode normalisation: either can change the tokens, hence the output).
    """
    messages = spec.messages
    document: dict[str, object] = {
        "v": KEY_VERSION,
        "model": model_id,
        "fingerprint": fingerprint,
        "prompt": spec.prompt,
        "messages": None if messages is None else [[m.role, m.content] for m in messages],
        **{name: _canonical(getattr(spec, name)) for name in _FIRST_FIELDS},
    }
    if scope:
        document["scope"] = scope
    return orjson.dumps(document | _generation_options(spec), option=orjson.OPT_SORT_KEYS)


#: The sampling fields of KEY_VERSION 1's document, always hashed.
_FIRST_FIELDS = ("max_tokens", "temperature", "top_p", "seed", "stop")


def _generation_options(spec: JobSpec) -> dict[str, object]:
    """Every other sampling field (each one of Sampling's, so a field added to the spec is part of
    the key), the template and the schema the response format enforces, each hashed only when it
    differs from its default: a request that leaves a field alone keeps the key it had before the
    field existed, one that sets it gets another."""
    options: dict[str, object] = {}
    if spec.template != "chat":
        options["template"] = spec.template
    for name, field in Sampling.model_fields.items():
        value = getattr(spec, name)
        if name not in _FIRST_FIELDS and value != field.get_default(call_default_factory=True):
            options[name] = _canonical(value)
    schema = spec.json_schema
    if schema is not None:  # what is enforced, not how it was named or described
        options["json_schema"] = orjson.loads(schema)
    return options


def _canonical(value: object) -> object:
    """A field's value in one form: floats as floats (0, 0.0 and -0.0 alike), mappings as pairs
    sorted by key (logit_bias), sequences as lists."""
    if isinstance(value, float):
        return value + 0.0
    if isinstance(value, dict):
        return sorted([_canonical(key), _canonical(item)] for key, item in value.items())
    if isinstance(value, tuple | list):
        return [_canonical(item) for item in value]
    return value


def cache_key(model_id: str, fingerprint: str, spec: JobSpec, scope: str = "") -> str | None:
    """The request's cache key, or None when it may not be cached (or the model is unknown)."""
    if not fingerprint or not is_cacheable(spec):
        return None
    return hashlib.sha256(canonical_request(model_id, fingerprint, spec, scope)).hexdigest()


def cache_client(url: str | None) -> redis.Redis | None:
    """A blocking client of a dedicated cache Redis (None when the cache shares the job store's).
    Short timeouts and no retries: the cache is an optimisation, never worth waiting on."""
    if url is None:
        return None
    return redis.Redis.from_url(url, decode_responses=True, socket_connect_timeout=0.5, socket_timeout=0.5)


def write_entry(client: redis.Redis, key: str, entry: CacheEntry, ttl_s: int) -> None:
    """Store a response in a dedicated cache Redis; a failure is logged, never raised (the job
    succeeded either way: the next identical request just misses)."""
    try:
        with client.pipeline(transaction=True) as pipe:
            pipe.hset(
                keys.cache_entry(key), mapping={"output": entry.output, "model_label": entry.model_label}
            )
            pipe.expire(keys.cache_entry(key), ttl_s)
            pipe.execute()
    except redis.exceptions.RedisError as exc:
        log.warning("cache_write_failed", extra=fields(error=type(exc).__name__))
