"""Response-cache keys: which requests may be answered from the cache, and the key of one.

The key is the SHA-256 of a canonical encoding of everything that determines a generation's
output: the model id and fingerprint (a digest of its weights and chat template), the prompt or
the chat messages, and the sampling parameters. The API (lookups, coalescing) and the workers
(writing results) both compute it here, from the job's input as accepted (defaults filled in), so
they always agree. Nothing here imports FastAPI or torch.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import orjson
import redis
import redis.exceptions

from shared import keys
from shared.logging import fields
from shared.structured import schema_of

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


def is_cacheable(job_input: Mapping[str, Any]) -> bool:
    """Deterministic requests only (greedy, or sampled with a fixed seed), and not opted out."""
    if not job_input.get("cache", True):
        return False
    return float(job_input["temperature"]) == 0.0 or job_input.get("seed") is not None


def canonical_request(
    model_id: str, fingerprint: str, job_input: Mapping[str, Any], scope: str = ""
) -> bytes:
    """The bytes that are hashed: sorted keys, no whitespace, numbers in one form.

    `scope` (the owner, when the cache is per key) is part of the document, so one key's
    requests never find, or coalesce with, another's; unscoped keys are as they always were.

    Stop strings keep their order and repeats: an engine may apply them in order, so a different
    list is conservatively a different request. Text is hashed exactly as given (no trimming or
    Unicode normalisation: either can change the tokens, hence the output).
    """
    messages = job_input.get("messages")
    seed = job_input.get("seed")
    document = {
        "v": KEY_VERSION,
        "model": model_id,
        "fingerprint": fingerprint,
        "prompt": job_input.get("prompt"),
        "messages": None if messages is None else [[m["role"], m["content"]] for m in messages],
        "max_tokens": int(job_input["max_tokens"]),
        "temperature": _number(job_input["temperature"]),
        "top_p": _number(job_input["top_p"]),
        "seed": None if seed is None else int(seed),
        "stop": [str(stop) for stop in job_input.get("stop") or ()],
    }
    if scope:
        document["scope"] = scope
    return orjson.dumps(document | _generation_options(job_input), option=orjson.OPT_SORT_KEYS)


def _generation_options(job_input: Mapping[str, Any]) -> dict[str, Any]:
    """Fields added after KEY_VERSION 1, hashed only when they differ from their default: a request
    that leaves them alone keeps the key it always had, one that sets them gets another."""
    options: dict[str, Any] = {}
    if job_input.get("template", "chat") != "chat":
        options["template"] = job_input["template"]
    for name, default in _ADJUSTMENT_DEFAULTS.items():
        value = job_input.get(name, default)
        if value != default:
            options[name] = _number(value)
    bias = job_input.get("logit_bias") or {}
    if bias:
        options["logit_bias"] = sorted([int(token), _number(value)] for token, value in bias.items())
    if int(job_input.get("min_tokens", 0)):
        options["min_tokens"] = int(job_input["min_tokens"])
    for name in ("logprobs", "prompt_logprobs", "best_of"):  # they change the output
        if job_input.get(name) is not None:
            options[name] = int(job_input[name])
    if int(job_input.get("n", 1)) != 1:
        options["n"] = int(job_input["n"])
    schema = schema_of(job_input.get("response_format"))
    if schema is not None:  # what is enforced, not how it was named or described
        options["json_schema"] = orjson.loads(schema)
    return options


_ADJUSTMENT_DEFAULTS = {"presence_penalty": 0.0, "frequency_penalty": 0.0, "repetition_penalty": 1.0}


def cache_key(model_id: str, fingerprint: str, job_input: Mapping[str, Any], scope: str = "") -> str | None:
    """The request's cache key, or None when it may not be cached (or the model is unknown)."""
    if not fingerprint or not is_cacheable(job_input):
        return None
    return hashlib.sha256(canonical_request(model_id, fingerprint, job_input, scope)).hexdigest()


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


def _number(value: float) -> float:
    # 0, 0.0 and -0.0 are one temperature; a float always encodes the same way in JSON.
    return float(value) + 0.0
