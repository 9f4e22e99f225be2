"""shared/scripts.py: the Lua prelude built from shared/keys.py, run on a real Redis, builds the
same key names as Python does, so no script spells a key of its own; every script loads."""

from __future__ import annotations

import pytest
import redis

from shared import keys, scripts

SCRIPTS = sorted(p.stem for p in scripts.LUA_DIR.glob("*.lua") if p.stem != "common")


def _eval(client: redis.Redis, body: str) -> str:
    return str(client.eval(scripts.prelude() + body, 0))


def test_key_builders_in_lua_match_python(redis_client: redis.Redis) -> None:
    assert _eval(redis_client, "return job_key('j1')") == keys.job("j1")
    assert _eval(redis_client, "return owner_bytes_key('key-a', 20000)") == keys.OWNER_BYTES.format(
        owner="key-a", day=20000
    )
    assert _eval(redis_client, "return batch_webhook_delivery_key('b1', 'completed')") == (
        keys.BATCH_WEBHOOK_DELIVERY.format(batch_id="b1", event="completed")
    )


def test_constants_in_lua_match_python(redis_client: redis.Redis) -> None:
    for name, value in scripts.CONSTANTS.items():
        assert _eval(redis_client, f"return K.{name}") == value, name
    assert _eval(redis_client, "return tostring(UNACKED_STALE_S)") == str(scripts.UNACKED_STALE_S)


def test_key_function_escapes_quotes_and_backslashes(redis_client: redis.Redis) -> None:
    lua = scripts.key_function("odd", "it's\\{name}'")
    assert str(redis_client.eval(lua + "return odd('x')", 0)) == "it's\\x'"


@pytest.mark.parametrize("name", SCRIPTS)
def test_every_script_compiles(redis_client: redis.Redis, name: str) -> None:
    text = scripts.plain(name) if name == "token_bucket" else scripts.source(name)
    assert redis_client.script_load(text)


def test_plain_is_the_file_alone_and_source_adds_the_prelude() -> None:
    assert scripts.plain("claim") == (scripts.LUA_DIR / "claim.lua").read_text()
    assert scripts.source("claim") == scripts.prelude() + scripts.plain("claim")
