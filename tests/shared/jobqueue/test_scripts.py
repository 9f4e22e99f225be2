"""shared/jobqueue/scripts.py: every key a script touches is declared in its KEYS. Labels name the keys
Python builds from shared/keys.py; a call that lacks one the script needs is asked for it before
the script writes, and sent again with it; a script that would ask after a write fails instead.
Every script's table-driven tests run as a Redis user allowed only each call's KEYS
(tests/shared/jobqueue/script_keys.py): this module holds the list of where, and checks it is whole."""

from __future__ import annotations

import importlib
from collections.abc import Iterator

import pytest
import redis

from cli.redis_server import EmbeddedRedis
from shared import keys
from shared.jobqueue import scripts
from tests.shared.jobqueue.script_keys import KeyCheckedRedis, checked_client

SCRIPTS = sorted(p.stem for p in scripts.LUA_DIR.glob("*.lua") if p.stem != "common")

#: Where each script's table-driven tests run under the key check (their client is KeyCheckedRedis).
CHECKED_IN = {
    "batch_cancel": "tests.shared.test_batches",
    "batch_commit": "tests.shared.test_batches",
    "batch_create": "tests.shared.test_batches",
    "batch_feed": "tests.shared.test_batches",
    "batch_finalizing": "tests.shared.test_batches",
    "batch_finish": "tests.shared.test_batches",
    "batch_validated": "tests.shared.test_batches",
    "cancel": "tests.shared.jobqueue.test_job_scripts",
    "claim": "tests.shared.jobqueue.test_job_scripts",
    "file_add": "tests.shared.jobqueue.test_scripts",
    "file_forget": "tests.shared.jobqueue.test_scripts",
    "finish": "tests.shared.jobqueue.test_job_scripts",
    "hand_back": "tests.shared.jobqueue.test_job_scripts",
    "reap_deadline": "tests.shared.jobqueue.test_job_scripts",
    "reap_delivery": "tests.workers.webhooks.test_orphans",
    "reap_lease": "tests.shared.jobqueue.test_job_scripts",
    "reap_orphan": "tests.shared.jobqueue.test_job_scripts",
    "renew": "tests.shared.jobqueue.test_job_scripts",
    "submit": "tests.shared.jobqueue.test_job_scripts",
    "take": "tests.shared.jobqueue.test_take_script",
    "token_bucket": "tests.shared.jobqueue.test_scripts",
    "webhook_claim": "tests.workers.webhooks.test_delivery",
    "webhook_record": "tests.workers.webhooks.test_intake",
    "webhook_take": "tests.workers.webhooks.test_intake",
}


@pytest.fixture
def checked(redis_server: EmbeddedRedis) -> Iterator[KeyCheckedRedis]:
    yield from checked_client(redis_server.url)


def _eval(client: redis.Redis, body: str, keys_: list[str], args: list[object], labels: list[str]) -> object:
    call_keys, call_args = scripts.wire(keys_, args, labels)
    return client.eval(scripts.prelude() + body, len(call_keys), *call_keys, *call_args)


def test_every_script_has_its_tests_under_the_key_check() -> None:
    from tests.shared.jobqueue import script_keys, test_job_scripts

    assert sorted(CHECKED_IN) == SCRIPTS
    for name, module in CHECKED_IN.items():
        names = importlib.import_module(module).__dict__
        checked = (
            names.get("redis_client") is script_keys.redis_client
            or names.get("client") is test_job_scripts.client  # the store scripts' tests' client
            or names.get("checked_client") is checked_client
        )
        assert checked, (name, module)


def test_labels_name_the_keys_python_builds() -> None:
    assert scripts.key_of(scripts.label("job_key", "j1")) == keys.job("j1")
    assert scripts.key_of(scripts.label("owner_bytes_key", "key-a", 20000)) == keys.OWNER_BYTES.format(
        owner="key-a", day=20000
    )
    delivery = scripts.label("batch_webhook_delivery_key", "b1", "batch.completed")
    assert scripts.key_of(delivery) == keys.BATCH_WEBHOOK_DELIVERY.format(
        batch_id="b1", event="batch.completed"
    )
    assert scripts.key_of(scripts.label("queued_key", "")) == keys.queued("")
    assert scripts.key_of(scripts.label(scripts.RAW, "q\x06\x163")) == "q\x06\x163"
    for name, value in scripts.CONSTANTS.items():
        assert scripts.key_of(name) == value
    with pytest.raises(ValueError, match="line break or separator"):
        scripts.label("job_key", "a\nb")


def test_a_script_finds_the_keys_its_call_declared(redis_client: redis.Redis) -> None:
    body = "return {KEYS[1], ARGV[1], job_key('j1'), K.leases, queued_key(''), #KEYS, #ARGV}"
    reply = _eval(redis_client, body, ["own"], ["first"], [scripts.label("job_key", "j1"), "queued_key\x1f"])
    assert reply == ["own", "first", keys.job("j1"), keys.LEASES, keys.queued(""), 1, 1]


def test_a_key_not_declared_is_asked_for_before_any_write(checked: KeyCheckedRedis) -> None:
    body = "redis.call('GET', K.leases); return redis.call('SET', job_key(ARGV[1]), 'x')"
    with pytest.raises(redis.exceptions.ResponseError) as asked:
        _eval(checked, body, [], ["j.1 x"], [])
    assert scripts.needed(asked.value) == [scripts.label("job_key", "j.1 x")]
    assert checked.exists(keys.job("j.1 x")) == 0


def test_a_key_asked_for_after_a_write_is_a_bug_and_not_asked_again(checked: KeyCheckedRedis) -> None:
    body = "redis.call('SET', K.leases, 'x'); return redis.call('GET', job_key('j1'))"
    with pytest.raises(redis.exceptions.ResponseError, match="GENQBUG") as failed:
        _eval(checked, body, [], [], [])
    assert scripts.needed(failed.value) is None


def test_a_call_is_sent_again_with_the_keys_it_was_asked_for(checked: KeyCheckedRedis) -> None:
    """renew.lua, with none of its jobs' records declared: it asks for them, and the Script sends
    the call again with them, touching nothing undeclared either time."""
    checked.hset(keys.job("j1"), mapping={"status": "running", "worker": "w1"})
    lost = scripts.Script(checked, "renew")(args=["w1", "99.0", "j1", "j2"])
    assert lost == ["j2"] and checked.hget(keys.job("j1"), "lease") == "99.0"


def test_the_file_scripts_touch_only_their_keys(checked: KeyCheckedRedis) -> None:
    file_keys = [
        keys.file("f1"),
        keys.owner_files("key-a"),
        keys.owner_file_bytes("key-a"),
        keys.FILES_EXPIRING,
    ]
    add = checked.register_script(scripts.plain("file_add"))
    assert add(keys=file_keys, args=[10, 0, 1.0, 5.0, "id", "f1", "bytes", 10]) == 1
    assert checked.register_script(scripts.plain("file_forget"))(keys=file_keys, args=["f1"]) == 1
    assert checked.exists(*file_keys) == 0


def test_the_rate_limiters_bucket_touches_only_its_key(checked: KeyCheckedRedis) -> None:
    bucket = checked.register_script(scripts.plain("token_bucket"))
    assert bucket(keys=[keys.rate_limit("key-a", "submit")], args=[5, 1, 1])[0] == 1


def test_the_key_check_refuses_a_key_not_declared(checked: KeyCheckedRedis) -> None:
    """What the tests above rely on: Redis itself refuses a script's command on another key."""
    with pytest.raises(redis.exceptions.ResponseError, match="ACL"):
        checked.eval("return redis.call('GET', 'not-declared')", 1, "declared")


@pytest.mark.parametrize("name", SCRIPTS)
def test_every_script_compiles(redis_client: redis.Redis, name: str) -> None:
    assert redis_client.script_load(scripts.source(name))


def test_plain_is_the_file_alone_and_source_adds_the_prelude_it_uses() -> None:
    assert scripts.plain("claim") == (scripts.LUA_DIR / "claim.lua").read_text()
    claim = scripts.source("claim")
    assert claim.endswith(scripts.plain("claim"))
    # What claim.lua calls, and what those call in turn, is defined; what it never calls is not
    # (every definition is made again on each call: fewer is less of Redis's time per call).
    assert "local function claim_plan(" in claim and "local function push_webhook(" in claim
    assert "local function claim_and_look(" not in claim  # a webhook delivery's
    assert "local function claim_and_look(" in scripts.prelude()
    assert len(scripts.source("renew")) < len(claim) < len(scripts.prelude())
